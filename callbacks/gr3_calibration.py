"""GR3 advantage-aware alpha calibration as a callback (arXiv 2603.10535; constraint GR3-4/5 in ``zoo.rl.gr3``).

A maximum-reward response of average length must keep its shaped reward ``r_max / (1 + alpha)`` at or above
the shaped group mean; alpha is the largest grid value meeting this in ``target_fraction`` of the groups seen
in a sliding window of recent rollouts. The callback logs the satisfaction rate of the current alpha every
step and, with ``adapt=True``, sets the shaper's alpha to the calibrated value every ``every_n_steps``.

Needs a module exposing ``shaper`` (with a float ``alpha`` and ``base_rewards``) and ``last_rollout`` with
``rewards`` and ``lengths`` ``[num_groups, G]`` (the zoo's ``GRPOModule``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from zoo.rl.gr3 import calibrate_alpha, satisfaction_rate


class GR3AlphaCalibration(Callback):
    """Calibrate (and optionally adapt) GR3's alpha from recent rollout groups.

    Args:
        alpha_grid: candidate alphas (QGLAS sweeps up to 0.6).
        target_fraction: fraction of groups that must satisfy the constraint (QGLAS: 0.999).
        window: number of recent training steps whose groups are pooled.
        adapt: write the calibrated alpha into the module's shaper (otherwise only log).
        every_n_steps: how often to recalibrate.
    """

    def __init__(
        self,
        alpha_grid: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
        target_fraction: float = 0.999,
        window: int = 32,
        adapt: bool = False,
        every_n_steps: int = 10,
    ) -> None:
        super().__init__()
        if not 0.0 < target_fraction <= 1.0:
            raise ValueError(f"target_fraction must be in (0, 1], got {target_fraction}")
        if window < 1 or every_n_steps < 1:
            raise ValueError("window and every_n_steps must be >= 1")
        if not alpha_grid or min(alpha_grid) < 0:
            raise ValueError(f"alpha_grid must be non-empty and >= 0, got {alpha_grid}")
        self.alpha_grid = tuple(float(a) for a in alpha_grid)
        self.target_fraction = float(target_fraction)
        self.window = window
        self.adapt = adapt
        self.every_n_steps = every_n_steps
        self.buffer: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.history: list[dict[str, float]] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(target_fraction=self.target_fraction, adapt=self.adapt)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        shaper = getattr(pl_module, "shaper", None)
        missing = []
        if shaper is None or not isinstance(getattr(shaper, "alpha", None), float):
            missing.append("a `shaper` with a float `alpha` (module/grpo/shaper=gr3)")
        if not hasattr(pl_module, "last_rollout"):
            missing.append("`last_rollout` (rollout rewards and lengths)")
        if missing:
            raise ValueError(
                f"GR3AlphaCalibration needs a GRPO-family module with {' and '.join(missing)}; "
                f"got {type(pl_module).__name__}"
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rollout = pl_module.last_rollout
        if not rollout:
            return
        base = pl_module.shaper.base_rewards(rollout["rewards"].detach().cpu().float())
        self.buffer.append((base, rollout["lengths"].detach().cpu().float()))
        self.buffer = self.buffer[-self.window :]
        rewards = torch.cat([b[0] for b in self.buffer])
        lengths = torch.cat([b[1] for b in self.buffer])
        current = float(pl_module.shaper.alpha)
        pl_module.log("train/gr3_satisfaction", satisfaction_rate(rewards, lengths, current), batch_size=1)
        if trainer.global_step % self.every_n_steps == 0:
            result = calibrate_alpha(rewards, lengths, self.alpha_grid, self.target_fraction)
            pl_module.log("train/gr3_calibrated_alpha", result.alpha, batch_size=1)
            self.history.append({"step": float(trainer.global_step), "alpha": result.alpha, "current": current})
            if self.adapt:
                pl_module.shaper.alpha = float(result.alpha)

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.buffer = list(state_dict.get("buffer", []))
        self.history = list(state_dict.get("history", []))
