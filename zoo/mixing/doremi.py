"""DoReMi: domain reweighting with minimax optimisation (Xie et al., arXiv 2305.10429; repo sangmichaelxie/doremi).

A proxy model is trained with Group DRO against a reference model; the domain weights follow an exponentiated-gradient
ascent on the per-domain excess loss, and their average over training is the mixture to train the large model with.
Equation -> function (notes ``multimodal_quant_data.md`` §2 "DoReMi"):

- per-domain excess loss ``lambda_t[k] = mean over domain-k tokens of max(l_proxy - l_ref, 0)``, over all the
  tokens of an optimizer step (every micro-batch, every rank: sums and counts add up)
  -> :func:`domain_excess_sums`, :func:`domain_excess_loss`
- a domain without tokens in the step keeps its last score (official ``doremi/trainer.py``,
  ``update_domain_weights``: ``curr_domain_scores = self.model.perdomain_scores[domain_id]``; scores start at
  ``log |vocabulary|``, ``doremi/train.py``), or scores 0 (``absent_domains="zero"``)  -> :func:`resolve_absent`
- ``a'_t = a_{t-1} * exp(eta lambda_t)`` (in log space, normalised), ``a_t = (1 - c) a'_t + c/K``
  -> :func:`doremi_update`
- the proxy objective ``sum_k a_t[k] * (mean domain-k token loss)`` as per-row weights of the token-mean loss
  -> :func:`domain_loss_weights`
- output ``mean_t a_t`` -> :class:`DoReMiWeights` (``average``)

Plain torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from zoo.errors import ConfigError, DataError


def doremi_update(weights: Tensor, excess_loss: Tensor, eta: float, smoothing: float) -> Tensor:
    """One DoReMi step of the domain weights.

    ``a' = softmax(log a + eta * lambda)``, then ``(1 - c) a' + c / K``. Every domain needs a score: a domain without
    tokens in the step (``NaN`` from :func:`domain_excess_loss`) is resolved first (:func:`resolve_absent`; the
    official rule keeps its last score).

    Args:
        weights: ``[K]`` current weights on the simplex (``> 0``).
        excess_loss: ``[K]`` per-domain scores ``>= 0``.
        eta: step size (paper: 1).
        smoothing: ``c`` in ``[0, 1]`` (paper: 1e-3; the reference code's default ``reweight_eps`` is 1e-4).

    Returns:
        ``[K]`` new weights on the simplex, each ``>= c / K``.

    Raises:
        DataError: a NaN score (an absent domain not resolved), an infinite one (a diverged model), or shapes that
            differ.
    """
    weights = torch.as_tensor(weights, dtype=torch.float64)
    excess = torch.as_tensor(excess_loss, dtype=torch.float64)
    if weights.shape != excess.shape or weights.ndim != 1:
        raise DataError(f"doremi_update: weights {tuple(weights.shape)} and excess_loss {tuple(excess.shape)} differ")
    if not 0.0 <= smoothing <= 1.0 or not math.isfinite(eta):
        raise ConfigError(f"doremi_update: smoothing must be in [0, 1] and eta finite, got {smoothing}, {eta}")
    if bool(torch.isinf(excess).any()):
        raise DataError(f"doremi_update: infinite excess loss {excess.tolist()} (did the proxy or reference diverge?)")
    if bool(torch.isnan(excess).any()):
        raise DataError(
            f"doremi_update: NaN excess loss {excess.tolist()} (a domain without tokens in the step); resolve it first "
            "with zoo.mixing.doremi.resolve_absent (keep the last score, or 0)"
        )
    updated = torch.softmax(torch.log(weights.clamp_min(1e-300)) + eta * excess, dim=0)
    k = weights.shape[0]
    return (1 - smoothing) * updated + smoothing / k


ABSENT_RULES = ("keep_last", "zero")


def resolve_absent(excess_loss: Tensor, last_scores: Tensor, rule: str = "keep_last") -> Tensor:
    """The scores of a step whose absent domains (``NaN`` excess loss: no tokens in the step) are resolved.

    ``keep_last`` (official code, ``doremi/trainer.py`` ``update_domain_weights``): such a domain keeps its last score
    ``last_scores[k]``, so its weight keeps moving as it did when last seen. ``zero``: it scores 0, so its weight moves
    only through normalisation and smoothing (it loses weight against any domain with a positive excess loss).

    Args:
        excess_loss: ``[K]`` this step's per-domain excess losses (``NaN`` = absent).
        last_scores: ``[K]`` the scores of the previous update (the initial scores before any).
        rule: ``keep_last`` or ``zero``.
    """
    excess = torch.as_tensor(excess_loss, dtype=torch.float64)
    if rule == "keep_last":
        return torch.where(torch.isnan(excess), torch.as_tensor(last_scores, dtype=torch.float64), excess)
    if rule == "zero":
        return torch.nan_to_num(excess, nan=0.0)
    raise ConfigError(f"DoReMi absent_domains must be one of {ABSENT_RULES}, got {rule!r}")


def domain_excess_sums(
    proxy_loss: Tensor, reference_loss: Tensor, token_mask: Tensor, domain_index: Tensor, num_domains: int
) -> tuple[Tensor, Tensor]:
    """``(sums [K], counts [K])``: per domain, the summed clipped excess ``max(l_proxy - l_ref, 0)`` over its tokens
    and the number of those tokens (float64). Sums and counts of several micro-batches or ranks add up; their ratio is
    :func:`domain_excess_loss` of the whole step (official code: the excess losses of the step's micro-batches and
    of every process are gathered before the update)."""
    excess = (proxy_loss.double() - reference_loss.double()).clamp_min(0) * token_mask
    index = domain_index.to(excess.device)
    totals = torch.zeros(num_domains, dtype=torch.float64, device=excess.device).index_add_(0, index, excess.sum(1))
    counts = torch.zeros(num_domains, dtype=torch.float64, device=excess.device)
    counts.index_add_(0, index, token_mask.double().sum(dim=1))
    return totals, counts


def excess_from_sums(sums: Tensor, counts: Tensor) -> Tensor:
    """``sums / counts`` per domain, ``NaN`` where a domain has no tokens."""
    return torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, math.nan))


def domain_excess_loss(
    proxy_loss: Tensor, reference_loss: Tensor, token_mask: Tensor, domain_index: Tensor, num_domains: int
) -> Tensor:
    """``lambda[k] = mean over domain-k tokens of max(l_proxy - l_ref, 0)``.

    Args:
        proxy_loss, reference_loss: ``[B, T]`` per-token losses of the proxy and the reference.
        token_mask: ``[B, T]`` bool, the tokens that carry loss.
        domain_index: ``[B]`` domain of each row in ``0..K-1``.
        num_domains: ``K``.

    Returns:
        ``[K]`` float64; ``NaN`` for a domain with no tokens in the batch (see :func:`resolve_absent`).
    """
    return excess_from_sums(*domain_excess_sums(proxy_loss, reference_loss, token_mask, domain_index, num_domains))


def domain_loss_weights(weights: Tensor, token_counts: Tensor, domain_index: Tensor) -> Tensor:
    """Per-row weights ``w_i`` that turn the token-mean loss ``sum_i w_i l_i / sum_i n_i`` into DoReMi's proxy
    objective ``sum_k a_k * (mean loss over the batch's domain-k tokens)`` (domains absent from the batch drop out).

    ``w_i = a_{k(i)} * N / N_{k(i)}``, ``N`` the batch's loss tokens and ``N_k`` those of domain ``k``.

    Args:
        weights: ``[K]`` domain weights.
        token_counts: ``[B]`` loss tokens of each row.
        domain_index: ``[B]`` domain of each row.
    """
    counts = torch.zeros(len(weights), dtype=torch.float64).index_add_(0, domain_index, token_counts.double())
    total = counts.sum()
    per_domain = torch.where(counts > 0, weights.double() * total / counts.clamp_min(1), torch.zeros_like(counts))
    return per_domain[domain_index].float()


class DoReMiWeights:
    """The running DoReMi weights and their average over the steps (the method's output).

    Args:
        num_domains: ``K``.
        eta: step size.
        smoothing: ``c`` (every weight stays ``>= c/K``).
        initial: ``[K]`` starting weights (default uniform).
        absent_domains: how a domain without tokens in a step is scored (:func:`resolve_absent`): ``keep_last``
            (official code) or ``zero``.
        initial_score: the score of a domain before its first tokens (``keep_last``; the official code starts every
            score at ``log |vocabulary|``).
    """

    def __init__(
        self,
        num_domains: int,
        eta: float = 1.0,
        smoothing: float = 1e-3,
        initial: Tensor | None = None,
        absent_domains: str = "keep_last",
        initial_score: float = 0.0,
    ):
        if num_domains < 1:
            raise ConfigError(f"DoReMi needs at least one domain, got {num_domains}")
        if absent_domains not in ABSENT_RULES:
            raise ConfigError(f"DoReMi absent_domains must be one of {ABSENT_RULES}, got {absent_domains!r}")
        if not math.isfinite(initial_score) or initial_score < 0:
            raise ConfigError(f"DoReMi initial_score must be finite and >= 0, got {initial_score}")
        self.eta = float(eta)
        self.smoothing = float(smoothing)
        self.absent_domains = absent_domains
        start = torch.full((num_domains,), 1.0 / num_domains, dtype=torch.float64) if initial is None else initial
        self.current = torch.as_tensor(start, dtype=torch.float64) / float(torch.as_tensor(start).sum())
        self.total = torch.zeros(num_domains, dtype=torch.float64)
        self.scores = torch.full((num_domains,), float(initial_score), dtype=torch.float64)
        self.steps = 0

    def step(self, excess_loss: Tensor) -> Tensor:
        """Update with one optimizer step's ``[K]`` excess losses (``NaN`` = a domain without tokens in the step,
        resolved by ``absent_domains``); returns the new current weights."""
        self.scores = resolve_absent(excess_loss, self.scores, self.absent_domains)
        self.current = doremi_update(self.current, self.scores, self.eta, self.smoothing)
        self.total += self.current
        self.steps += 1
        return self.current

    @property
    def average(self) -> Tensor:
        """``mean_t a_t`` over the steps taken (the current weights before any step)."""
        return self.total / self.steps if self.steps else self.current.clone()

    def state_dict(self) -> dict[str, Any]:
        return {
            "current": self.current.tolist(),
            "total": self.total.tolist(),
            "steps": self.steps,
            "scores": self.scores.tolist(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if len(state["current"]) != len(self.current):
            raise ConfigError(
                f"DoReMi state holds {len(state['current'])} domain weights but the data has "
                f"{len(self.current)} domains"
            )
        self.current = torch.tensor(state["current"], dtype=torch.float64)
        self.total = torch.tensor(state["total"], dtype=torch.float64)
        self.steps = int(state["steps"])
        if "scores" in state:  # (checkpoints written before the last scores were kept have none)
            self.scores = torch.tensor(state["scores"], dtype=torch.float64)
