"""Training wall-clock (validation excluded) and tokens generated for training, logged at every validation."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn


def rollout_tokens(pl_module: pl.LightningModule) -> int:
    """Tokens the module generated for its last training step (``last_rollout`` of the GRPO family; 0 for others)."""
    rollout = getattr(pl_module, "last_rollout", None) or {}
    if "tokens_generated" in rollout:
        return int(rollout["tokens_generated"])
    result = rollout.get("result")
    return int(result.lengths.sum()) if result is not None else 0


class TrainingClock(Callback):
    """Logs ``clock/train_seconds`` (wall-clock of the training loop so far, validation excluded) and
    ``clock/tokens_generated`` (tokens sampled for training so far, e.g. online RL rollouts) at every validation, so
    that "wall-clock to reach a metric" can be read from the logs of any run.

    :attr:`history` keeps ``(global_step, seconds, tokens, {metric: value})`` of every validation, with the values
    of ``metrics`` (names of logged metrics, e.g. ``val/multi@3``) after that validation. The totals are saved in
    checkpoints (a resumed run continues them).

    Args:
        metrics: logged metrics recorded in :attr:`history`.
    """

    def __init__(self, metrics: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.metrics = tuple(metrics)
        self.seconds = 0.0
        self.tokens = 0
        self.history: list[tuple[int, float, int, dict[str, float]]] = []
        self._start: float | None = None

    @property
    def state_key(self) -> str:
        return "TrainingClock"

    def _pause(self) -> None:
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.tokens += rollout_tokens(pl_module)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        pl_module.log("clock/train_seconds", float(self.seconds))
        pl_module.log("clock/tokens_generated", float(self.tokens))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        values = {m: float(trainer.callback_metrics[m]) for m in self.metrics if m in trainer.callback_metrics}
        self.history.append((trainer.global_step, self.seconds, self.tokens, values))
        self._start = time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()

    def state_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "tokens": self.tokens}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seconds = float(state_dict.get("seconds", 0.0))
        self.tokens = int(state_dict.get("tokens", 0))


__all__ = ["TrainingClock", "rollout_tokens"]
