"""Group-relative advantage estimators (seam (ii) of the GRPO family, notes ``rl.md`` §1(a)).

All estimators map ``rewards [num_groups, G] -> advantages [num_groups, G]``; a group is the ``G``
completions of one prompt. Flat reward vectors must be laid out as *contiguous* blocks of ``G``
(``[p0c0, p0c1, ..., p1c0, ...]``); :func:`to_groups` reshapes them and checks the size.

Equations (``r`` one group, ``mean``/``std`` over the group, ``std`` Bessel-corrected as ``torch.std``):

- GRPO (TRL ``scale_rewards="group"``): ``A_i = (r_i - mean r) / (std r + eps)``, ``eps = 1e-4``.
- GRPO, ``scale="batch"`` (TRL): group mean, std over the whole batch.
- Dr.GRPO (``scale="none"``): ``A_i = r_i - mean r``.
- RLOO: ``A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean r)``.

Every estimator returns exactly 0 for a group whose rewards are all equal (no NaN, no rounding residue).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch
from torch import Tensor

from zoo.errors import ConfigError

Scale = Literal["group", "batch", "none"]


def to_groups(values: Tensor, group_size: int) -> Tensor:
    """Reshape a flat ``[N]`` tensor laid out as contiguous groups into ``[N // G, G]``."""
    if values.dim() != 1:
        raise ValueError(f"expected a flat [N] tensor, got shape {tuple(values.shape)}")
    if group_size < 1 or values.numel() % group_size:
        raise ConfigError(f"{values.numel()} values cannot be split into groups of {group_size}")
    return values.reshape(-1, group_size)


def _check_rewards(rewards: Tensor, who: str) -> Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"{who}: rewards must have shape [num_groups, group_size], got {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise ConfigError(
            f"{who}: group size {rewards.shape[1]} < 2; group-relative advantages need at least two completions "
            "per prompt (set num_generations >= 2)"
        )
    if not torch.isfinite(rewards).all():
        raise ValueError(f"{who}: rewards contain NaN or inf")
    return rewards.float() if not rewards.is_floating_point() else rewards


def constant_groups(rewards: Tensor) -> Tensor:
    """``bool [num_groups]``: groups of ``rewards [num_groups, G]`` whose rewards are all equal (zero variance).

    Every estimator here gives such a group advantage 0 everywhere: it carries no policy-gradient signal (DAPO's
    dynamic sampling drops them; GR3's calibration leaves them out).
    """
    return (rewards == rewards[:, :1]).all(dim=1)


def _zero_constant_groups(adv: Tensor, rewards: Tensor) -> Tensor:
    return adv.masked_fill(constant_groups(rewards)[:, None], 0.0)


def grpo_advantages(rewards: Tensor, scale: Scale = "group", eps: float = 1e-4) -> Tensor:
    """GRPO advantage ``A_i = (r_i - mean_g r) / (std_g r + eps)`` (GRPO; TRL ``scale_rewards``).

    Args:
        rewards: ``[num_groups, G]``, ``G >= 2``.
        scale: ``"group"`` (std per group, TRL default), ``"batch"`` (std over all rewards), ``"none"``
            (no std division = Dr.GRPO).
        eps: added to the std (TRL: 1e-4).

    Returns:
        ``[num_groups, G]``; exactly 0 in groups with constant rewards.

    Example:
        >>> grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.3, 0.3, 0.3, 0.3]]))
        tensor([[ 0.8659, -0.8659, -0.8659,  0.8659],
                [ 0.0000,  0.0000,  0.0000,  0.0000]])
    """
    r = _check_rewards(rewards, "grpo_advantages")
    centered = r - r.mean(dim=1, keepdim=True)
    if scale == "group":
        adv = centered / (r.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        adv = centered / (r.std() + eps)
    elif scale == "none":
        adv = centered
    else:
        raise ConfigError(f"unknown advantage scale {scale!r}; choose 'group', 'batch' or 'none'")
    return _zero_constant_groups(adv, r)


def rloo_advantages(rewards: Tensor) -> Tensor:
    """RLOO leave-one-out advantage ``A_i = r_i - (sum_g r - r_i) / (G - 1)``; ``[num_groups, G]`` in and out."""
    r = _check_rewards(rewards, "rloo_advantages")
    g = r.shape[1]
    baseline = (r.sum(dim=1, keepdim=True) - r) / (g - 1)
    return _zero_constant_groups(r - baseline, r)


class AdvantageEstimator(ABC):
    """Base class: ``estimator(rewards [num_groups, G]) -> advantages [num_groups, G]``.

    :meth:`metrics` reports the estimator's own state for the GRPO family to log under ``train/`` (none for the
    stateless estimators here).
    """

    name: str = "base"

    @abstractmethod
    def __call__(self, rewards: Tensor) -> Tensor:
        """Apply the transform (see the class docstring)."""

    def metrics(self) -> dict[str, float | Tensor]:
        """Scalars to log every training step, by name (none by default)."""
        return {}


class GRPOAdvantage(AdvantageEstimator):
    """GRPO group-normalized advantage; see :func:`grpo_advantages`."""

    name = "grpo"

    def __init__(self, scale: Scale = "group", eps: float = 1e-4) -> None:
        if scale not in ("group", "batch", "none"):
            raise ConfigError(f"unknown advantage scale {scale!r}; choose 'group', 'batch' or 'none'")
        if eps < 0:
            raise ConfigError(f"eps must be >= 0, got {eps}")
        self.scale: Scale = scale
        self.eps = float(eps)

    def __call__(self, rewards: Tensor) -> Tensor:
        return grpo_advantages(rewards, scale=self.scale, eps=self.eps)

    def __repr__(self) -> str:
        return f"GRPOAdvantage(scale={self.scale!r}, eps={self.eps})"


class DrGRPOAdvantage(AdvantageEstimator):
    """Dr.GRPO advantage ``A_i = r_i - mean_g r`` (no std division, removes the difficulty bias)."""

    name = "dr_grpo"

    def __call__(self, rewards: Tensor) -> Tensor:
        return grpo_advantages(rewards, scale="none")

    def __repr__(self) -> str:
        return "DrGRPOAdvantage()"


class RLOOAdvantage(AdvantageEstimator):
    """RLOO leave-one-out advantage; see :func:`rloo_advantages`."""

    name = "rloo"

    def __call__(self, rewards: Tensor) -> Tensor:
        return rloo_advantages(rewards)

    def __repr__(self) -> str:
        return "RLOOAdvantage()"


def reward_group_stats(rewards: Tensor) -> dict[str, Tensor]:
    """Diagnostics of ``rewards [num_groups, G]`` (notes §0.7): ``frac_reward_zero_std`` (groups that carry
    no GRPO signal), ``reward_mean``, ``reward_std`` (mean within-group std). Detached scalar tensors."""
    r = rewards.detach().float()
    constant = constant_groups(r)
    std = r.std(dim=1) if r.shape[1] > 1 else torch.zeros(r.shape[0], device=r.device)
    return {
        "frac_reward_zero_std": constant.float().mean(),
        "reward_mean": r.mean(),
        "reward_std": std.mean(),
    }
