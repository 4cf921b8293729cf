"""DoReMi: domain reweighting with minimax optimisation (Xie et al., arXiv 2305.10429; repo sangmichaelxie/doremi).

A proxy model is trained with Group DRO against a reference model; the domain weights follow an exponentiated-gradient
ascent on the per-domain excess loss, and their average over training is the mixture to train the large model with.
Equation -> function (notes ``multimodal_quant_data.md`` §2 "DoReMi"):

- per-domain excess loss ``lambda_t[k] = mean over domain-k tokens of max(l_proxy - l_ref, 0)``
  -> :func:`domain_excess_loss`
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

    ``a' = softmax(log a + eta * lambda)``, then ``(1 - c) a' + c / K``. A ``NaN`` excess loss means the domain had no
    tokens in the step: it counts as 0 (the domain's weight moves only through normalisation and smoothing), so one
    empty domain never poisons the weights.

    Args:
        weights: ``[K]`` current weights on the simplex (``> 0``).
        excess_loss: ``[K]`` per-domain excess losses ``>= 0`` (``NaN`` = no tokens this step).
        eta: step size (paper: 1).
        smoothing: ``c`` in ``[0, 1]`` (paper: 1e-3; the reference code's default ``reweight_eps`` is 1e-4).

    Returns:
        ``[K]`` new weights on the simplex, each ``>= c / K``.

    Raises:
        DataError: an infinite excess loss (a diverged model), or shapes that differ.
    """
    weights = torch.as_tensor(weights, dtype=torch.float64)
    excess = torch.as_tensor(excess_loss, dtype=torch.float64)
    if weights.shape != excess.shape or weights.ndim != 1:
        raise DataError(f"doremi_update: weights {tuple(weights.shape)} and excess_loss {tuple(excess.shape)} differ")
    if not 0.0 <= smoothing <= 1.0 or not math.isfinite(eta):
        raise ConfigError(f"doremi_update: smoothing must be in [0, 1] and eta finite, got {smoothing}, {eta}")
    if bool(torch.isinf(excess).any()):
        raise DataError(f"doremi_update: infinite excess loss {excess.tolist()} (did the proxy or reference diverge?)")
    excess = torch.nan_to_num(excess, nan=0.0)
    updated = torch.softmax(torch.log(weights.clamp_min(1e-300)) + eta * excess, dim=0)
    k = weights.shape[0]
    return (1 - smoothing) * updated + smoothing / k


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
        ``[K]`` float64; ``NaN`` for a domain with no tokens in the batch (see :func:`doremi_update`).
    """
    excess = (proxy_loss.double() - reference_loss.double()).clamp_min(0) * token_mask
    per_row = excess.sum(dim=1)
    tokens_per_row = token_mask.double().sum(dim=1)
    totals = torch.zeros(num_domains, dtype=torch.float64).index_add_(0, domain_index, per_row)
    counts = torch.zeros(num_domains, dtype=torch.float64).index_add_(0, domain_index, tokens_per_row)
    return torch.where(counts > 0, totals / counts.clamp_min(1), torch.full_like(totals, math.nan))


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
    """

    def __init__(self, num_domains: int, eta: float = 1.0, smoothing: float = 1e-3, initial: Tensor | None = None):
        if num_domains < 1:
            raise ConfigError(f"DoReMi needs at least one domain, got {num_domains}")
        self.eta = float(eta)
        self.smoothing = float(smoothing)
        start = torch.full((num_domains,), 1.0 / num_domains, dtype=torch.float64) if initial is None else initial
        self.current = torch.as_tensor(start, dtype=torch.float64) / float(torch.as_tensor(start).sum())
        self.total = torch.zeros(num_domains, dtype=torch.float64)
        self.steps = 0

    def step(self, excess_loss: Tensor) -> Tensor:
        """Update with one step's ``[K]`` excess losses; returns the new current weights."""
        self.current = doremi_update(self.current, excess_loss, self.eta, self.smoothing)
        self.total += self.current
        self.steps += 1
        return self.current

    @property
    def average(self) -> Tensor:
        """``mean_t a_t`` over the steps taken (the current weights before any step)."""
        return self.total / self.steps if self.steps else self.current.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"current": self.current.tolist(), "total": self.total.tolist(), "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if len(state["current"]) != len(self.current):
            raise ConfigError(
                f"DoReMi state holds {len(state['current'])} domain weights but the data has "
                f"{len(self.current)} domains"
            )
        self.current = torch.tensor(state["current"], dtype=torch.float64)
        self.total = torch.tensor(state["total"], dtype=torch.float64)
        self.steps = int(state["steps"])
