"""Shared pieces of the evaluation callbacks (SafeThink, WET, the alignment-faking harness, ...).

* :class:`StageCallback` -- one method per kind of loop event (``stage_start``, ``stage_batch_end``,
  ``stage_epoch_end``, ...) called with the stage name (``validate``, ``test``, ``predict``), instead of three
  copies of each Lightning hook;
* :func:`require_generating_module` -- the check a callback runs in ``setup``: the module has the generation
  protocol (and a decoder when asked);
* :func:`summed_over_ranks`, :func:`ratios`, :func:`log_stage_metrics` -- counters summed over processes, rates from
  counters, metrics logged from an epoch-end hook of any stage;
* :class:`EvaluationCallback` -- a :class:`StageCallback` for measurements: ``eval_start`` / ``eval_batch`` /
  ``eval_end`` called only for the configured stages, never during the sanity check, and (with ``max_batches``) for
  the first batches of an epoch only;
* :func:`append_jsonl` -- per-row records written the same way by every callback (rank zero to the file, other ranks
  to ``<stem>.rank<r><suffix>``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_only

from zoo.errors import ConfigError
from zoo.protocols import missing_generation_protocol

STAGES = ("validate", "test", "predict")


class StageCallback(pl.Callback):
    """A callback whose loop hooks are written once for every stage.

    Override any of :meth:`stage_start`, :meth:`stage_end`, :meth:`stage_epoch_start`, :meth:`stage_batch_end`,
    :meth:`stage_epoch_end`; each receives ``stage`` in ``validate`` (also validation during fit), ``test``,
    ``predict``. Sanity-check validation is passed through as well (``trainer.sanity_checking``).
    """

    def stage_start(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        """A validation/test/predict loop starts."""

    def stage_end(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        """A validation/test/predict loop ended."""

    def stage_epoch_start(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        """A validation/test/predict epoch starts."""

    def stage_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        """A validation/test/predict batch was evaluated (``outputs``: the step's return value)."""

    def stage_epoch_end(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        """A validation/test/predict epoch ended."""

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_start(trainer, pl_module, "validate")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_start(trainer, pl_module, "test")

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_start(trainer, pl_module, "predict")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_end(trainer, pl_module, "validate")

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_end(trainer, pl_module, "test")

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_end(trainer, pl_module, "predict")

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_epoch_start(trainer, pl_module, "validate")

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_epoch_start(trainer, pl_module, "test")

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_epoch_start(trainer, pl_module, "predict")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.stage_batch_end(trainer, pl_module, outputs, batch, batch_idx, "validate")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.stage_batch_end(trainer, pl_module, outputs, batch, batch_idx, "test")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.stage_batch_end(trainer, pl_module, outputs, batch, batch_idx, "predict")

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_epoch_end(trainer, pl_module, "validate")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_epoch_end(trainer, pl_module, "test")

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stage_epoch_end(trainer, pl_module, "predict")


def require_generating_module(pl_module: Any, who: str, needs_decoder: bool = False) -> None:
    """Raise a :class:`~zoo.errors.ConfigError` naming what ``pl_module`` lacks of the generation protocol
    (``tokenizer``, ``model``, ``generate()``; a ``model`` attribute still ``None`` that ``configure_model`` builds
    counts as present)
    and, with ``needs_decoder``, of a zoo decoder (``decoder.hooks``, the decoder seam)."""
    # ``model`` may still be None in setup: zoo modules build it in configure_model, which runs after setup.
    missing = [
        name
        for name in missing_generation_protocol(pl_module)
        if not (
            name == "model" and hasattr(pl_module, "model") and callable(getattr(pl_module, "configure_model", None))
        )
    ]
    if needs_decoder and not isinstance(getattr(getattr(pl_module, "decoder", None), "hooks", None), list):
        missing.append("decoder.hooks")
    if missing:
        need = "a generating module (zoo.protocols.SupportsGenerate)"
        if needs_decoder:
            need += " whose decoding goes through a zoo decoder (the decoder seam, module/decoder=...)"
        raise ConfigError(f"{who} needs {need}; {type(pl_module).__name__} lacks {', '.join(missing)}")


def ratios(counters: Mapping[str, float], spec: Mapping[str, tuple[str, str]]) -> dict[str, float]:
    """``{name: counters[num] / counters[den]}`` for every ``name: (num, den)`` of ``spec`` whose denominator is not
    zero (a rate without data is left out rather than reported as 0 or nan)."""
    return {name: float(counters[num] / counters[den]) for name, (num, den) in spec.items() if counters[den]}


def summed_over_ranks(trainer: pl.Trainer, counters: Mapping[str, float]) -> dict[str, float]:
    """``counters`` summed over the processes of a distributed run (unchanged in a single process)."""
    names = list(counters)
    values = torch.tensor([float(counters[k]) for k in names], dtype=torch.float64)
    if trainer.world_size > 1:
        values = trainer.strategy.reduce(values.to(trainer.strategy.root_device), reduce_op="sum").cpu()
    return dict(zip(names, values.tolist()))


def log_stage_metrics(
    trainer: pl.Trainer, pl_module: pl.LightningModule, metrics: Mapping[str, float], prefix: str, stage: str
) -> None:
    """Log ``<prefix>/<name>`` metrics from an epoch-end hook: through ``pl_module.log`` in validate/test, straight
    to the trainer's loggers in predict (where ``LightningModule.log`` is not allowed; they are also added to
    ``trainer.callback_metrics``, so a predict run reports them like any other stage); rank zero only."""
    if stage == "predict":
        named = {f"{prefix}/{k}": float(v) for k, v in metrics.items()}
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in named.items()})
        _to_loggers(trainer, named)
    else:
        for name, value in metrics.items():
            pl_module.log(f"{prefix}/{name}", value, rank_zero_only=True)


@rank_zero_only
def _to_loggers(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)


def append_jsonl(path: Path, records: Iterable[dict[str, Any]], rank: int = 0) -> Path:
    """Append one JSON line per record to ``path`` (``<stem>.rank<r><suffix>`` on rank ``r > 0``); returns the file."""
    if rank:
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")
    return path


class EvaluationCallback(StageCallback):
    """Base of the evaluation measurements (not a callback by itself).

    Args:
        stages: the stages it acts in, a non-empty subset of ``allowed`` (``validate`` also covers validation
            during fit).
        max_batches: act on at most this many batches per epoch (``None``: all).
        allowed: the stages the measurement supports.
    """

    def __init__(self, stages: Sequence[str], max_batches: int | None = None, allowed: Sequence[str] = STAGES) -> None:
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

    # -- the stage hooks, filtered ----------------------------------------------------------------------------
    def _on(self, trainer: pl.Trainer, stage: str) -> bool:
        return stage in self.stages and not trainer.sanity_checking

    def stage_epoch_start(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if self._on(trainer, stage):
            self.eval_start(trainer, pl_module, stage)

    def stage_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        if self._on(trainer, stage) and (self.max_batches is None or batch_idx < self.max_batches):
            self.eval_batch(trainer, pl_module, outputs, batch, batch_idx, stage)

    def stage_epoch_end(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if self._on(trainer, stage):
            self.eval_end(trainer, pl_module, stage)
