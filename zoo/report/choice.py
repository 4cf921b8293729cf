"""Choosing a setting for a seed without that seed's numbers (leave one seed out).

A demo that tunes a knob (a learning rate, a penalty weight) per arm runs every grid point at every seed; the page
reports, for each seed, the point that scored best on the *other* seeds (other data, prompts and draws), so no
reported number took part in choosing its own setting.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping


def best_mean(scores: Mapping[str, Mapping[Hashable, float]], *, higher: bool = True) -> str | None:
    """The grid point with the best mean score over its seeds.

    Args:
        scores: ``{grid point: {seed: score}}``; NaN scores are left out. Ties go to the first point in the
            mapping's order.
        higher: whether a higher score is better (accuracy) or a lower one (a loss).

    Returns:
        The point, or ``None`` when no point has a score.
    """
    means: dict[str, float] = {}
    for point, by_seed in scores.items():
        finite = [float(v) for v in by_seed.values() if not math.isnan(float(v))]
        if finite:
            means[point] = sum(finite) / len(finite)
    if not means:
        return None
    best = (max if higher else min)(means.values())
    return next(p for p, m in means.items() if m == best)


def best_on_other_seeds(
    scores: Mapping[str, Mapping[Hashable, float]], seed: Hashable, *, higher: bool = True
) -> str | None:
    """The grid point with the best mean score over the seeds other than ``seed`` (:func:`best_mean` without that
    seed's scores); ``None`` when no other seed has a score (a single seed: nothing to choose on without it; the
    caller says what it does then)."""
    return best_mean(
        {p: {s: v for s, v in by_seed.items() if s != seed} for p, by_seed in scores.items()}, higher=higher
    )


__all__ = ["best_mean", "best_on_other_seeds"]
