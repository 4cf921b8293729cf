"""RegMix: data mixture as regression (Liu et al., arXiv 2407.01492; repo sail-sg/regmix).

Small proxy models are trained on Dirichlet-sampled mixtures; a regressor maps a mixture to the proxies' target loss;
many simulated mixtures are scored and the top-k predicted ones averaged. Equation -> function (notes
``multimodal_quant_data.md`` §2 "RegMix"):

- proxy mixtures ``w ~ Dir(c * p^T)`` around the token-count prior ``p`` (temperature ``T``; strength ``c`` drawn from
  15 log-spaced values in ``[c_min, c_max]``), rejected when a domain would be used beyond ``max_usage`` epochs
  (``w_k > min(15 p_k, 1)``), weights below ``min_weight`` set to 0, renormalised, rounded to multiples of
  ``min_weight``, de-duplicated, ``num`` drawn from ``100 num`` candidates (the repo's
  ``mixture_config/synthesize_mixture.py``, ``generate_weights_dirichlet``) -> :func:`sample_mixtures`,
  :func:`mixture_prior`
- regressor ``w -> target loss``: LightGBM as in the repo notebook (lr 1e-2, 1000 iterations, LightGBM's other
  defaults, early stopping after 3 rounds on held-out proxies) -> :class:`LightGBMRegressor`; the documented
  fallback, ridge regression on ``[w, 1]`` (the paper's linear baseline) -> :class:`LinearRegressor`
  -> :func:`make_regressor`, :func:`fit_regressor`
- simulate ``Dir(p)`` mixtures (the notebook: ``np.random.dirichlet(prior_dist * 1, 100000)``, ``p`` the token
  shares) and average the top-k -> :func:`predict_best_mixture`
- "mixing predictability": rank correlation on held-out proxies -> :func:`spearman`, :func:`holdout_spearman`

Plain torch / numpy; LightGBM only when chosen (``pip install 'paperzoo[mixing]'``).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol

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


def usage_bound(token_shares: Sequence[float] | Tensor, max_usage: float | None = 15.0) -> Tensor:
    """``[K]`` largest weight of each domain, ``min(max_usage * s_k, 1)`` with ``s_k`` its share of the available
    tokens: no domain is sampled beyond ``max_usage`` epochs when the run draws as many tokens as there are (the
    repo's ``MAXIMUM_USAGE = 15``). ``max_usage=None``: no bound (all ones)."""
    shares = torch.as_tensor(token_shares, dtype=torch.float64)
    if max_usage is None:
        return torch.ones_like(shares)
    if not max_usage > 0:
        raise ConfigError(f"max_usage must be > 0 epochs (or null: no bound), got {max_usage}")
    return (shares / shares.sum() * float(max_usage)).clamp(max=1.0)


def sample_mixtures(
    prior: Tensor,
    num: int,
    *,
    concentration: tuple[float, float] = (0.1, 5.0),
    min_weight: float = 2e-4,
    seed: int = 0,
    bound: Tensor | None = None,
    num_strengths: int = 15,
    sample_multiplier: int = 100,
) -> Tensor:
    """``[num, K]`` distinct proxy mixtures, as the repo's ``generate_weights_dirichlet``:

    1. ``num * sample_multiplier`` candidates ``w ~ Dir(c * prior)``, ``c`` drawn uniformly from ``num_strengths``
       log-spaced values in ``concentration`` (``np.logspace(log10 0.1, log10 5, 15)``);
    2. a candidate with some ``w_k > bound_k`` is rejected (:func:`usage_bound`; ``None``: no bound);
    3. entries below ``min_weight`` are set to 0, the row renormalised and rounded to multiples of ``min_weight``
       (``np.round(w / m) * m``; rows then sum to 1 within ``K * min_weight / 2``);
    4. duplicates are dropped and ``num`` rows drawn without replacement (in the order drawn).

    Raises:
        ConfigError: bad settings, or fewer than ``num`` distinct candidates survive (loosen the bound, lower
            ``min_weight`` or raise ``sample_multiplier``).
    """
    prior = torch.as_tensor(prior, dtype=torch.float64)
    low, high = (float(v) for v in concentration)
    if (
        not 0 < low <= high
        or num < 1
        or not 0 <= min_weight < 1.0 / len(prior)
        or num_strengths < 1
        or sample_multiplier < 1
    ):
        raise ConfigError(
            f"sample_mixtures: need num >= 1, 0 < concentration low <= high, 0 <= min_weight < 1/K, "
            f"num_strengths >= 1, sample_multiplier >= 1; got num={num}, concentration={concentration}, "
            f"min_weight={min_weight}, K={len(prior)}, num_strengths={num_strengths}, "
            f"sample_multiplier={sample_multiplier}"
        )
    upper = np.ones(len(prior)) if bound is None else np.asarray(torch.as_tensor(bound, dtype=torch.float64))
    rng = np.random.default_rng(seed)
    strengths = np.logspace(math.log10(low), math.log10(high), num_strengths)
    total = num * sample_multiplier
    w = np.stack([rng.dirichlet(np.maximum(c * prior.numpy(), 1e-6)) for c in rng.choice(strengths, size=total)])
    w = w[(w <= upper[None]).all(axis=1)]
    if min_weight > 0:
        w = np.where(w < min_weight, 0.0, w)
        w = w / w.sum(axis=1, keepdims=True)
        w = np.round(w / min_weight) * min_weight
    w = w[w.sum(axis=1) > 0]
    _, first = np.unique(np.round(w, 12), axis=0, return_index=True)
    distinct = w[np.sort(first)]
    if len(distinct) < num:
        raise ConfigError(
            f"sample_mixtures: only {len(distinct)} distinct mixtures within the usage bound out of {total} "
            f"candidates, {num} needed (raise max_usage or sample_multiplier, or lower min_weight)"
        )
    return torch.tensor(distinct[np.sort(rng.choice(len(distinct), num, replace=False))], dtype=torch.float64)


class MixtureRegressor(Protocol):
    """``fit(mixtures [n, K], losses [n], eval_set=None)`` then ``predict(mixtures [m, K]) -> [m]``; ``eval_set``
    (held-out ``(mixtures, losses)``) is used for early stopping by the regressors that stop early."""

    def fit(
        self, mixtures: Tensor, losses: Tensor, eval_set: tuple[Tensor, Tensor] | None = None
    ) -> MixtureRegressor: ...

    def predict(self, mixtures: Tensor) -> Tensor: ...


class LinearRegressor:
    """Ridge regression of the loss on ``[w, 1]`` (closed form; ``ridge`` on the weights only)."""

    def __init__(self, ridge: float = 1e-4) -> None:
        self.ridge = ridge
        self.coef: Tensor | None = None

    def fit(self, mixtures: Tensor, losses: Tensor, eval_set: tuple[Tensor, Tensor] | None = None) -> LinearRegressor:
        """Closed-form fit (``eval_set`` is not used: nothing to stop early)."""
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
    """LightGBM gradient-boosted trees, as the repo notebook (``regression_fitting/regression.ipynb``): learning rate
    1e-2, 1000 iterations, LightGBM's other defaults, early stopping after ``early_stopping_rounds`` (3) rounds without
    improvement on the held-out proxies (``lgb.early_stopping(stopping_rounds=3)`` on ``eval_set``) of either of the
    notebook's metrics (``'metric': ['l1', 'l2']``: LightGBM stops when any of them stalls). On the repo's own 1M
    proxies this gives the notebook's boosting rounds and predictions (``tests/mixing/test_regmix_official_data.py``).

    ``min_child_samples``: LightGBM's default 20 (the notebook's); a few dozen proxies leave no split at that value,
    so toy configs lower it (``regressor_options``)."""

    def __init__(
        self,
        learning_rate: float = 1e-2,
        num_iterations: int = 1000,
        min_child_samples: int = 20,
        early_stopping_rounds: int | None = 3,
        seed: int = 0,
        metric: Sequence[str] = ("l1", "l2"),
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
            metric=list(metric),
            verbose=-1,
        )
        self.early_stopping_rounds = early_stopping_rounds

    def fit(self, mixtures: Tensor, losses: Tensor, eval_set: tuple[Tensor, Tensor] | None = None) -> LightGBMRegressor:
        """Fit; with ``eval_set`` and ``early_stopping_rounds``, stop when its l2 loss stops improving."""
        import lightgbm

        x, y = np.asarray(mixtures, dtype=np.float64), np.asarray(losses, dtype=np.float64)
        if eval_set is None or self.early_stopping_rounds is None:
            self.model.fit(x, y)
            return self
        held = (np.asarray(eval_set[0], dtype=np.float64), np.asarray(eval_set[1], dtype=np.float64))
        stop = lightgbm.early_stopping(stopping_rounds=self.early_stopping_rounds, verbose=False)
        if "eval_X" in inspect.signature(self.model.fit).parameters:  # LightGBM >= 4.6 (eval_set deprecated)
            self.model.fit(x, y, eval_X=(held[0],), eval_y=(held[1],), eval_metric="l2", callbacks=[stop])
        else:
            self.model.fit(x, y, eval_set=[held], eval_metric="l2", callbacks=[stop])
        return self

    @property
    def num_trees(self) -> int:
        """Boosting rounds kept (the best iteration after early stopping)."""
        best = self.model.best_iteration_
        return int(best) if best else int(self.model.n_estimators)

    def predict(self, mixtures: Tensor) -> Tensor:
        return torch.as_tensor(self.model.predict(np.asarray(mixtures, dtype=np.float64)), dtype=torch.float64)


def lightgbm_available() -> bool:
    try:
        import lightgbm  # noqa: F401
    except ImportError:
        return False
    return True


def make_regressor(name: str = "auto", seed: int = 0, **options: Any) -> MixtureRegressor:
    """``lightgbm`` (paper), ``linear`` (ridge fallback), or ``auto``: LightGBM when installed, else linear (logged).
    ``options``: keyword arguments of the LightGBM regressor (e.g. ``min_child_samples``; ignored by ``linear``)."""
    if name not in REGRESSORS:
        raise ConfigError(f"regressor must be one of {REGRESSORS}, got {name!r}")
    if name == "auto":
        if lightgbm_available():
            return LightGBMRegressor(seed=seed, **options)
        log.warning(
            "RegMix: LightGBM is not installed; using the linear (ridge) regressor (pip install "
            "'paperzoo[mixing]' for the paper's regressor)"
        )
        return LinearRegressor()
    return LightGBMRegressor(seed=seed, **options) if name == "lightgbm" else LinearRegressor()


def fit_regressor(
    name: str, mixtures: Tensor, losses: Tensor, seed: int = 0, holdout: float = 0.25, **options: Any
) -> MixtureRegressor:
    """The final regressor of a RegMix run. LightGBM is early-stopped on a random ``holdout`` share of the proxies (the
    notebook stops on its held-out proxies) and fit on the rest; the linear regressor is fit on all of them."""
    model = make_regressor(name, seed=seed, **options)
    n = len(mixtures)
    if not isinstance(model, LightGBMRegressor) or model.early_stopping_rounds is None or n < 4:
        return model.fit(mixtures, losses)
    order = torch.as_tensor(np.random.default_rng(seed).permutation(n))
    held = max(1, round(n * holdout))
    test, train = order[:held], order[held:]
    return model.fit(mixtures[train], losses[train], eval_set=(mixtures[test], losses[test]))


def predict_best_mixture(
    regressor: MixtureRegressor,
    prior: Tensor,
    num_simulations: int = 100_000,
    top_k: int = 128,
    *,
    seed: int = 0,
) -> Tensor:
    """Score ``num_simulations`` mixtures ``w ~ Dir(prior)`` and average the ``top_k`` with the lowest predicted loss,
    as the repo notebook (``np.random.dirichlet(prior_dist * 1, 100000)``, top 128; ``prior_dist`` the domains'
    token shares, no temperature, bound or rounding). Returns ``[K]`` weights summing to 1."""
    if top_k < 1 or top_k > num_simulations:
        raise ConfigError(f"need 1 <= top_k <= num_simulations, got top_k={top_k}, num_simulations={num_simulations}")
    alpha = np.asarray(torch.as_tensor(prior, dtype=torch.float64))
    if alpha.ndim != 1 or not bool((alpha > 0).all()):
        raise ConfigError(f"predict_best_mixture: prior must be positive, one per domain, got {alpha.tolist()}")
    candidates = torch.as_tensor(np.random.default_rng(seed).dirichlet(alpha, num_simulations), dtype=torch.float64)
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
    **options: Any,
) -> list[float]:
    """RegMix's "mixing predictability" probe: fit on a random part of the proxies, Spearman rho on the held-out rest,
    for ``num_splits`` random splits (the paper: 10). LightGBM early-stops on the held-out part, as the notebook does
    on the proxies it scores. ``options``: the LightGBM regressor's. Needs at least 4 proxies."""
    n = len(mixtures)
    held = max(2, round(n * holdout))
    if n - held < 2:
        raise ConfigError(f"holdout_spearman needs at least 4 proxies, got {n}")
    rng = np.random.default_rng(seed)
    values = []
    for split in range(num_splits):
        order = torch.as_tensor(rng.permutation(n))
        test, train = order[:held], order[held:]
        model = make_regressor(regressor, seed=seed + split, **options)
        model.fit(mixtures[train], losses[train], eval_set=(mixtures[test], losses[test]))
        values.append(spearman(model.predict(mixtures[test]), losses[test]))
    return values
