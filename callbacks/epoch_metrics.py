"""Shared helpers of the evaluation callbacks: counters summed over ranks, metrics logged for any stage."""

from __future__ import annotations

from collections.abc import Mapping

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_only


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
    to the trainer's loggers in predict (where ``LightningModule.log`` is not allowed); rank zero only."""
    if stage == "predict":
        _to_loggers(trainer, {f"{prefix}/{k}": v for k, v in metrics.items()})
    else:
        for name, value in metrics.items():
            pl_module.log(f"{prefix}/{name}", value, rank_zero_only=True)


@rank_zero_only
def _to_loggers(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
