"""``BatchEvaluation``: the base of callbacks that evaluate a module's batches in validate/test/predict.

Such a callback does something with every evaluated batch (at most ``max_batches`` per epoch, never during the
sanity check), adds to named counters, and at the end of the epoch turns the counters -- summed over ranks -- into
rates. They are logged under ``<log_prefix>/`` with ``pl_module.log`` after validation/test, written to the loggers
after predict (where ``self.log`` is not allowed), and kept in :attr:`BatchEvaluation.last_metrics`.

A subclass implements :meth:`BatchEvaluation.evaluate` (one batch; adds to :attr:`BatchEvaluation.counts`) and
:meth:`BatchEvaluation.compute_metrics` (counters -> rates), and may override :meth:`BatchEvaluation.epoch_metrics`
(e.g. to add metrics that are not counter ratios).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_only

from zoo.errors import ConfigError

STAGES = ("validate", "test", "predict")


class BatchEvaluation(pl.Callback):
    """Per-batch evaluation with epoch counters (see the module docstring).

    Args:
        counters: names of the counters (float sums).
        rows_counter: the counter of evaluated rows; an epoch without rows logs nothing.
        stages: among ``validate`` (also validation during fit), ``test``, ``predict``.
        max_batches: batches evaluated per epoch (``None``: all).
        log_prefix: metric name prefix.
    """

    def __init__(
        self,
        counters: Sequence[str],
        rows_counter: str,
        stages: Sequence[str] = STAGES,
        max_batches: int | None = None,
        log_prefix: str = "eval",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not stages:
            raise ConfigError(f"{name}: stages must be a non-empty subset of {STAGES}, got {list(stages)}")
        if max_batches is not None and max_batches < 1:
            raise ConfigError(f"{name}: max_batches must be >= 1 or null, got {max_batches}")
        self.counter_names = tuple(counters)
        if rows_counter not in self.counter_names:
            raise ValueError(f"rows_counter {rows_counter!r} is not among the counters")
        self.rows_counter = rows_counter
        self.stages = tuple(stages)
        self.max_batches = max_batches
        self.log_prefix = log_prefix
        self.counts = dict.fromkeys(self.counter_names, 0.0)
        self.last_metrics: dict[str, float] = {}

    # -- what a subclass provides -----------------------------------------------------------------------------
    def evaluate(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        """Evaluate one batch (its step ``outputs``) and add to :attr:`counts`."""
        raise NotImplementedError

    def compute_metrics(self, counters: Mapping[str, float]) -> dict[str, float]:
        """Rates from the epoch's summed counters."""
        raise NotImplementedError

    def epoch_metrics(self, trainer: pl.Trainer, counters: Mapping[str, float]) -> dict[str, float]:
        """The metrics of an epoch (default :meth:`compute_metrics`; a subclass may add more or write files)."""
        return self.compute_metrics(counters)

    # -- per batch --------------------------------------------------------------------------------------------
    def active(self, trainer: pl.Trainer, stage: str, batch_idx: int) -> bool:
        """Whether batch ``batch_idx`` of ``stage`` is evaluated."""
        if stage not in self.stages or trainer.sanity_checking:
            return False
        return self.max_batches is None or batch_idx < self.max_batches

    def _batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str):
        if self.active(trainer, stage, batch_idx):
            self.evaluate(trainer, pl_module, outputs, batch, batch_idx, stage)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch_end(trainer, pl_module, outputs, batch, batch_idx, "validate")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch_end(trainer, pl_module, outputs, batch, batch_idx, "test")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch_end(trainer, pl_module, outputs, batch, batch_idx, "predict")

    # -- per epoch --------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Zero the epoch's counters."""
        self.counts = dict.fromkeys(self.counter_names, 0.0)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.reset()

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.reset()

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.reset()

    def reduced(self, trainer: pl.Trainer) -> dict[str, float]:
        """The epoch's counters summed over ranks."""
        values = torch.tensor([self.counts[k] for k in self.counter_names], dtype=torch.float64)
        if trainer.world_size > 1:
            values = trainer.strategy.reduce(values.to(trainer.strategy.root_device), reduce_op="sum").cpu()
        return dict(zip(self.counter_names, values.tolist()))

    def _epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage not in self.stages or trainer.sanity_checking:
            return
        counters = self.reduced(trainer)
        if not counters[self.rows_counter]:
            return
        self.last_metrics = self.epoch_metrics(trainer, counters)
        if stage == "predict":
            self._log_to_loggers(trainer)
        else:
            for name, value in self.last_metrics.items():
                pl_module.log(f"{self.log_prefix}/{name}", value, rank_zero_only=True)

    @rank_zero_only
    def _log_to_loggers(self, trainer: pl.Trainer) -> None:
        metrics = {f"{self.log_prefix}/{k}": v for k, v in self.last_metrics.items()}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end(trainer, pl_module, "validate")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end(trainer, pl_module, "test")

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end(trainer, pl_module, "predict")


__all__ = ["STAGES", "BatchEvaluation"]
