"""GR3 advantage-aware alpha calibration as a callback (arXiv 2603.10535; constraint GR3-4/5 in ``zoo.rl.gr3``).

A maximum-reward response of average length must keep its shaped reward ``r_max / (1 + alpha)`` at or above
the shaped group mean; alpha is the largest grid value meeting this in ``target_fraction`` of the groups seen
in a sliding window of recent rollouts (under data parallelism, the groups of every rank: each rank calibrates the
same alpha). The shaper owns alpha (``GR3Shaper.set_alpha``) and the module checkpoints it with the shaper's state,
so a resumed run continues with the calibrated value; this callback's own state is its window and history. The
callback logs the satisfaction rate of the current alpha every step and, with ``adapt=True``, sets the shaper's alpha
to the calibrated value every ``every_n_steps``.

Groups whose rewards are all equal carry no GRPO advantage (every advantage is 0 whatever alpha is), so by
default they are left out of the rates (``exclude_constant_groups``). Counting them switches GR3 off under
binary rewards: an all-correct group with unequal lengths violates the constraint for every ``alpha > 0``
(Jensen), so a 99.9% target over many groups calibrates alpha to 0. A calibrated alpha of 0 is logged as a
warning; a window without any informative group leaves alpha unchanged.

Needs a module exposing ``shaper`` (with a float ``alpha`` and ``base_rewards``) and ``last_rollout`` with
``rewards`` and ``lengths`` ``[num_groups, G]`` of the step's generated groups (the zoo's ``GRPOModule``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from zoo.errors import ConfigError
from zoo.rl.advantages import constant_groups
from zoo.rl.gr3 import calibrate_alpha, satisfaction_rate

log = logging.getLogger(__name__)


def gather_groups(
    pl_module: pl.LightningModule, rewards: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[num_groups, G]`` rewards and lengths of every rank's step, rank by rank (under data parallelism; the
    ranks' group counts may differ, so they are padded with NaN rows for the gather and the padding dropped), so
    that every rank calibrates from the same groups and keeps the same alpha. Unchanged on one process."""
    trainer = pl_module._trainer
    if trainer is None or getattr(trainer, "world_size", 1) <= 1:
        return rewards, lengths
    device = pl_module.device
    count = torch.tensor(rewards.shape[0], device=device)
    most = int(trainer.strategy.reduce(count, reduce_op="max"))
    pairs = torch.stack([rewards.to(device), lengths.to(device)])  # [2, num_groups, G]
    padded = torch.full((2, most, rewards.shape[1]), float("nan"), device=device, dtype=pairs.dtype)
    padded[:, : rewards.shape[0]] = pairs
    gathered = pl_module.all_gather(padded)  # [W, 2, most, G]
    merged = gathered.transpose(0, 1).reshape(2, -1, rewards.shape[1])
    keep = ~torch.isnan(merged[0]).any(dim=1)
    return merged[0][keep], merged[1][keep]


class GR3AlphaCalibration(Callback):
    """Calibrate (and optionally adapt) GR3's alpha from recent rollout groups.

    Args:
        alpha_grid: candidate alphas (QGLAS sweeps up to 0.6).
        target_fraction: fraction of groups that must satisfy the constraint (QGLAS: 0.999).
        window: number of recent training steps whose groups are pooled.
        adapt: write the calibrated alpha into the module's shaper (otherwise only log).
        every_n_steps: how often to recalibrate (at ``global_step % every_n_steps == 0``; a step is a rollout
            step of the GRPO family).
        exclude_constant_groups: leave groups with zero reward variance out of the satisfaction rates (default;
            they carry no advantage). ``False`` counts them, as a literal reading of the constraint does.

    Logged under ``train/``: ``gr3_satisfaction`` (rate of the current alpha), ``gr3_calibration_groups``
    (groups the rates are taken over) every step; ``gr3_calibrated_alpha`` at each calibration.
    """

    def __init__(
        self,
        alpha_grid: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
        target_fraction: float = 0.999,
        window: int = 32,
        adapt: bool = False,
        every_n_steps: int = 10,
        exclude_constant_groups: bool = True,
    ) -> None:
        super().__init__()
        if not 0.0 < target_fraction <= 1.0:
            raise ConfigError(f"GR3AlphaCalibration: target_fraction must be in (0, 1], got {target_fraction}")
        if window < 1 or every_n_steps < 1:
            raise ConfigError(
                f"GR3AlphaCalibration: window and every_n_steps must be >= 1, got {window}, {every_n_steps}"
            )
        if not alpha_grid or min(alpha_grid) < 0:
            raise ConfigError(f"GR3AlphaCalibration: alpha_grid must be non-empty and >= 0, got {alpha_grid}")
        self.alpha_grid = tuple(float(a) for a in alpha_grid)
        self.target_fraction = float(target_fraction)
        self.window = window
        self.adapt = adapt
        self.every_n_steps = every_n_steps
        self.exclude_constant_groups = bool(exclude_constant_groups)
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
        elif self.adapt and not callable(getattr(shaper, "set_alpha", None)):
            missing.append("a `shaper` with `set_alpha` (adapt=True)")
        if not hasattr(pl_module, "last_rollout"):
            missing.append("`last_rollout` (rollout rewards and lengths)")
        if missing:
            raise ConfigError(
                f"GR3AlphaCalibration needs a GRPO-family module with {' and '.join(missing)}; "
                f"got {type(pl_module).__name__}"
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rollout = pl_module.last_rollout
        if not rollout:
            return
        base = pl_module.shaper.base_rewards(rollout["rewards"].detach().float())
        base, lengths = gather_groups(pl_module, base, rollout["lengths"].detach().float())
        self.buffer.append((base.cpu(), lengths.cpu()))
        self.buffer = self.buffer[-self.window :]
        rewards = torch.cat([b[0] for b in self.buffer])
        lengths = torch.cat([b[1] for b in self.buffer])
        exclude = self.exclude_constant_groups
        informative = int((~constant_groups(rewards)).sum()) if exclude else rewards.shape[0]
        current = float(pl_module.shaper.alpha)
        pl_module.log("train/gr3_calibration_groups", float(informative), batch_size=1)
        if informative:
            rate = satisfaction_rate(rewards, lengths, current, exclude_constant_groups=exclude)
            pl_module.log("train/gr3_satisfaction", rate, batch_size=1)
        if trainer.global_step % self.every_n_steps or not informative:
            return
        result = calibrate_alpha(
            rewards, lengths, self.alpha_grid, self.target_fraction, exclude_constant_groups=exclude
        )
        pl_module.log("train/gr3_calibrated_alpha", result.alpha, batch_size=1)
        self.history.append({"step": float(trainer.global_step), "alpha": result.alpha, "current": current})
        if result.alpha == 0.0 and max(self.alpha_grid) > 0:
            log.warning(
                "GR3AlphaCalibration: the calibrated alpha is 0 at step %d (no alpha > 0 meets the constraint in "
                "%.4g of %d groups; rates %s)%s: GR3 does not rescale rewards while alpha is 0",
                trainer.global_step,
                self.target_fraction,
                informative,
                {a: round(r, 4) for a, r in result.as_dict().items()},
                "" if exclude else "; constant groups are counted (exclude_constant_groups=False)",
            )
        if self.adapt:  # the shaper owns alpha and checkpoints it with the module
            pl_module.shaper.set_alpha(float(result.alpha))

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.buffer = list(state_dict.get("buffer", []))
        self.history = list(state_dict.get("history", []))
