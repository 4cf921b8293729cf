"""GR3 — Group Relative Reward Rescaling.

Paper: "Tackling Length Inflation Without Trade-offs: Group Relative Reward Rescaling for Reinforcement
Learning", arXiv:2603.10535 (ICML 2026). No official code was found; the formula, the advantage-aware
calibration of alpha and the RLHF sigmoid come from the third-party re-implementation in the QGLAS paper
(Weng et al., appendix A.2) — see ``research/rl.md`` §2.

GR3 rescales the quality reward of each completion *before* the GRPO advantage, multiplicatively and
relative to the mean length of its rollout group. ``r = 0`` stays 0 (only rewarded answers are
length-shaped) and the length budget adapts to the prompt (hard prompts have long groups).

Equation -> function map (``r``, ``l`` one group of ``G`` completions, ``l_bar = mean_g l``):

- (GR3-1) rescaling ``r_hat_i = r_i / (1 + alpha * l_i / l_bar)``           -> :func:`gr3_rescale`
- (GR3-2) GRPO advantage on ``r_hat``                                      -> ``zoo.rl.advantages.grpo_advantages``
- (GR3-3) RLHF squashing ``r = sigmoid((r_raw - median_g r_raw) / tau)``    -> :func:`rlhf_sigmoid`
- (GR3-4) calibration constraint ``r_max / (1 + alpha) >= mean_g r_hat``     -> :func:`satisfied_groups`,
  :func:`satisfaction_rate`
- (GR3-5) alpha = largest grid value whose satisfaction rate >= target      -> :func:`calibrate_alpha`
- the shaper seam used by the GRPO module (GR3-1 with optional GR3-3)      -> ``zoo.rl.shapers.GR3Shaper``

Rewards must be non-negative: dividing a negative reward by a larger factor makes it *less* negative,
which would pay long wrong answers. :func:`gr3_rescale` raises instead of guessing a shift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.errors import ConfigError

__all__ = [
    "AlphaCalibration",
    "calibrate_alpha",
    "gr3_rescale",
    "rlhf_sigmoid",
    "satisfaction_rate",
    "satisfied_groups",
]


def _check_pair(rewards: Tensor, lengths: Tensor, who: str) -> tuple[Tensor, Tensor]:
    if rewards.dim() != 2 or rewards.shape != lengths.shape:
        raise ValueError(
            f"{who}: rewards and lengths must both be [num_groups, group_size]; got {tuple(rewards.shape)} "
            f"and {tuple(lengths.shape)}"
        )
    r = rewards if rewards.is_floating_point() else rewards.float()
    length = lengths.to(r.dtype)
    if not torch.isfinite(r).all():
        raise ValueError(f"{who}: rewards contain NaN or inf")
    if (length < 0).any() or not torch.isfinite(length).all():
        raise ValueError(f"{who}: lengths must be finite and >= 0")
    return r, length


def _check_non_negative(r: Tensor, who: str) -> None:
    if (r < 0).any():
        n = int((r < 0).sum())
        raise ConfigError(
            f"{who}: GR3 needs non-negative rewards (multiplicative rescaling of a negative reward pays long "
            f"wrong answers), got {n} negative value(s), min {float(r.min()):.4g}. Use rlhf_sigmoid=True for "
            "reward-model scores, or shift the rewards explicitly before the shaper."
        )


def _relative_lengths(length: Tensor) -> Tensor:
    mean = length.mean(dim=1, keepdim=True)
    # A group of empty completions (mean 0) has relative length 0: no rescaling instead of 0/0.
    return torch.where(mean > 0, length / mean.clamp(min=torch.finfo(length.dtype).tiny), torch.zeros_like(length))


def gr3_rescale(rewards: Tensor, lengths: Tensor, alpha: float) -> Tensor:
    """(GR3-1) ``r_hat_i = r_i / (1 + alpha * l_i / l_bar_g)``.

    Args:
        rewards: ``[num_groups, G]``, non-negative (raises ``ConfigError``, a ``ValueError``, otherwise).
        lengths: ``[num_groups, G]`` completion lengths (tokens, prompt excluded); any unit, only ratios matter.
        alpha: rescaling strength, ``>= 0``; ``alpha = 0`` returns ``rewards`` unchanged.

    Returns:
        ``r_hat [num_groups, G]``. Invariant to scaling all lengths of a group by ``c > 0``.

    Example:
        >>> gr3_rescale(torch.tensor([[1.0, 0.0, 1.0]]), torch.tensor([[10, 20, 30]]), alpha=1.0)
        tensor([[0.6667, 0.0000, 0.4000]])
    """
    if alpha < 0:
        raise ConfigError(f"gr3_rescale: alpha must be >= 0, got {alpha}")
    r, length = _check_pair(rewards, lengths, "gr3_rescale")
    _check_non_negative(r, "gr3_rescale")
    return r / (1.0 + alpha * _relative_lengths(length))


def rlhf_sigmoid(raw_scores: Tensor, temperature: float = 2.0, reference: str | float = "median") -> Tensor:
    """(GR3-3) Squash reward-model scores into (0, 1): ``sigmoid((r_raw - r_ref) / tau)``.

    Args:
        raw_scores: ``[num_groups, G]`` (any sign).
        temperature: ``tau`` (2.0 in the QGLAS re-implementation).
        reference: ``"median"`` (group median, interpolated for even ``G``), ``"mean"`` (group mean), or a
            fixed number.

    Returns:
        ``[num_groups, G]`` in (0, 1); the group median maps to 0.5 with ``reference="median"``.
    """
    if temperature <= 0:
        raise ConfigError(f"rlhf_sigmoid: temperature must be > 0, got {temperature}")
    if raw_scores.dim() != 2:
        raise ValueError(f"rlhf_sigmoid: expected [num_groups, G], got {tuple(raw_scores.shape)}")
    x = raw_scores.float() if not raw_scores.is_floating_point() else raw_scores
    if reference == "median":
        ref = torch.quantile(x, 0.5, dim=1, keepdim=True)
    elif reference == "mean":
        ref = x.mean(dim=1, keepdim=True)
    elif isinstance(reference, (int, float)):
        ref = torch.full_like(x[:, :1], float(reference))
    else:
        raise ConfigError(f"rlhf_sigmoid: reference must be 'median', 'mean' or a number, got {reference!r}")
    return torch.sigmoid((x - ref) / temperature)


def satisfied_groups(
    rewards: Tensor, lengths: Tensor, alpha: float, *, rtol: float = 1e-6, exclude_constant_groups: bool = False
) -> Tensor:
    """(GR3-4) Per group, whether a max-reward response of average length keeps a shaped reward at or above
    the shaped group mean: ``r_max / (1 + alpha) >= mean_g r_hat`` (``r_max`` = the group's largest reward).

    ``rtol`` absorbs float rounding (relative to ``r_max``), so ``alpha = 0`` satisfies every group.

    Args:
        rewards, lengths: ``[num_groups, G]``; rewards non-negative.
        exclude_constant_groups: drop groups whose rewards are all equal (returned as ``False`` *and* left out
            of :func:`satisfaction_rate`'s denominator). Default False: as in the notes, all-correct groups with
            unequal lengths count, and violate the constraint for every ``alpha > 0`` (Jensen).

    Returns:
        ``bool [num_groups]``.
    """
    r, length = _check_pair(rewards, lengths, "satisfied_groups")
    _check_non_negative(r, "satisfied_groups")
    r_hat = r / (1.0 + alpha * _relative_lengths(length))
    r_max = r.max(dim=1).values
    ok = r_max / (1.0 + alpha) >= r_hat.mean(dim=1) - rtol * r_max.abs()
    if exclude_constant_groups:
        ok = ok & ~(r == r[:, :1]).all(dim=1)
    return ok


def satisfaction_rate(
    rewards: Tensor, lengths: Tensor, alpha: float, *, rtol: float = 1e-6, exclude_constant_groups: bool = False
) -> float:
    """(GR3-4) Fraction of groups that satisfy the calibration constraint at ``alpha``; see :func:`satisfied_groups`.

    ``rewards``/``lengths`` are ``[num_groups, G]`` (concatenate several steps' groups for a stable estimate).
    Returns 1.0 when no group is left (empty input, or every group excluded).
    """
    ok = satisfied_groups(rewards, lengths, alpha, rtol=rtol, exclude_constant_groups=exclude_constant_groups)
    # exact integer counts: a float32 mean turns 9/10 into 0.89999998 < 0.9
    n = int((rewards != rewards[:, :1]).any(dim=1).sum()) if exclude_constant_groups else ok.numel()
    return 1.0 if n == 0 else int(ok.sum()) / n


@dataclass(frozen=True)
class AlphaCalibration:
    """Result of :func:`calibrate_alpha`.

    Attributes:
        alpha: the chosen alpha (0.0 when no grid value reaches the target; ``alpha = 0`` always satisfies).
        alphas: the sorted grid.
        rates: satisfaction rate per grid value, aligned with ``alphas``.
        target_fraction: the target that was asked for.
        satisfied: whether some grid value reached the target.
    """

    alpha: float
    alphas: tuple[float, ...]
    rates: tuple[float, ...]
    target_fraction: float
    satisfied: bool

    def as_dict(self) -> dict[float, float]:
        """``{alpha: satisfaction_rate}`` for logging."""
        return dict(zip(self.alphas, self.rates))


def calibrate_alpha(
    rewards: Tensor,
    lengths: Tensor,
    alpha_grid: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
    target_fraction: float = 0.999,
    *,
    rtol: float = 1e-6,
    exclude_constant_groups: bool = False,
) -> AlphaCalibration:
    """(GR3-5) Advantage-aware calibration: the largest ``alpha`` on the grid whose satisfaction rate
    (:func:`satisfaction_rate`, constraint GR3-4) is ``>= target_fraction``.

    "Largest satisfying" is taken literally: the rate need not be monotone in alpha, and the largest grid
    value that passes wins even if a smaller one fails.

    Args:
        rewards, lengths: ``[num_groups, G]`` rollout rewards (after any RLHF sigmoid) and lengths.
        alpha_grid: candidate values, each ``>= 0`` (QGLAS sweeps up to 0.6 and uses 0.3).
        target_fraction: required fraction of satisfying groups, in (0, 1] (QGLAS: 99.9%).

    Returns:
        :class:`AlphaCalibration` with the chosen alpha and the rate of every grid value.
    """
    if not 0.0 < target_fraction <= 1.0:
        raise ConfigError(f"calibrate_alpha: target_fraction must be in (0, 1], got {target_fraction}")
    alphas = tuple(sorted(float(a) for a in alpha_grid))
    if not alphas:
        raise ConfigError("calibrate_alpha: alpha_grid is empty")
    if alphas[0] < 0:
        raise ConfigError(f"calibrate_alpha: alphas must be >= 0, got {alphas[0]}")
    rates = tuple(
        satisfaction_rate(rewards, lengths, a, rtol=rtol, exclude_constant_groups=exclude_constant_groups)
        for a in alphas
    )
    passing = [a for a, rate in zip(alphas, rates) if rate >= target_fraction]
    return AlphaCalibration(
        alpha=max(passing) if passing else 0.0,
        alphas=alphas,
        rates=rates,
        target_fraction=float(target_fraction),
        satisfied=bool(passing),
    )
