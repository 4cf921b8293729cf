"""Choosing a setting for a seed without that seed's numbers (leave one seed out).

A demo that tunes a knob (a learning rate, a penalty weight) per arm runs every grid point at every seed; the page
reports, for each seed, the point that scored best on the *other* seeds (other data, prompts and draws), so no
reported number took part in choosing its own setting. :func:`group_runs` sorts a sweep's runs into arm -> grid point
-> seed, :func:`choose_per_seed` makes one arm's choices (:class:`GridChoice`), on :func:`best_on_other_seeds`.
A grid may be run shorter than the reported runs: :func:`split_by_length` separates the grid (the shortest runs) from
runs that retrain a chosen point for longer, and :meth:`GridChoice.retrain` reports those in the grid's place when
they cover every seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar


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


class SeededRun(Protocol):
    """What choosing needs of a run: its seed (``None`` when the run has none)."""

    seed: int | None


class ConfiguredRun(SeededRun, Protocol):
    """A run whose resolved config can be read by dotted key (:class:`zoo.report.runs.Run`)."""

    def get(self, dotted: str, default: Any = None) -> Any: ...


# the learning rate a run trained with (its resolved config)
RATE_KEY = "module.optimizer.lr"


def lr_order(runs: Mapping[str, Mapping[Any, ConfiguredRun]], key: str = RATE_KEY) -> list[str]:
    """An arm's grid points (``{point: {seed: run}}``), lowest learning rate first: the rate each point's runs
    trained with (``key`` of their resolved config), so the order holds whatever the points are called. Points
    with the same rate keep their order; a point whose runs name no rate comes last."""

    def rate(point: str) -> float:
        values = [r.get(key) for r in runs[point].values()]
        return min((float(v) for v in values if v is not None), default=math.inf)

    return sorted(runs, key=rate)


RunT = TypeVar("RunT", bound=SeededRun)


def group_runs(
    runs: Iterable[RunT], *, arm_of: Callable[[RunT], str], point_of: Callable[[RunT], str]
) -> dict[str, dict[str, dict[int | None, RunT]]]:
    """``{arm: {grid point: {seed: run}}}``, arms and points in the order of their first run."""
    grouped: dict[str, dict[str, dict[int | None, RunT]]] = {}
    for run in runs:
        grouped.setdefault(arm_of(run), {}).setdefault(point_of(run), {})[run.seed] = run
    return grouped


@dataclass(frozen=True)
class GridChoice(Generic[RunT]):
    """One arm's grid of runs and the point reported for each seed (:func:`choose_per_seed`).

    Attributes:
        runs: ``{grid point: {seed: run}}``, points in grid order.
        scores: ``{grid point: {seed: score}}`` of every run.
        chosen: ``{seed: grid point}``, seeds in ascending order; a seed without a run at its chosen point is left
            out (no run at another point is reported in its place).
        held_out: every point was chosen without the seed it is reported for (``False`` when a seed had no other
            seed to be chosen on and took the grid's first point).
        retrained: ``{seed: run}`` that retrain each seed's chosen point for longer (:meth:`retrain`), reported in
            place of the grid's runs; empty when the grid's own runs are reported.
        retrained_length: the training length of those runs (``None`` without).
    """

    runs: dict[str, dict[int | None, RunT]]
    scores: dict[str, dict[int | None, float]]
    chosen: dict[int | None, str]
    held_out: bool
    retrained: dict[int | None, RunT] = field(default_factory=dict)
    retrained_length: int | None = None

    @property
    def reported(self) -> dict[int | None, RunT]:
        """``{seed: the run at its chosen point}`` (the retrained run where there is one)."""
        if self.retrained:
            return dict(self.retrained)
        return {seed: self.runs[point][seed] for seed, point in self.chosen.items()}

    def retrain_lengths(
        self, longer: Iterable[RunT], *, point_of: Callable[[RunT], str], length_of: Callable[[RunT], int | None]
    ) -> dict[int, dict[int | None, RunT]]:
        """``{length: {seed: run}}`` of the lengths at which ``longer`` runs retrain *every* chosen point (same grid
        point, same seed), longest first; a length that misses a seed is left out (not every seed the same effort).
        """
        cells: dict[int, dict[tuple[str, int | None], RunT]] = {}
        for run in longer:
            n = length_of(run)
            if n is not None:
                cells.setdefault(n, {})[(point_of(run), run.seed)] = run
        wanted = [(point, seed) for seed, point in self.chosen.items()]
        complete = {}
        for n in sorted(cells, reverse=True):
            if wanted and all(k in cells[n] for k in wanted):
                complete[n] = {seed: cells[n][(point, seed)] for point, seed in wanted}
        return complete

    def retrain(
        self,
        longer: Iterable[RunT],
        *,
        point_of: Callable[[RunT], str],
        length_of: Callable[[RunT], int | None],
        length: int | None = None,
    ) -> GridChoice[RunT]:
        """This choice with its chosen points' longer runs reported (:meth:`retrain_lengths`): at ``length``, or the
        longest complete one; unchanged when there is none (or ``length`` is not complete)."""
        complete = self.retrain_lengths(longer, point_of=point_of, length_of=length_of)
        n = length if length is not None else next(iter(complete), None)
        if n not in complete:
            return self
        return replace(self, retrained=complete[n], retrained_length=n)

    def on_edge(self) -> dict[int | None, str]:
        """``{seed: point}`` of the seeds whose chosen point is the first or the last of a grid of three or more
        points (in grid order, e.g. the lowest or highest learning rate: the best point may lie beyond the grid);
        with two points every choice is an edge and none is returned."""
        points = list(self.runs)
        if len(points) < 3:
            return {}
        return {seed: point for seed, point in self.chosen.items() if point in (points[0], points[-1])}

    def other_seed_means(self, seed: int | None) -> dict[str, float]:
        """``{grid point: mean score over the seeds other than seed}`` (the numbers ``seed``'s choice compared;
        points without another seed's finite score left out)."""
        means = {}
        for point, by_seed in self.scores.items():
            finite = [v for s, v in by_seed.items() if s != seed and not math.isnan(v)]
            if finite:
                means[point] = sum(finite) / len(finite)
        return means


def split_by_length(
    runs: Iterable[RunT], length_of: Callable[[RunT], int | None]
) -> tuple[list[RunT], list[RunT], int | None]:
    """``(grid, longer, grid length)``: the runs with the fewest training steps (``length_of``; runs without a length
    count as the grid's) and the runs trained longer."""
    runs = list(runs)
    lengths = sorted({n for n in map(length_of, runs) if n is not None})
    shortest = lengths[0] if lengths else None
    grid = [r for r in runs if length_of(r) in (None, shortest)]
    return grid, [r for r in runs if length_of(r) not in (None, shortest)], shortest


def choose_per_seed(
    runs: Mapping[str, Mapping[int | None, RunT]],
    score: Callable[[RunT], float],
    *,
    order: Sequence[str] = (),
    higher: bool = True,
    tuned: bool = True,
) -> GridChoice[RunT]:
    """Each seed's grid point of one arm, chosen on the other seeds (:func:`best_on_other_seeds`).

    Args:
        runs: ``{grid point: {seed: run}}`` of the arm.
        score: the selection value of a run (e.g. its last validation accuracy).
        order: the grid order (the tie-break: first wins); points not named come after, in ``runs``' order.
        higher: whether a higher score is better.
        tuned: ``False`` for an arm whose grid points are one setting (an untrained reference): each seed's first
            point, nothing chosen.

    Returns:
        The arm's :class:`GridChoice`. A single point is every seed's choice; a seed with no other seed to be chosen
        on takes the first point, and the choice is flagged (``held_out`` false).
    """
    points = [p for p in order if p in runs] + [p for p in runs if p not in order]
    grid = {p: dict(runs[p]) for p in points}
    scores = {p: {s: float(score(r)) for s, r in by_seed.items()} for p, by_seed in grid.items()}
    seeds = sorted({s for by_seed in grid.values() for s in by_seed}, key=lambda s: -1 if s is None else s)
    chosen: dict[int | None, str] = {}
    held_out = True
    for seed in seeds:
        if not tuned or len(points) == 1:
            point = next(p for p in points if seed in grid[p])
        else:
            best = best_on_other_seeds(scores, seed, higher=higher)
            held_out &= best is not None
            point = points[0] if best is None else best
        if seed in grid[point]:
            chosen[seed] = point
    return GridChoice(grid, scores, chosen, held_out)


__all__ = [
    "RATE_KEY",
    "ConfiguredRun",
    "GridChoice",
    "SeededRun",
    "lr_order",
    "split_by_length",
    "best_mean",
    "best_on_other_seeds",
    "choose_per_seed",
    "group_runs",
]
