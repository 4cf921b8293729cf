"""DRIFT -- "DRIFT: Decoupled Rollouts and Importance-Weighted Fine-Tuning" (arXiv 2605.31455, ICML 2026).

The KL-regularised RL objective ``max_pi E_pi[R] - beta KL(pi || pi_ref)`` has the optimum
``pi*(tau) = pi_ref(tau) exp(R(tau) / beta) / Z``; projecting ``pi*`` onto the model with the forward KL gives a
weighted SFT objective on trajectories sampled **once, offline**, from the fixed reference policy:
``max_theta E_{tau ~ pi_ref}[ w(tau) log pi_theta(tau) ]`` with ``w = exp(R / beta) / Z``. No rollout happens during
optimisation. As released (github.com/2020-qqtcg/DRIFT, ``src/weight_sft.py``), only the **last assistant turn** of
each trajectory is fitted (earlier turns and feedback are context) and ``Z`` is estimated per prompt.

Equation -> function (or config):

* ``R = sum_t gamma^(t-1) r_t + format_penalty - repeat_penalty`` -> :func:`discounted_return`
  (``compute_discounted_return`` + the penalties of ``add_weights_to_dataset``);
* ``repeat_penalty = lambda (1 - #unique answers / #answers)`` -> :func:`repeat_penalty`
  (``compute_trajectory_penalty``, from :mod:`zoo.data.feedback`);
* ``w_i = exp(R_i / beta - m) / mean_{j in g(i)} exp(R_j / beta - m)``, ``m = max_{j in g(i)} R_j / beta`` (per-prompt
  self-normalised, group mean 1) -> :func:`drift_weights` (``compute_weights``);
* the weights of a rollout file -> :class:`DriftWeighting`; the baselines on the same rows: uniform SFT
  (``beta -> inf``) -> :class:`UniformWeighting`, rejection-sampling fine-tuning (successes only) ->
  :class:`SuccessWeighting`;
* ``L = mean_i w_i l_i`` with ``l_i`` the mean token cross-entropy of sample ``i``'s last assistant turn
  (``WeightedSFTTrainer.compute_loss``) -> the SFT family's weight seam, no private loss:
  :class:`~zoo.modules.CausalLMModule` with ``sample_reduction=token_mean`` and ``normalizer=sequences``
  (``normalizer=self_normalised``: ``sum w l / sum w``, the released ``BATCH_WEIGHT_NORMAL=True``), on the rows of
  :class:`~zoo.datamodules.MultiTurnSFTDataModule` (labels only on the last assistant turn);
* the episodes and the offline rollouts -> :mod:`zoo.data.feedback`, :mod:`zoo.data.rollouts`,
  ``python train.py +method=drift_rollouts``.

Defaults: ``gamma = 0.9``, ``beta = 0.1`` (``scripts/run_weight_sft.sh``); the argparse defaults of
``src/weight_sft.py`` differ (``--gamma 0.7``, ``--beta 0.2``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from zoo.errors import ConfigError, DataError

Rollout = Mapping[str, Any]


def repeat_penalty(answers: Sequence[str], weight: float = 0.5) -> float:
    """``weight * (1 - #unique / #answers)`` (``compute_trajectory_penalty`` of the released ``src/weight_sft.py``,
    ``TRAJECTORY_PENALTY_LAMBDA = 0.5``); 0 without answers. Empty strings count as answers but never as new ones.

    >>> repeat_penalty(["3", "3", "4", "3"])
    0.25
    """
    if not answers:
        return 0.0
    unique = {a for a in answers if a}
    return max(0.0, weight * (1.0 - len(unique) / len(answers)))


def discounted_return(
    turn_rewards: Sequence[float], gamma: float, format_penalty: float = 0.0, repeat_penalty: float = 0.0
) -> float:
    """``R = sum_t gamma^(t-1) r_t + format_penalty - repeat_penalty`` (turns counted from 1).

    A first success at turn ``t`` (``r_t = 1``, earlier rewards 0) gives ``gamma ** (t - 1)``; no success gives 0
    (plus the penalties). ``format_penalty`` is already signed (``<= 0`` in the released code); ``repeat_penalty``
    (``>= 0``) is subtracted.

    Raises:
        ConfigError: ``gamma`` outside ``[0, 1]``.
        DataError: a non-finite reward or penalty.
    """
    if not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):
        raise ConfigError(f"gamma must be in [0, 1], got {gamma!r}")
    rewards = [float(r) for r in turn_rewards]
    values = [*rewards, float(format_penalty), float(repeat_penalty)]
    if not all(math.isfinite(v) for v in values):
        raise DataError(
            f"non-finite turn reward or penalty (turn_rewards={rewards}, format_penalty={format_penalty}, "
            f"repeat_penalty={repeat_penalty})"
        )
    total = sum(gamma**t * r for t, r in enumerate(rewards))
    return float(total + format_penalty - repeat_penalty)


def drift_weights(returns: Tensor, group_ids: Tensor, beta: float) -> Tensor:
    """Per-group self-normalised importance weights ``w_i = exp(R_i / beta - m_g) / mean_{j in g} exp(R_j / beta -
    m_g)``, ``m_g = max_{j in g} R_j / beta`` (the weights of every group have mean exactly 1, up to rounding).

    ``beta = inf`` gives all ones (uniform SFT); ``beta -> 0`` puts all the mass of a group on its argmax-return
    trajectories. Adding a constant to every return of a group leaves its weights unchanged. A group with a single
    trajectory gets weight 1, as the released ``compute_weights`` gives it (rollout files with one trajectory per
    prompt, or rows left alone by filtering, train as plain SFT rows). Computed in float64.

    Args:
        returns: ``[N]`` trajectory returns.
        group_ids: ``[N]`` integer group (prompt) of each trajectory; groups need not be contiguous.
        beta: temperature ``> 0`` (``float("inf")`` allowed).

    Returns:
        ``[N]`` weights (the dtype of ``returns`` when floating, else float32).

    Raises:
        ConfigError: ``beta <= 0`` or NaN.
        DataError: a non-finite return.
        ValueError: shapes or dtypes that do not match.
    """
    if not (isinstance(beta, (int, float)) and beta > 0):
        raise ConfigError(f"beta must be > 0 (inf allowed: uniform weights), got {beta!r}")
    if returns.dim() != 1 or group_ids.shape != returns.shape:
        raise ValueError(
            f"returns and group_ids must both be [N], got {tuple(returns.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be integers, got {group_ids.dtype}")
    out_dtype = returns.dtype if returns.is_floating_point() else torch.float32
    if returns.numel() == 0:
        return returns.to(out_dtype)
    values = returns.double()
    bad = (~torch.isfinite(values)).nonzero().flatten()
    if bad.numel():
        raise DataError(f"non-finite returns at positions {bad[:5].tolist()} (values {values[bad[:5]].tolist()})")
    groups, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    scaled = values / beta if math.isfinite(beta) else torch.zeros_like(values)
    peak = torch.full((len(groups),), -math.inf, dtype=values.dtype, device=values.device)
    peak = peak.scatter_reduce(0, inverse, scaled, reduce="amax")
    shifted = torch.exp(scaled - peak[inverse])
    means = torch.zeros_like(peak).index_add(0, inverse, shifted) / counts.to(values.dtype)
    return (shifted / means[inverse]).to(out_dtype)


# -- weights of a rollout file ---------------------------------------------------------------------------------------
class TrajectoryWeighting(ABC):
    """Per-trajectory loss weights of the rows of a rollout file (``zoo.data.rollouts``; the rows are validated).

    ``min_group_size``: trajectories a prompt must have (checked by the rollout source, which names the file line).
    Rows given a weight of exactly 0 are left out of training by the rollout source.
    """

    min_group_size: int = 1

    @abstractmethod
    def __call__(self, rows: Sequence[Rollout]) -> list[float]:
        """One weight per row."""

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__}


class DriftWeighting(TrajectoryWeighting):
    """DRIFT's weights: :func:`drift_weights` of each trajectory's :func:`discounted_return` per ``prompt_id``.

    Args:
        beta: temperature (script: 0.1; argparse default 0.2).
        gamma: discount (script: 0.9; argparse default 0.7); the return is recomputed from ``turn_rewards``,
            ``format_penalty`` and ``repeat_penalty``. ``None``: use the file's ``return`` as it is.
    """

    def __init__(self, beta: float = 0.1, gamma: float | None = 0.9) -> None:
        if not (isinstance(beta, (int, float)) and beta > 0):
            raise ConfigError(f"beta must be > 0 (inf allowed: uniform weights), got {beta!r}")
        if gamma is not None and not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):
            raise ConfigError(f"gamma must be in [0, 1] or null (use the file's return), got {gamma!r}")
        self.beta = float(beta)
        self.gamma = gamma

    def returns(self, rows: Sequence[Rollout]) -> Tensor:
        """``[N]`` returns of the rows (recomputed with :attr:`gamma`, or the ``return`` field)."""
        if self.gamma is None:
            return torch.tensor([float(r["return"]) for r in rows], dtype=torch.float64)
        values = [
            discounted_return(r["turn_rewards"], self.gamma, r["format_penalty"], r["repeat_penalty"]) for r in rows
        ]
        return torch.tensor(values, dtype=torch.float64)

    def __call__(self, rows: Sequence[Rollout]) -> list[float]:
        index: dict[str, int] = {}
        groups = torch.tensor([index.setdefault(str(r["prompt_id"]), len(index)) for r in rows], dtype=torch.long)
        return drift_weights(self.returns(rows), groups, self.beta).tolist()

    def describe(self) -> dict[str, Any]:
        return {"kind": "drift", "beta": self.beta, "gamma": self.gamma}


class UniformWeighting(TrajectoryWeighting):
    """Weight 1 for every trajectory: plain SFT on the same last turns (DRIFT's ``beta -> inf``)."""

    def __call__(self, rows: Sequence[Rollout]) -> list[float]:
        return [1.0] * len(rows)

    def describe(self) -> dict[str, Any]:
        return {"kind": "uniform"}


class SuccessWeighting(TrajectoryWeighting):
    """Rejection-sampling fine-tuning (RFT): weight 1 for the trajectories that succeeded (``t_star`` set), 0 for the
    others (left out). The ``beta -> 0`` limit of DRIFT differs slightly: it keeps only the *earliest* successes of a
    prompt, and a prompt without success keeps its best failures."""

    def __call__(self, rows: Sequence[Rollout]) -> list[float]:
        return [1.0 if r.get("t_star") is not None else 0.0 for r in rows]

    def describe(self) -> dict[str, Any]:
        return {"kind": "successes"}


__all__ = [
    "DriftWeighting",
    "SuccessWeighting",
    "TrajectoryWeighting",
    "UniformWeighting",
    "discounted_return",
    "drift_weights",
    "repeat_penalty",
]
