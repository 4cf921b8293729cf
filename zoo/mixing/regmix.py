"""RegMix: data mixture as regression (Liu et al., arXiv 2407.01492; repo sail-sg/regmix).

Small proxy models are trained on Dirichlet-sampled mixtures; a regressor maps a mixture to the proxies' target loss;
many simulated mixtures are scored and the top-k predicted ones averaged. Equation -> function (notes
``multimodal_quant_data.md`` §2 "RegMix"):

- proxy mixtures ``w ~ Dir(c * p^T)`` around the token-count prior ``p`` (temperature ``T``, concentration ``c``
  log-uniform in ``[c_min, c_max]``; weights below ``min_weight`` set to 0 and the rest renormalised) [reconstruction
  of the repo's ``synthesize_mixture``] -> :func:`sample_mixtures`, :func:`mixture_prior`
- regressor ``w -> target loss``: LightGBM as in the paper (lr 1e-2, 1000 iterations) -> :class:`LightGBMRegressor`;
  the documented fallback, ridge regression on ``[w, 1]`` (the paper's linear baseline) -> :class:`LinearRegressor`
  -> :func:`make_regressor`
- simulate and average the top-k -> :func:`predict_best_mixture`
- "mixing predictability": rank correlation on held-out proxies -> :func:`spearman`, :func:`holdout_spearman`

Plain torch / numpy; LightGBM only when chosen (``pip install 'paperzoo[mixing]'``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from zoo.errors import ConfigError

log = logging.getLogger("zoo")

REGRESSORS = ("auto", "lightgbm", "linear")


def mixture_prior(token_counts: Sequence[float] | Tensor, temperature: float = 0.5) -> Tensor:
    """``p_k ∝ n_k^T``: the token-count prior with temperature ``T`` (RegMix: 0.5; ``T = 0`` is uniform)."""
    counts = torch.as_tensor(token_counts, dtype=torch.float64)
    if counts.ndim != 1 or len(counts) == 0 or bool((counts <= 0).any()) or not bool(torch.isfinite(counts).all()):
        raise ConfigError(f"token_counts must be positive finite numbers, one per domain, got {counts.tolist()}")
    prior = counts**temperature
    return prior / prior.sum()


def sample_mixtures(
    prior: Tensor,
    num: int,
    *,
    concentration: tuple[float, float] = (0.1, 5.0),
    min_weight: float = 2e-4,
    seed: int = 0,
) -> Tensor:
    """``[num, K]`` mixtures ``w ~ Dir(c * K * prior)``, ``c`` log-uniform in ``concentration`` per sample.

    Entries below ``min_weight`` are set to 0 and the row renormalised (repeated until every positive entry is
    ``>= min_weight``; the largest entry is always kept), so each row sums to 1 and respects the minimum.
    """
    prior = torch.as_tensor(prior, dtype=torch.float64)
    low, high = (float(v) for v in concentration)
    if not 0 < low <= high or num < 1 or not 0 <= min_weight < 1.0 / len(prior):
        raise ConfigError(
            f"sample_mixtures: need num >= 1, 0 < concentration low <= high, 0 <= min_weight < 1/K; got num={num}, "
            f"concentration={concentration}, min_weight={min_weight}, K={len(prior)}"
        )
    rng = np.random.default_rng(seed)
    scales = np.exp(rng.uniform(math.log(low), math.log(high), size=num))
    rows = []
    for scale in scales:
        alpha = np.maximum(scale * len(prior) * prior.numpy(), 1e-6)
        w = rng.dirichlet(alpha)
        while True:
            small = (w < min_weight) & (w > 0)
            if not small.any():
                break
            w[small] = 0.0
            w = w / w.sum()
        rows.append(w)
    return torch.tensor(np.stack(rows), dtype=torch.float64)


class MixtureRegressor(Protocol):
    """``fit(mixtures [n, K], losses [n])`` then ``predict(mixtures [m, K]) -> [m]``."""

    def fit(self, mixtures: Tensor, losses: Tensor) -> MixtureRegressor: ...

    def predict(self, mixtures: Tensor) -> Tensor: ...


class LinearRegressor:
    """Ridge regression of the loss on ``[w, 1]`` (closed form; ``ridge`` on the weights only)."""

    def __init__(self, ridge: float = 1e-4) -> None:
        self.ridge = ridge
        self.coef: Tensor | None = None

    def fit(self, mixtures: Tensor, losses: Tensor) -> LinearRegressor:
        x = torch.as_tensor(mixtures, dtype=torch.float64)
        design = torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64)], dim=1)
        penalty = torch.eye(design.shape[1], dtype=torch.float64) * self.ridge
        penalty[-1, -1] = 0.0
        target = torch.as_tensor(losses, dtype=torch.float64)
        self.coef = torch.linalg.solve(design.T @ design + penalty, design.T @ target)
        return self

    def predict(self, mixtures: Tensor) -> Tensor:
        if self.coef is None:
            raise ConfigError("LinearRegressor.predict before fit")
        x = torch.as_tensor(mixtures, dtype=torch.float64)
        return x @ self.coef[:-1] + self.coef[-1]


class LightGBMRegressor:
    """LightGBM gradient-boosted trees (RegMix's regressor: learning rate 1e-2, 1000 iterations).

    ``min_child_samples`` is lowered from LightGBM's 20 to fit a few dozen proxies [assumed]."""

    def __init__(
        self, learning_rate: float = 1e-2, num_iterations: int = 1000, min_child_samples: int = 2, seed: int = 0
    ) -> None:
        try:
            import lightgbm
        except ImportError as err:
            raise ConfigError(
                "regressor=lightgbm needs LightGBM: pip install 'paperzoo[mixing]' (or choose regressor=linear, the "
                "ridge-regression fallback)"
            ) from err
        self.model = lightgbm.LGBMRegressor(
            learning_rate=learning_rate,
            n_estimators=num_iterations,
            min_child_samples=min_child_samples,
            random_state=seed,
            verbose=-1,
        )

    def fit(self, mixtures: Tensor, losses: Tensor) -> LightGBMRegressor:
        self.model.fit(np.asarray(mixtures, dtype=np.float64), np.asarray(losses, dtype=np.float64))
        return self

    def predict(self, mixtures: Tensor) -> Tensor:
        return torch.as_tensor(self.model.predict(np.asarray(mixtures, dtype=np.float64)), dtype=torch.float64)


def lightgbm_available() -> bool:
    try:
        import lightgbm  # noqa: F401
    except ImportError:
        return False
    return True


def make_regressor(name: str = "auto", seed: int = 0) -> MixtureRegressor:
    """``lightgbm`` (paper), ``linear`` (ridge fallback), or ``auto``: LightGBM when installed, else linear (logged)."""
    if name not in REGRESSORS:
        raise ConfigError(f"regressor must be one of {REGRESSORS}, got {name!r}")
    if name == "auto":
        if lightgbm_available():
            return LightGBMRegressor(seed=seed)
        log.warning(
            "RegMix: LightGBM is not installed; using the linear (ridge) regressor (pip install "
            "'paperzoo[mixing]' for the paper's regressor)"
        )
        return LinearRegressor()
    return LightGBMRegressor(seed=seed) if name == "lightgbm" else LinearRegressor()


def predict_best_mixture(
    regressor: MixtureRegressor,
    prior: Tensor,
    num_simulations: int = 100_000,
    top_k: int = 128,
    *,
    concentration: tuple[float, float] = (0.1, 5.0),
    min_weight: float = 2e-4,
    seed: int = 0,
) -> Tensor:
    """Score ``num_simulations`` mixtures from :func:`sample_mixtures` and average the ``top_k`` with the lowest
    predicted loss (repo notebook defaults: 100k and 128). Returns ``[K]`` weights summing to 1."""
    if top_k < 1 or top_k > num_simulations:
        raise ConfigError(f"need 1 <= top_k <= num_simulations, got top_k={top_k}, num_simulations={num_simulations}")
    candidates = sample_mixtures(prior, num_simulations, concentration=concentration, min_weight=min_weight, seed=seed)
    predicted = regressor.predict(candidates)
    best = torch.topk(-predicted, top_k).indices
    mixture = candidates[best].mean(dim=0)
    return mixture / mixture.sum()


def _ranks(values: Tensor) -> Tensor:
    """Average ranks (ties share the mean rank)."""
    v = torch.as_tensor(values, dtype=torch.float64)
    order = torch.argsort(v)
    ranks = torch.empty_like(v)
    ranks[order] = torch.arange(len(v), dtype=torch.float64)
    for value in torch.unique(v):
        tied = v == value
        if int(tied.sum()) > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation of two ``[n]`` vectors (``nan`` when either is constant or ``n < 2``)."""
    ra, rb = _ranks(a), _ranks(b)
    if len(ra) < 2 or float(ra.std()) == 0 or float(rb.std()) == 0:
        return math.nan
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def holdout_spearman(
    mixtures: Tensor,
    losses: Tensor,
    regressor: str = "auto",
    num_splits: int = 10,
    holdout: float = 0.25,
    seed: int = 0,
) -> list[float]:
    """RegMix's "mixing predictability" probe: fit on a random part of the proxies, Spearman rho on the held-out rest,
    for ``num_splits`` random splits (the paper: 10). Needs at least 4 proxies."""
    n = len(mixtures)
    held = max(2, round(n * holdout))
    if n - held < 2:
        raise ConfigError(f"holdout_spearman needs at least 4 proxies, got {n}")
    rng = np.random.default_rng(seed)
    values = []
    for split in range(num_splits):
        order = torch.as_tensor(rng.permutation(n))
        test, train = order[:held], order[held:]
        model = make_regressor(regressor, seed=seed + split).fit(mixtures[train], losses[train])
        values.append(spearman(model.predict(mixtures[test]), losses[test]))
    return values
