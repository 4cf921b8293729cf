"""Small exact statistics used by agents and reports (no SciPy dependency)."""

from __future__ import annotations

import math
from collections.abc import Sequence

# two-sided 95% Student t quantiles t_{0.975, df} for df = 1..30 (beyond: the normal 1.96)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def binom_logpmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``."""
    return min(1.0, sum(math.exp(binom_logpmf(i, n, p)) for i in range(0, k + 1)))


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)``."""
    return min(1.0, sum(math.exp(binom_logpmf(i, n, p)) for i in range(k, n + 1)))


def binom_test(k: int, n: int, p: float) -> float:
    """Exact two-sided binomial test p-value (sum of outcomes no more likely than ``k``)."""
    if n == 0:
        return 1.0
    observed = binom_logpmf(k, n, p)
    return min(1.0, sum(math.exp(lp) for i in range(n + 1) if (lp := binom_logpmf(i, n, p)) <= observed + 1e-9))


def t_quantile_975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% Student-t confidence interval (0 for fewer than two values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile_975(n - 1) * sd / math.sqrt(n)
