"""Reports built from run directories only: the generic table/plot of any run or multirun, and the demo pages.

Generic: ``python -m zoo.report <run or multirun dir> [--metrics val/exact_match,train/loss] [--out docs/results/x]``.
Every run directory with a ``csv/metrics.csv`` (Lightning's CSV logger) becomes one row; the row is labelled by the
run's Hydra overrides (``.hydra/overrides.yaml``) so the arms of a multirun are told apart. The table holds the last
logged value of each metric; the plot draws each metric over ``step`` for every run.

Demo pages: ``python -m zoo.report demo <paper> [--sweep DIR] [--out docs/results]`` builds
``<out>/<paper>.md`` and its plots from the sweep of ``python train.py -m +demo=<paper>`` (default: the newest
sweep under ``<log dir>/demos/<paper>/``) by calling ``build(sweep, out)`` of the page builder ``demos/<paper>.py``
(see ``docs/demos.md``). The helpers page builders share live here:

* loading a sweep -> :class:`Sweep` of :class:`Run` (each run's overrides -> arm + seed, metric series from the CSV
  logger, JSON/JSONL files a callback wrote, the resolved config and ``run_info.json``);
* the prerequisites the runs used -> :func:`artifact_values` (their build metrics, from ``run_info.json``);
* aggregating over seeds -> :func:`stat` (mean, sd and a Student-t 95% confidence interval of the mean),
  :func:`compare` (Welch interval of a difference of means) and :func:`contrast` (a templated sentence that says
  "not shown" when the interval of the difference contains 0); :func:`paired_contrast` for arms measured on the same
  seeds (the interval of the per-seed differences);
* curves with confidence bands -> :func:`curve`, :func:`plot_curves`;
* markdown -> :func:`table`, :func:`fmt`, :func:`fmt_stat`;
* the page header -> :func:`provenance` (the exact command, date, machine and wall time, read from the runs);
  the page itself -> :func:`write_page` (adds the footer with the commands that regenerate it).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from zoo.stats import CONFIDENCE, compare, paired, stat

# ----------------------------------------------------------------------------------------------------------------
# generic report of any run / multirun directory
# ----------------------------------------------------------------------------------------------------------------


def find_runs(root: Path) -> list[Path]:
    """Run directories (holding ``csv/metrics.csv``) under ``root``, sorted."""
    return sorted({p.parent.parent for p in root.rglob("csv/metrics.csv")})


def read_metrics(run: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` from a run's CSV log (empty cells skipped; no log: ``{}``)."""
    series: dict[str, list[tuple[int, float]]] = {}
    path = run / "csv" / "metrics.csv"
    if not path.is_file():
        return series
    with path.open() as handle:
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


def fmt(value: Any, digits: int = 4) -> str:
    """A table cell: floats with ``digits`` significant digits, ``nan`` as is, ``None`` as empty."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}g}"
    return "" if value is None else str(value)


def markdown_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    """A markdown table with one row per run (``row["run"]`` first, then ``columns``)."""
    return table(["run", *columns], [[row["run"], *(row.get(c) for c in columns)] for row in rows])


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 4) -> str:
    """A markdown table; cells go through :func:`fmt` (strings are kept as they are)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c, digits) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


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


# ----------------------------------------------------------------------------------------------------------------
# sweeps: runs, arms, seeds
# ----------------------------------------------------------------------------------------------------------------

SEED_KEY = "seed"


def split_override(override: str) -> tuple[str, str]:
    """``"+demo/x/arm=rm"`` -> ``("demo/x/arm", "rm")``: the key without ``+``/``++``/``~`` and the value text."""
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _is_sweep(value: str) -> bool:
    """Whether an override value is a sweep (Hydra's parser; a top-level comma when it cannot be parsed)."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        return OverridesParser.create().parse_override(f"k={value}").is_sweep_override()
    except Exception:  # a value Hydra cannot parse outside its app: fall back to the comma
        return "," in value


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


@dataclass
class Run:
    """One run directory of a sweep.

    Attributes:
        path: the run directory (Hydra's job output directory).
        overrides: the job's overrides (``.hydra/overrides.yaml``), command-line ones included.
        arm: the swept overrides other than the seed (``{key: value}``, filled by :class:`Sweep`).
        seed: the run's seed (its ``seed=`` override, else the resolved config's ``seed``).
        number: Hydra's job number in the sweep (order of launch).
    """

    path: Path
    overrides: list[str]
    arm: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    number: int = 0
    group_choices: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Run:
        """Read a run directory (its overrides, seed and job number)."""
        path = Path(path)
        overrides = [str(o) for o in (_load_yaml(path / ".hydra" / "overrides.yaml") or [])]
        values = dict(split_override(o) for o in overrides)
        hydra_cfg = _load_yaml(path / ".hydra" / "hydra.yaml") or {}
        # a single (non-multirun) run's job number is Hydra's missing value "???"
        num = str(((hydra_cfg.get("hydra") or {}).get("job") or {}).get("num") or 0)
        number = int(num) if num.isdigit() else 0
        choices = ((hydra_cfg.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
        run = cls(
            path=path, overrides=overrides, number=number, group_choices={str(k): str(v) for k, v in choices.items()}
        )
        seed = values.get(SEED_KEY)
        if seed is None:
            seed = (run.config or {}).get(SEED_KEY)
        run.seed = int(seed) if seed is not None else None
        return run

    @property
    def name(self) -> str:
        """The arm's values joined by ``/`` (e.g. ``rlhf/gr3``); ``"all"`` when nothing but the seed is swept."""
        return "/".join(self.arm.values()) or "all"

    @property
    def label(self) -> str:
        """The arm's overrides, ``key=value`` joined by spaces."""
        return " ".join(f"{k}={v}" for k, v in self.arm.items())

    def choice(self, key: str, default: str | None = None) -> str | None:
        """The value the run's overrides give ``key`` (``+``/``~`` ignored)."""
        return dict(split_override(o) for o in self.overrides).get(key, default)

    def group_choice(self, group: str) -> str | None:
        """The option the run's composed config took for a config group (``task``, ``method``; Hydra's
        ``hydra.runtime.choices``, defaults included), ``None`` when unknown."""
        return self.group_choices.get(group)

    @cached_property
    def metrics(self) -> dict[str, list[tuple[int, float]]]:
        """``{metric: [(step, value), ...]}`` of the CSV logger (``{}`` without one)."""
        return read_metrics(self.path)

    def series(self, metric: str) -> list[tuple[int, float]]:
        """The logged ``(step, value)`` pairs of ``metric`` (empty when never logged)."""
        return self.metrics.get(metric, [])

    def last(self, metric: str) -> float:
        """The last logged value of ``metric`` (``nan`` when never logged)."""
        points = self.series(metric)
        return points[-1][1] if points else math.nan

    @cached_property
    def config(self) -> dict[str, Any]:
        """The run's resolved config (``resolved_config.yaml``; ``{}`` when absent)."""
        return _load_yaml(self.path / "resolved_config.yaml") or {}

    def get(self, dotted: str, default: Any = None) -> Any:
        """A value of the resolved config by dotted key (``"module.shaper.alpha"``)."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @cached_property
    def info(self) -> dict[str, Any]:
        """``run_info.json`` (command line, commit, versions, machine, start/finish times; ``{}`` when absent)."""
        path = self.path / "run_info.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    @property
    def finished(self) -> bool:
        """Whether the run finished (``run_info.json`` has ``finished_at``)."""
        return "finished_at" in self.info

    def file(self, relative: str) -> Path:
        """A file of the run directory (it may not exist)."""
        return self.path / relative

    def read_json(self, relative: str) -> Any:
        """A JSON file a callback wrote into the run directory."""
        return json.loads(self.file(relative).read_text())

    def read_jsonl(self, relative: str) -> list[dict[str, Any]]:
        """A JSONL file a callback wrote into the run directory (one record per line)."""
        with self.file(relative).open() as handle:
            return [json.loads(line) for line in handle if line.strip()]


@dataclass
class Sweep:
    """The runs of one multirun directory, grouped into arms (swept overrides other than the seed).

    Attributes:
        path: the sweep directory (``hydra.sweep.dir``).
        runs: its runs in launch order.
        swept: the override keys that define the arms, in sweep order.
        multirun: ``multirun.yaml`` (the composed config of the sweep; ``{}`` when absent).
    """

    path: Path
    runs: list[Run]
    swept: list[str]
    multirun: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path) -> Sweep:
        """Read every run under ``path`` (directories holding ``.hydra/overrides.yaml``)."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no sweep directory at {path}")
        runs = sorted(
            (Run.load(p.parent.parent) for p in path.rglob(".hydra/overrides.yaml")), key=lambda r: (r.number, r.path)
        )
        if not runs:
            raise FileNotFoundError(f"no run directories (with .hydra/overrides.yaml) under {path}")
        multirun = _load_yaml(path / "multirun.yaml") or {}
        swept = cls._swept_keys(runs, multirun)
        for run in runs:
            values = dict(split_override(o) for o in run.overrides)
            run.arm = {k: values[k] for k in swept if k in values}
        return cls(path=path, runs=runs, swept=swept, multirun=multirun)

    @staticmethod
    def _swept_keys(runs: list[Run], multirun: dict[str, Any]) -> list[str]:
        """Keys declared as sweeps (``hydra.sweeper.params``, then the command line) or whose value varies across
        runs; the seed is left out."""
        hydra_cfg = multirun.get("hydra") or {}
        declared = [(str(k), str(v)) for k, v in ((hydra_cfg.get("sweeper") or {}).get("params") or {}).items()]
        declared += [split_override(str(o)) for o in ((hydra_cfg.get("overrides") or {}).get("task") or [])]
        keys: list[str] = []
        for key, value in declared:
            key = key.lstrip("+~")
            if _is_sweep(value) and key not in keys:
                keys.append(key)
        per_run = [dict(split_override(o) for o in r.overrides) for r in runs]
        every = {k for values in per_run for k in values}
        keys += sorted(k for k in every if k not in keys and len({v.get(k) for v in per_run}) > 1)
        return [k for k in keys if k != SEED_KEY and any(k in v for v in per_run)]

    # -- grouping -------------------------------------------------------------------------------------------------
    def arms(self) -> dict[str, list[Run]]:
        """``{arm name: runs}`` in launch order (arm name: :attr:`Run.name`)."""
        groups: dict[str, list[Run]] = {}
        for run in self.runs:
            groups.setdefault(run.name, []).append(run)
        return groups

    def arm(self, name: str) -> list[Run]:
        """The runs of one arm (empty when the sweep has none)."""
        return self.arms().get(name, [])

    @property
    def seeds(self) -> list[int]:
        """The seeds of the sweep, sorted."""
        return sorted({r.seed for r in self.runs if r.seed is not None})

    # -- provenance -----------------------------------------------------------------------------------------------
    @property
    def command(self) -> str:
        """The command line that launched the sweep (``python`` + the first run's ``argv``)."""
        commands = self.commands
        return commands[0] if commands else "(unknown: the runs hold no run_info.json)"

    @property
    def commands(self) -> list[str]:
        """Every distinct command line of the runs (``python`` + ``argv``), in launch order: one for a sweep made by a
        single launch, several when runs of further launches (e.g. some arms run in parallel) joined the folder."""
        found: list[str] = []
        for run in sorted(self.runs, key=lambda r: (str(r.info.get("started_at") or ""), r.number)):
            argv = run.info.get("argv")
            if argv:
                command = " ".join(["python", Path(argv[0]).name, *map(_quote, argv[1:])])
                if command not in found:
                    found.append(command)
        return found


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in " ${}[]*?") else arg


def latest_sweep(paper: str, log_dir: str | Path | None = None) -> Path:
    """The newest sweep of ``paper`` under ``<log_dir>/demos/<paper>/`` (by the time of its ``multirun.yaml``, which
    Hydra writes when the sweep starts)."""
    root = Path(log_dir or os.environ.get("ZOO_LOG_DIR") or "logs") / "demos" / paper
    marks = sorted(root.glob("*/multirun.yaml"), key=lambda p: (p.stat().st_mtime, p.parent.name))
    if not marks:
        raise FileNotFoundError(
            f"no sweep of the {paper!r} demo under {root}; run `python train.py -m +demo={paper}` first "
            "(or pass --sweep DIR)"
        )
    return marks[-1].parent


# ----------------------------------------------------------------------------------------------------------------
# statistics over seeds
# ----------------------------------------------------------------------------------------------------------------


def contrast(name_a: str, a: Iterable[float], name_b: str, b: Iterable[float], what: str, digits: int = 3) -> str:
    """A sentence comparing two arms on one metric, filled from the numbers.

    Resolved (the interval of the difference excludes 0): ``"<what> is lower with A than with B (x vs y; difference
    d, 95% CI [lo, hi])"``; otherwise ``"not shown: ..."`` with the same numbers.
    """
    d = compare(a, b)
    numbers = f"{d.a.mean:.{digits}f} vs {d.b.mean:.{digits}f}"
    if math.isnan(d.lo):
        return f"{what}: {name_a} {numbers} {name_b}; not shown (fewer than two seeds on a side)"
    level = round(100 * CONFIDENCE)
    interval = f"difference {d.delta:+.{digits}f}, {level}% CI [{d.lo:+.{digits}f}, {d.hi:+.{digits}f}]"
    if d.shown:
        direction = "higher" if d.delta > 0 else "lower"
        return f"{what} is {direction} with {name_a} than with {name_b} ({numbers}; {interval})"
    return f"{what}: {name_a} vs {name_b} not shown, within noise ({numbers}; {interval} contains 0)"


def paired_contrast(
    name_a: str, a: dict[Any, float], name_b: str, b: dict[Any, float], what: str, digits: int = 3
) -> str:
    """A sentence comparing two arms measured on the same units (``{seed: value}``: arms of one seed sharing the
    policy and the prompts, or before/after within one run), from the per-unit differences ``a - b``: their mean and
    Student-t interval; ``"not shown"`` when the interval contains 0 (units present on one side only are left out)."""
    d = paired(a, b)
    level = round(100 * CONFIDENCE)
    if d.n < 2:
        return f"{what}: {name_a} − {name_b} not shown (fewer than two paired seeds)"
    interval = f"mean paired difference {d.mean:+.{digits}f}, {level}% CI [{d.lo:+.{digits}f}, {d.hi:+.{digits}f}]"
    if d.lo > 0 or d.hi < 0:
        direction = "higher" if d.mean > 0 else "lower"
        return f"{what} is {direction} with {name_a} than with {name_b}, paired by seed ({interval}; n={d.n})"
    return f"{what}: {name_a} − {name_b} not shown, paired by seed ({interval} contains 0; n={d.n})"


def artifact_values(runs: Iterable[Run], kind: str, metric: str, name: str | None = None) -> list[float]:
    """A build metric of the prerequisites of ``kind`` (and, when given, of that ``name``) the runs used
    (``run_info.json`` -> ``artifacts``), one value per distinct artifact (several runs of a seed share one)."""
    seen: dict[str, float] = {}
    for run in runs:
        for used in run.info.get("artifacts", []):
            value = (used.get("metrics") or {}).get(metric)
            if used.get("kind") == kind and (name is None or used.get("name") == name) and value is not None:
                seen[used["path"]] = float(value)
    return list(seen.values())


def values(runs: Iterable[Run], fn: str | Callable[[Run], float]) -> list[float]:
    """One value per run: the last logged value of a metric name, or ``fn(run)``."""
    get = (lambda r: r.last(fn)) if isinstance(fn, str) else fn
    return [float(get(r)) for r in runs]


# ----------------------------------------------------------------------------------------------------------------
# curves with confidence bands
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# provenance header
# ----------------------------------------------------------------------------------------------------------------


def _parse_time(text: str | None) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def provenance(sweep: Sweep, paper: str) -> str:
    """A paragraph stating how the page was made, read from the runs: the exact command, the report command, the
    number of runs (arms × seeds), dates, wall time, machine, commit and versions."""
    runs = sweep.runs
    infos = [r.info for r in runs]
    starts = [t for t in (_parse_time(i.get("started_at")) for i in infos) if t]
    ends = [t for t in (_parse_time(i.get("finished_at")) for i in infos) if t]
    walls = [float(i["wall_seconds"]) for i in infos if "wall_seconds" in i]
    unfinished = sum(not r.finished for r in runs)
    arms = sweep.arms()
    seeds = sweep.seeds
    commands = sweep.commands
    launched = (
        f"`{sweep.command}`"
        if len(commands) <= 1
        else f"{len(commands)} launches (" + "; ".join(f"`{c}`" for c in commands) + ")"
    )
    lines = [
        f"Generated from the run directories of {launched} by `python -m zoo.report demo {paper}`: "
        f"{len(runs)} runs ({len(arms)} arm{'s' if len(arms) != 1 else ''} × "
        f"{len(seeds) or 1} seed{'s' if len(seeds) != 1 else ''}"
        + (f": {', '.join(map(str, seeds))}" if seeds else "")
        + ")"
        + (f", {unfinished} of them unfinished" if unfinished else "")
        + "."
    ]
    if starts and ends:
        span = (max(ends) - min(starts)).total_seconds()
        lines.append(
            f"Runs from {min(starts):%Y-%m-%d %H:%M} to {max(ends):%Y-%m-%d %H:%M} "
            f"({span / 60:.1f} min wall for the whole sweep, prerequisites built on first use included; "
            f"runs took {min(walls):.0f}-{max(walls):.0f} s each)."
            if walls
            else f"Runs from {min(starts):%Y-%m-%d %H:%M} to {max(ends):%Y-%m-%d %H:%M}."
        )
    machine = next((i["machine"] for i in infos if i.get("machine")), None)
    if machine:
        loads = [i["machine"].get("load_average") for i in infos if (i.get("machine") or {}).get("load_average")]
        load = f"; load average {min(loads):.1f}-{max(loads):.1f} at run starts (a shared machine)" if loads else ""
        omp = machine.get("omp_num_threads")
        lines.append(
            f"Machine: {machine.get('processor') or machine.get('machine') or 'unknown CPU'}, "
            f"{machine.get('cpu_count')} cores, torch threads {machine.get('torch_threads')}"
            + (f", OMP_NUM_THREADS={omp}" if omp else "")
            + (f", accelerator {machine['accelerator']}" if machine.get("accelerator") else ", no accelerator")
            + f"{load}."
        )
    commits = list(dict.fromkeys(i.get("commit") for i in infos if i.get("commit")))
    if commits:
        dirty = any(i.get("dirty") for i in infos)
        versions = next((i.get("versions") for i in infos if i.get("versions")), {}) or {}
        lines.append(
            f"Code: commit{'s' if len(commits) > 1 else ''} {', '.join(c[:10] for c in commits)}"
            f"{' (with uncommitted changes)' if dirty else ''}"
            + (f"; torch {versions.get('torch')}, transformers {versions.get('transformers')}" if versions else "")
            + "."
        )
    return " ".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# demo pages
# ----------------------------------------------------------------------------------------------------------------


def llm_arm_measured(runs: Sequence[Run], episodes: Sequence[dict[str, Any]], score: str) -> str:
    """The measured sentence of an LLM-agent arm of an episode demo (``trajectories.jsonl`` rows in ``episodes``):
    runs, episodes, steps, steps with a parsed tool call, steps that succeeded, commits, tokens per episode, and
    whether every run finished; ``score`` is the formatted score part (e.g. ``"score 0.000 ± 0.000"``)."""
    steps = [s for e in episodes for s in e.get("steps", [])]
    called = sum(s.get("tool") is not None for s in steps)
    ok = sum(bool(s.get("ok")) for s in steps)
    committed = sum(bool(e.get("committed")) for e in episodes)
    finished = (
        "Every run finished: the model's unparseable replies were recorded as failed steps, never a crash."
        if all(r.finished for r in runs)
        else f"{sum(not r.finished for r in runs)} of {len(runs)} runs did not finish."
    )
    return (
        f"Measured over {len(runs)} runs ({len(episodes)} episodes, {len(steps)} steps): {score}; steps with a parsed "
        f"tool call {called} of {len(steps)}, steps that succeeded {ok}; committed {committed} of {len(episodes)} "
        f"episodes; {stat(r.last('test/tokens') for r in runs).mean:.0f} tokens per episode (prompt + completion). "
        + finished
    )


def endpoint_section(paper: str, arm: str, caps: str, note: str = "") -> list[str]:
    """The page section that reruns an episode demo with a served model (``demo/<paper>/arm=<arm>``) and rebuilds its
    page; ``caps`` are the demo's LLM caps for a real model (e.g. ``"demo.llm.max_tokens=1024"``), ``note`` is added
    after the arm's name (e.g. ``", on-demand scheme"``)."""
    return [
        "## Any OpenAI-compatible endpoint",
        "",
        f"The same sweep with a served model as the agent (`pip install 'paperzoo[agents]'`; the arm `{arm}`{note}; "
        "replies can be recorded and replayed with `backend.cache.path=... backend.cache.mode=auto`):",
        "",
        "```bash",
        f"OMP_NUM_THREADS=1 python train.py -m +demo={paper} demo/{paper}/arm={arm} \\",
        "    backend.base_url=http://localhost:8000/v1 backend.model=<served model> \\",
        f"    {caps}",
        f"python -m zoo.report demo {paper}",
        "```",
    ]


def write_page(out: Path, paper: str, lines: Sequence[str], verdict: Sequence[str] | None = None) -> Path:
    """Write ``<out>/<paper>.md`` from ``lines`` and the footer with the two commands that regenerate it.

    ``verdict``: the page's Verdict section (:func:`zoo.verdict.verdict_section`), placed right after the title (the
    first ``# `` line) so that the page opens with it.
    """
    lines = list(lines)
    if verdict:
        title = next((i for i, line in enumerate(lines) if line.startswith("# ")), -1)
        lines[title + 1 : title + 1] = ["", *verdict]
    footer = [
        f"Regenerate: `OMP_NUM_THREADS=1 python train.py -m +demo={paper}`, then `python -m zoo.report demo {paper}`.",
        "",
    ]
    page = Path(out) / f"{paper}.md"
    page.write_text("\n".join([*lines, *footer]))
    return page


def known_demos(demos_dir: str | Path = "demos") -> list[str]:
    """The demos: every ``conf/demo/<paper>.yaml`` of the installed configs and every page builder in ``demos_dir``."""
    spec = importlib.util.find_spec("zoo.conf")
    confs = [Path(d) / "demo" for d in (spec.submodule_search_locations or [])] if spec else []
    configs = {p.stem for d in confs for p in d.glob("*.yaml")}
    builders = {p.stem for p in Path(demos_dir).glob("*.py") if not p.stem.startswith("_")}
    return sorted(builders | configs)


def load_page_builder(paper: str, demos_dir: str | Path = "demos") -> ModuleType:
    """Import ``<demos_dir>/<paper>.py`` (a page builder with ``build(sweep, out) -> list[Path]``)."""
    path = Path(demos_dir) / f"{paper}.py"
    if not path.is_file():
        known = known_demos(demos_dir)
        what = "no page builder" if paper in known else f"unknown demo {paper!r}: no page builder"
        raise FileNotFoundError(f"{what} {path} (known demos: {', '.join(known) or 'none'})")
    spec = importlib.util.spec_from_file_location(f"zoo_demo_page_{paper}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "build", None)):
        raise AttributeError(f"{path} defines no build(sweep, out) function")
    return module


def build_demo_page(
    paper: str,
    sweep: str | Path | None = None,
    out: str | Path = "docs/results",
    demos_dir: str | Path = "demos",
    log_dir: str | Path | None = None,
) -> list[Path]:
    """Build ``<out>/<paper>.md`` (+ plots) from a sweep of ``python train.py -m +demo=<paper>``."""
    builder = load_page_builder(paper, demos_dir)  # an unknown name is said before looking for its sweep
    sweep_dir = Path(sweep) if sweep else latest_sweep(paper, log_dir)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return list(builder.build(Sweep.load(sweep_dir), out))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        parser = argparse.ArgumentParser(
            prog="python -m zoo.report demo", description="Build docs/results/<paper>.md from a demo sweep."
        )
        parser.add_argument("paper", help="the demo's name (conf/demo/<paper>.yaml, demos/<paper>.py)")
        parser.add_argument("--sweep", default=None, help="sweep directory (default: the newest one of the demo)")
        parser.add_argument("--out", default="docs/results", help="output directory (default: docs/results)")
        parser.add_argument("--demos", default="demos", help="directory of the page builders (default: demos)")
        parser.add_argument("--log-dir", default=None, help="log directory (default: $ZOO_LOG_DIR or ./logs)")
        args = parser.parse_args(argv[1:])
        try:
            paths = build_demo_page(args.paper, args.sweep, args.out, args.demos, args.log_dir)
        except (FileNotFoundError, AttributeError) as err:
            raise SystemExit(f"error: {err}") from None
        print("wrote " + ", ".join(map(str, paths)))
        return
    parser = argparse.ArgumentParser(prog="python -m zoo.report", description=__doc__.splitlines()[0])
    parser.add_argument("root", help="a run directory or a multirun directory (or: demo <paper> ...)")
    parser.add_argument("--metrics", default=None, help="comma-separated metric names (default: all)")
    parser.add_argument("--out", default=None, help="output path without suffix (default: <root>/report)")
    args = parser.parse_args(argv)
    if not Path(args.root).exists():
        raise SystemExit(f"error: {args.root} does not exist; give a run directory or a multirun directory")
    metrics = args.metrics.split(",") if args.metrics else None
    md, png = report(args.root, metrics, args.out)
    print(f"wrote {md} and {png}")


if __name__ == "__main__":
    main()
