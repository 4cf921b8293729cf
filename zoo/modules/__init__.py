"""Family LightningModules: methods are configs over these plus a core."""

from zoo.modules.base import ZooBaseModule, ZooModule
from zoo.modules.causal_lm import CausalLMModule, exact_answer_match
from zoo.modules.episodes import EpisodeModule
from zoo.modules.generating import GeneratingModule
from zoo.modules.grpo import GRPOModule
from zoo.modules.memevolve import MemEvolveModule
from zoo.modules.multiturn import MultiTurnRollout, MultiTurnRolloutModule
from zoo.modules.preference import PreferenceModule
from zoo.modules.sequence_classifier import SequenceClassifierModule
from zoo.modules.structure_lm import StructureLMModule
from zoo.modules.test_time import TestTimeAdaptationModule
from zoo.modules.textopt import TextOptModule
from zoo.modules.valr import VaLRModule
from zoo.modules.vocab_extend import VocabExtendModule

__all__ = [
    "CausalLMModule",
    "EpisodeModule",
    "GRPOModule",
    "GeneratingModule",
    "MemEvolveModule",
    "MultiTurnRollout",
    "MultiTurnRolloutModule",
    "PreferenceModule",
    "SequenceClassifierModule",
    "StructureLMModule",
    "TestTimeAdaptationModule",
    "TextOptModule",
    "VaLRModule",
    "VocabExtendModule",
    "ZooBaseModule",
    "ZooModule",
    "exact_answer_match",
]
