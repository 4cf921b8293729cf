"""Progress display: a Rich bar in a terminal, plain periodic log lines otherwise (files, SLURM logs)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger("zoo")


class LogLineProgress(ProgressBar):
    """Writes one log line every ``log_every_n_steps`` training steps (or predict batches) and after every
    validation.

    It subclasses Lightning's ``ProgressBar`` so that the Trainer does not add its own bar as well.
    """

    def __init__(self, log_every_n_steps: int = 50) -> None:
        super().__init__()
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1, got {log_every_n_steps}")
        self.log_every_n_steps = log_every_n_steps
        self._enabled = True
        self._start = time.monotonic()

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _metrics_text(self, trainer: pl.Trainer) -> str:
        items = []
        for key, value in sorted(trainer.progress_bar_metrics.items()):
            items.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
        return " ".join(items)

    @rank_zero_only
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.monotonic()
        total = trainer.estimated_stepping_batches
        log.info("training: %s optimizer steps planned", total)

    @rank_zero_only
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self._enabled and step % self.log_every_n_steps == 0 and step > 0:
            total = trainer.estimated_stepping_batches
            elapsed = time.monotonic() - self._start
            log.info(
                "step %d/%s epoch %d (%.0fs) %s",
                step,
                total,
                trainer.current_epoch,
                elapsed,
                self._metrics_text(trainer),
            )

    @rank_zero_only
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.monotonic()
        log.info("predict: %s batches", sum(trainer.num_predict_batches))

    @rank_zero_only
    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        total = trainer.num_predict_batches[dataloader_idx]
        if self._enabled and ((batch_idx + 1) % self.log_every_n_steps == 0 or batch_idx + 1 == total):
            log.info("predict: batch %d/%s (%.0fs)", batch_idx + 1, total, time.monotonic() - self._start)

    @rank_zero_only
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._enabled and not trainer.sanity_checking:
            log.info("validation at step %d: %s", trainer.global_step, self._metrics_text(trainer))


def auto_progress(log_every_n_steps: int = 50, refresh_rate: int = 1) -> ProgressBar:
    """A ``RichProgressBar`` when stdout is a terminal, else :class:`LogLineProgress`."""
    if sys.stdout.isatty():
        return RichProgressBar(refresh_rate=refresh_rate)
    return LogLineProgress(log_every_n_steps=log_every_n_steps)


__all__ = ["LogLineProgress", "auto_progress"]
