"""Plots of runs: matplotlib loaded on first use (the ``plots`` extra), one legend rule, curves with confidence
bands over seeds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.report.runs import Run, find_runs, read_metrics, run_label
from zoo.stats import CONFIDENCE, stat


def plot(root: Path, metrics: list[str], out_png: Path) -> Path:
    """One panel per metric, one line per run, over ``step``."""
    plt = pyplot()
    runs = find_runs(root)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for run in runs:
            points = read_metrics(run).get(metric, [])
            if points:
                ax.plot(*zip(*points), marker="o" if len(points) < 20 else None, ms=3, label=run_label(run)[:40])
        ax.set_title(metric)
        ax.set_xlabel("step")
    for ax in axes[0]:
        legend(ax, fontsize=7)
    return save_figure(fig, out_png)


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend(ax: Any, **kwargs: Any) -> None:
    """``ax.legend(**kwargs)`` when the panel has labelled artists; a panel with nothing drawn says "no data" instead
    (a curve a quick-scale run does not produce), with no empty legend and no matplotlib warning."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)
    elif not ax.has_data():
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Save ``fig`` (tight layout) to ``path`` and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


@dataclass(frozen=True)
class Curve:
    """Mean over runs of a metric at the steps every run logged, with its confidence band."""

    steps: list[int]
    mean: list[float]
    lo: list[float]
    hi: list[float]
    n: int


def curve(runs: Sequence[Run], metric: str, confidence: float = CONFIDENCE) -> Curve:
    """The metric over ``step`` averaged over ``runs`` (steps logged by every run; last value per step)."""
    per_run = [dict(r.series(metric)) for r in runs]
    per_run = [p for p in per_run if p]
    if not per_run:
        return Curve([], [], [], [], 0)
    steps = sorted(set.intersection(*(set(p) for p in per_run)))
    stats = [stat([p[s] for p in per_run], confidence) for s in steps]
    return Curve(steps, [s.mean for s in stats], [s.lo for s in stats], [s.hi for s in stats], len(per_run))


def plot_curves(ax: Any, curves: dict[str, Curve], smooth: int = 1) -> None:
    """Draw each curve's mean and its confidence band (no band for one run) on ``ax``; ``smooth``: moving
    average window over logged points (1 = none)."""

    def moving(xs: list[float]) -> list[float]:
        windows = (xs[max(0, i - smooth + 1) : i + 1] for i in range(len(xs)))
        return [sum(w) / len(w) for w in windows]

    for label, c in curves.items():
        if not c.steps:
            continue
        (line,) = ax.plot(c.steps, moving(c.mean), label=f"{label} (n={c.n})")
        if c.n > 1:
            ax.fill_between(c.steps, moving(c.lo), moving(c.hi), color=line.get_color(), alpha=0.2, linewidth=0)
