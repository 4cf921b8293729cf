"""Statistics over seeds and trials, in one place, from SciPy (``scipy.stats``).

Every interval, test and tail probability the zoo reports comes from here: the demo pages (means over seeds with
Student-t intervals, Welch differences of two arms, paired differences), the episode family's score intervals and
the UltraHorizon solvers' binomial tests.

- :func:`stat` -- mean, sample sd and the two-sided Student-t interval ``mean ± t_{(1+c)/2, n-1} · sd / √n``.
- :func:`compare` -- ``mean(a) − mean(b)`` with the Welch interval (Welch–Satterthwaite degrees of freedom).
- :func:`binom_cdf`, :func:`binom_sf`, :func:`binom_test` -- binomial tails and the exact two-sided test.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scipy import stats as _scipy_stats

CONFIDENCE = 0.95


def t_critical(df: float, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student-t critical value ``t`` with ``P(|T| <= t) = confidence`` (4.303 for df = 2 at 95%)."""
    if not df > 0 or not 0.0 < confidence < 1.0:
        raise ValueError(f"t_critical needs df > 0 and 0 < confidence < 1, got df={df}, confidence={confidence}")
    return float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, df))


@dataclass(frozen=True)
class Stat:
    """Mean over seeds with its spread.

    Attributes:
        mean: sample mean; ``sd``: sample standard deviation (``n - 1``); ``n``: number of values;
        lo, hi: the ``confidence`` interval of the mean (Student t, ``n - 1`` degrees of freedom; ``nan`` for n < 2).
    """

    mean: float
    sd: float
    n: int
    lo: float
    hi: float
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float:
        """Half the width of the interval (``nan`` for n < 2)."""
        return (self.hi - self.lo) / 2.0

    def __str__(self) -> str:
        return fmt_stat(self)


def finite(values: Iterable[float | None]) -> list[float]:
    """The values as floats, ``None`` and ``nan`` dropped."""
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def stat(values: Iterable[float | None], confidence: float = CONFIDENCE) -> Stat:
    """Mean, sd and Student-t confidence interval of ``values`` (``nan``/``None`` are dropped)."""
    xs = finite(values)
    n = len(xs)
    if n == 0:
        return Stat(math.nan, math.nan, 0, math.nan, math.nan, confidence)
    mean = math.fsum(xs) / n
    if n == 1:
        return Stat(mean, math.nan, 1, math.nan, math.nan, confidence)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_critical(n - 1, confidence) * sd / math.sqrt(n)
    return Stat(mean, sd, n, mean - half, mean + half, confidence)


@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)`` with its Welch confidence interval (``nan`` when either side has fewer than 2 values).

    ``shown`` is true when the interval excludes 0: a difference the seeds resolve.
    """

    delta: float
    lo: float
    hi: float
    df: float
    a: Stat
    b: Stat

    @property
    def shown(self) -> bool:
        return not math.isnan(self.lo) and (self.lo > 0 or self.hi < 0)


def compare(a: Iterable[float], b: Iterable[float], confidence: float = CONFIDENCE) -> Difference:
    """Difference of the means of ``a`` and ``b`` with a Welch (unequal variances) confidence interval."""
    sa, sb = stat(a, confidence), stat(b, confidence)
    delta = sa.mean - sb.mean
    if sa.n < 2 or sb.n < 2:
        return Difference(delta, math.nan, math.nan, math.nan, sa, sb)
    va, vb = sa.sd**2 / sa.n, sb.sd**2 / sb.n
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Difference(delta, delta, delta, math.inf, sa, sb)
    df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    half = t_critical(df, confidence) * se
    return Difference(delta, delta - half, delta + half, df, sa, sb)


def paired(a: dict[object, float], b: dict[object, float], confidence: float = CONFIDENCE) -> Stat:
    """Mean and interval of the per-unit differences ``a[k] - b[k]`` over the units both sides have."""
    return stat((a[k] - b[k] for k in a if k in b), confidence)


def fmt_stat(s: Stat, digits: int = 3, ci: bool = True) -> str:
    """``"0.469 ± 0.031 [0.392, 0.546]"``: mean ± sd and (``ci``) the confidence interval; one value: its mean."""
    if s.n == 0:
        return "n/a"
    if s.n == 1:
        return f"{s.mean:.{digits}f}"
    text = f"{s.mean:.{digits}f} ± {s.sd:.{digits}f}"
    return text + f" [{s.lo:.{digits}f}, {s.hi:.{digits}f}]" if ci else text


def mean_ci95(values: Iterable[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% Student-t interval (0 for one value, ``nan`` for none)."""
    s = stat(values, 0.95)
    if s.n < 2:
        return s.mean, (math.nan if s.n == 0 else 0.0)
    return s.mean, s.half_width


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``."""
    return float(_scipy_stats.binom.cdf(k, n, p))


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``."""
    return float(_scipy_stats.binom.sf(k - 1, n, p))


def binom_test(k: int, n: int, p: float) -> float:
    """Exact two-sided binomial test p-value (the outcomes no more likely than ``k``); 1 for ``n = 0``."""
    if n == 0:
        return 1.0
    return float(_scipy_stats.binomtest(k, n, p).pvalue)


__all__ = [
    "CONFIDENCE",
    "Difference",
    "Stat",
    "binom_cdf",
    "binom_sf",
    "binom_test",
    "compare",
    "finite",
    "fmt_stat",
    "mean_ci95",
    "paired",
    "stat",
    "t_critical",
]
