"""Episode indices for the episode runner (agents, environments) and the test-time adaptation family (conversation
indices): no data files."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from zoo.data.samplers import ResumableSampler, TrainSampler
from zoo.errors import ConfigError


def collate_indices(batch: list[int]) -> list[int]:
    """Collate of index datasets: a batch stays a plain list of ints (not a tensor)."""
    return list(batch)


class EpisodeDataModule(pl.LightningDataModule):
    """Yields episode indices ``0 .. episodes-1`` in batches for ``test``/``predict``.

    Args:
        episodes: number of episodes (UltraHorizon recommends 32 repeats per setting).
        batch_size: episodes per ``test_step``/``predict_step``.
        tokenizer: not used (the indices need none); accepted so that runs with a language backbone (test-time
            adaptation: each index is a conversation) build it like any datamodule.
    """

    def __init__(
        self, episodes: int = 8, batch_size: int = 1, sampler: TrainSampler | None = None, tokenizer: Any = None
    ) -> None:
        super().__init__()
        if episodes < 1 or batch_size < 1:
            raise ConfigError(f"datamodule.episodes ({episodes}) and datamodule.batch_size ({batch_size}) must be >= 1")
        if sampler is not None and not isinstance(sampler, ResumableSampler):
            # the training-row samplers (datamodule/sampler=...) have no meaning for episodes, which are indices
            raise ConfigError(
                f"datamodule/sampler={type(sampler).__name__}: episode runs are not sampled; keep the default sampler"
            )
        self.episodes = episodes
        self.batch_size = batch_size

    def _loader(self) -> DataLoader:
        return DataLoader(
            list(range(self.episodes)), batch_size=self.batch_size, shuffle=False, collate_fn=collate_indices
        )

    def test_dataloader(self) -> DataLoader:
        return self._loader()

    def predict_dataloader(self) -> DataLoader:
        return self._loader()
