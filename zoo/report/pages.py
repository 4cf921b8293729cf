"""Markdown of reports: tables, the sentences that compare two arms from their intervals, the provenance header,
the page writer (the Verdict first, the regenerate footer last), the generic report of any run directory and the
loading of a demo's page builder (``demos/<paper>.py``)."""

from __future__ import annotations

import datetime
import importlib.util
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from zoo.report.plots import plot
from zoo.report.runs import Sweep, latest_sweep, summarize
from zoo.stats import CONFIDENCE, compare, paired


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
    seed_list = f": {', '.join(map(str, seeds))}" if seeds else ""
    if len(runs) == len(arms) * (len(seeds) or 1):
        shape = (
            f"{len(arms)} arm{'s' if len(arms) != 1 else ''} × {len(seeds) or 1} seed{'s' if len(seeds) != 1 else ''}"
            + seed_list
        )
    else:  # not a full grid: settings (every override but the seed) run at some of the seeds only
        shape = f"{len(arms)} settings, each at some of {len(seeds)} seeds{seed_list}"
    lines = [
        f"Generated from the run directories of {launched} by `python -m zoo.report demo {paper}`: "
        f"{len(runs)} runs ({shape})" + (f", {unfinished} of them unfinished" if unfinished else "") + "."
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
    """Import ``<demos_dir>/<paper>.py`` (a page builder with ``build(sweep, out) -> list[Path]``).

    While it is imported, ``demos_dir`` is on the import path, so builders share sections through modules of that
    folder whose names start with ``_`` (``import _agent_pages``)."""
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
    folder = str(Path(demos_dir).resolve())
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
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
