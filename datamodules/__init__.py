"""Installed as ``zoo.datamodules``; the folder sits at the top level of the repository by design."""

if __name__ != "zoo.datamodules":
    raise ImportError(
        "The 'datamodules' folder of paperzoo is installed as 'zoo.datamodules'. Use 'import zoo.datamodules' "
        "(after 'pip install -e .' in the repository root)."
    )

from zoo.datamodules.base import RowDataModule
from zoo.datamodules.episodes import EpisodeDataModule
from zoo.datamodules.mixture import CorpusDataModule, MixtureDataModule
from zoo.datamodules.multiturn import MultiTurnPromptDataModule, MultiTurnSFTDataModule
from zoo.datamodules.preferences import PreferenceDataModule
from zoo.datamodules.prompts import PromptDataModule
from zoo.datamodules.sft import SFTDataModule
from zoo.datamodules.structures import StructureDataModule
from zoo.datamodules.textopt import TextOptDataModule

__all__ = [
    "CorpusDataModule",
    "EpisodeDataModule",
    "MixtureDataModule",
    "MultiTurnPromptDataModule",
    "MultiTurnSFTDataModule",
    "PreferenceDataModule",
    "PromptDataModule",
    "RowDataModule",
    "SFTDataModule",
    "StructureDataModule",
    "TextOptDataModule",
]
