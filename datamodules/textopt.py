"""Minibatches of example indices for textual optimizers (no tokenizer, no data files: the problem holds the data)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from zoo.data.samplers import TrainSampler
from zoo.datamodules.episodes import EpisodeDataModule, collate_indices
from zoo.errors import ConfigError


class TextOptDataModule(EpisodeDataModule):
    """``steps`` training minibatches of ``batch_size`` example indices (step ``s`` gets ``s*B .. s*B+B-1``), and one
    validation batch (the module evaluates the problem's whole test set on it).

    Args:
        steps: optimization steps (one epoch).
        batch_size: examples per step.
        tokenizer: unused (``train.py`` passes the composed backbone's; the model's calls tokenize their own text).
    """

    def __init__(
        self, steps: int = 10, batch_size: int = 4, sampler: TrainSampler | None = None, tokenizer: Any = None
    ) -> None:
        if steps < 1 or batch_size < 1:
            raise ConfigError(f"datamodule.steps ({steps}) and datamodule.batch_size ({batch_size}) must be >= 1")
        super().__init__(episodes=steps * batch_size, batch_size=batch_size, sampler=sampler)
        self.steps = steps

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=1, shuffle=False, collate_fn=collate_indices)
