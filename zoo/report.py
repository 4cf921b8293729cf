"""Turn run or multirun directories into a markdown table and a PNG plot.

``python -m zoo.report <run or multirun dir> [--metrics val/exact_match,train/loss] [--out docs/results/x]``

Every run directory with a ``csv/metrics.csv`` (Lightning's CSV logger) becomes one row; the row is labelled
by the run's Hydra overrides (``.hydra/overrides.yaml``) so the arms of a multirun are told apart. The table
holds the last logged value of each metric; the plot draws each metric over ``step`` for every run.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path
from typing import Any

import yaml


def find_runs(root: Path) -> list[Path]:
    """Run directories (holding ``csv/metrics.csv``) under ``root``, sorted."""
    return sorted({p.parent.parent for p in root.rglob("csv/metrics.csv")})


def read_metrics(run: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` from a run's CSV log (empty cells skipped)."""
    series: dict[str, list[tuple[int, float]]] = {}
    with (run / "csv" / "metrics.csv").open() as handle:
        for row in csv.DictReader(handle):
            step = int(float(row.get("step") or 0))
            for key, value in row.items():
                if key in ("step", "epoch") or value in (None, ""):
                    continue
                series.setdefault(key, []).append((step, float(value)))
    return series


def run_label(run: Path) -> str:
    """The run's overrides joined by spaces (or its directory name)."""
    overrides = run / ".hydra" / "overrides.yaml"
    if overrides.is_file():
        items = yaml.safe_load(overrides.read_text()) or []
        items = [o for o in items if not o.startswith(("paths.", "hydra.", "run_id"))]
        if items:
            return " ".join(items)
    return run.name


def summarize(root: Path, metrics: list[str] | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and rows (run label + last value of each metric) of every run under ``root``."""
    rows, names = [], set()
    for run in find_runs(root):
        series = read_metrics(run)
        wanted = metrics or sorted(k for k in series if not k.startswith("lr-"))
        names.update(wanted)
        rows.append({"run": run_label(run), **{k: series[k][-1][1] for k in wanted if series.get(k)}})
    columns = metrics or sorted(names)
    return columns, rows


def markdown_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    """A markdown table with one row per run."""

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return "nan" if math.isnan(value) else f"{value:.4g}"
        return "" if value is None else str(value)

    lines = ["| run | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += ["| " + " | ".join([row["run"], *(fmt(row.get(c)) for c in columns)]) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def plot(root: Path, metrics: list[str], out_png: Path) -> Path:
    """One panel per metric, one line per run, over ``step``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = find_runs(root)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for run in runs:
            points = read_metrics(run).get(metric, [])
            if points:
                ax.plot(*zip(*points), marker="o" if len(points) < 20 else None, ms=3, label=run_label(run)[:40])
        ax.set_title(metric)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def report(root: str | Path, metrics: list[str] | None = None, out: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``<out>.md`` and ``<out>.png`` (default ``<root>/report``); returns both paths."""
    root = Path(root)
    columns, rows = summarize(root, metrics)
    if not rows:
        raise SystemExit(f"no runs with csv/metrics.csv under {root}")
    base = Path(out) if out else root / "report"
    base.parent.mkdir(parents=True, exist_ok=True)
    md, png = base.with_suffix(".md"), base.with_suffix(".png")
    md.write_text(f"# Report of {root}\n\n" + markdown_table(columns, rows) + f"\n![metrics]({png.name})\n")
    plot(root, [c for c in columns if c != "run"][:4], png)
    return md, png


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zoo.report", description=__doc__.splitlines()[0])
    parser.add_argument("root", help="a run directory or a multirun directory")
    parser.add_argument("--metrics", default=None, help="comma-separated metric names (default: all)")
    parser.add_argument("--out", default=None, help="output path without suffix (default: <root>/report)")
    args = parser.parse_args(argv)
    metrics = args.metrics.split(",") if args.metrics else None
    md, png = report(args.root, metrics, args.out)
    print(f"wrote {md} and {png}")


if __name__ == "__main__":
    main()
