"""Shared plumbing of callbacks that measure something on evaluation batches.

:class:`EvaluationCallback` maps Lightning's validation/test/predict hooks onto three methods a measurement overrides
-- :meth:`~EvaluationCallback.eval_start`, :meth:`~EvaluationCallback.eval_batch`,
:meth:`~EvaluationCallback.eval_end` -- called only for the configured stages, never during the sanity check, and
(with ``max_batches``) for the first batches of an epoch only. :func:`append_jsonl` writes per-row records the same
way for every callback (rank zero to the file, other ranks to ``<stem>.rank<r><suffix>``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from zoo.errors import ConfigError

EVAL_STAGES = ("validate", "test", "predict")


def append_jsonl(path: Path, records: Iterable[dict[str, Any]], rank: int = 0) -> Path:
    """Append one JSON line per record to ``path`` (``<stem>.rank<r><suffix>`` on rank ``r > 0``); returns the file."""
    if rank:
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")
    return path


class EvaluationCallback(pl.Callback):
    """Base of the evaluation measurements (not a callback by itself).

    Args:
        stages: the stages it acts in, a non-empty subset of ``allowed`` (``validate`` also covers validation
            during fit).
        max_batches: act on at most this many batches per epoch (``None``: all).
        allowed: the stages the measurement supports.
    """

    def __init__(
        self, stages: Sequence[str], max_batches: int | None = None, allowed: Sequence[str] = EVAL_STAGES
    ) -> None:
        super().__init__()
        name = type(self).__name__
        unknown = [s for s in stages if s not in allowed]
        if unknown or not stages:
            raise ConfigError(f"{name}: stages must be a non-empty subset of {tuple(allowed)}, got {list(stages)}")
        if max_batches is not None and max_batches < 1:
            raise ConfigError(f"{name}: max_batches must be >= 1 or None, got {max_batches}")
        self.stages = tuple(stages)
        self.max_batches = max_batches

    # -- what a measurement overrides -------------------------------------------------------------------------
    def eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """An evaluation epoch of ``stage`` starts (reset per-epoch state)."""

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        """One evaluated batch (``outputs``: what the module's step returned)."""

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The epoch of ``stage`` ends (compute, log, write)."""

    # -- Lightning hooks --------------------------------------------------------------------------------------
    def _on(self, trainer: pl.Trainer, stage: str) -> bool:
        return stage in self.stages and not trainer.sanity_checking

    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._on(trainer, stage):
            self.eval_start(trainer, pl_module, stage)

    def _batch(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str):
        if self._on(trainer, stage) and (self.max_batches is None or batch_idx < self.max_batches):
            self.eval_batch(trainer, pl_module, outputs, batch, batch_idx, stage)

    def _end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._on(trainer, stage):
            self.eval_end(trainer, pl_module, stage)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer, pl_module, "validate")

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer, pl_module, "test")

    def on_predict_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer, pl_module, "predict")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch(trainer, pl_module, outputs, batch, batch_idx, "validate")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch(trainer, pl_module, outputs, batch, batch_idx, "test")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch(trainer, pl_module, outputs, batch, batch_idx, "predict")

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._end(trainer, pl_module, "validate")

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._end(trainer, pl_module, "test")

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        self._end(trainer, pl_module, "predict")


__all__ = ["EVAL_STAGES", "EvaluationCallback", "append_jsonl"]
