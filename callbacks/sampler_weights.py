"""Log what the training sampler reports (e.g. the per-domain weights in force) every training step.

The datamodule's sampler (``trainer.datamodule.sampler``, the ``datamodule/sampler=`` seam,
:mod:`zoo.data.samplers`) exposes ``metrics() -> dict[str, float]``; this callback logs each value as
``train/sampler/<name>``, e.g. ``train/sampler/weight/addition`` for :class:`~zoo.data.samplers.WeightedDomainSampler`.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from zoo.errors import ConfigError


class LogSamplerWeights(Callback):
    """Log ``trainer.datamodule.sampler.metrics()`` under ``train/sampler/`` after every training batch.

    Needs a datamodule with a ``sampler`` that has ``metrics()`` (every zoo ``RowDataModule``).
    """

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        sampler = getattr(trainer.datamodule, "sampler", None)
        if stage == "fit" and not callable(getattr(sampler, "metrics", None)):
            raise ConfigError(
                "LogSamplerWeights needs a datamodule whose `sampler` has metrics() (a zoo RowDataModule, "
                f"datamodule/sampler=...); got datamodule {type(trainer.datamodule).__name__}"
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        for name, value in trainer.datamodule.sampler.metrics().items():
            pl_module.log(f"train/sampler/{name}", float(value), batch_size=1)
