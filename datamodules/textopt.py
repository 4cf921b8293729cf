"""Minibatches of example indices for textual optimizers (no tokenizer, no data files: the problem holds the data)."""

from __future__ import annotations

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from zoo.data.samplers import ResumableSampler, TrainSampler
from zoo.errors import ConfigError


def _as_list(batch: list[int]) -> list[int]:
    return list(batch)


class TextOptDataModule(pl.LightningDataModule):
    """``steps`` training minibatches of ``batch_size`` example indices (step ``s`` gets ``s*B .. s*B+B-1``), and one
    validation batch (the module evaluates the problem's whole test set on it).

    Args:
        steps: optimization steps (one epoch).
        batch_size: examples per step.
    """

    def __init__(self, steps: int = 10, batch_size: int = 4, sampler: TrainSampler | None = None) -> None:
        super().__init__()
        if steps < 1 or batch_size < 1:
            raise ConfigError(f"datamodule.steps ({steps}) and datamodule.batch_size ({batch_size}) must be >= 1")
        if sampler is not None and not isinstance(sampler, ResumableSampler):
            raise ConfigError(
                f"datamodule/sampler={type(sampler).__name__}: textual optimization steps are not sampled; keep the "
                "default sampler"
            )
        self.steps = steps
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        indices = list(range(self.steps * self.batch_size))
        return DataLoader(indices, batch_size=self.batch_size, shuffle=False, collate_fn=_as_list)

    def val_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=1, shuffle=False, collate_fn=_as_list)
