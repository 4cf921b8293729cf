"""Page builder of the vocabulary-extension demo (arXiv 2605.04308): ``docs/results/vocab_extend.md`` + plot.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=vocab_extend`` (``conf/demo/vocab_extend.yaml``: arm × n ×
learning-rate grid point × seed); page: ``python -m zoo.report demo vocab_extend``. Read from the sweep:
``transition_tv/*`` (:class:`zoo.callbacks.TransitionTV`: TV at the end and of the untrained rows at fit start,
new-token mass and TV change on old-only contexts), ``forgetting/*`` and ``forgetting_masked/*``
(:class:`zoo.callbacks.ForgettingMonitor`, raw and with the new-token mask, ``check_removal``), ``val/loss`` (the
learning-rate choice and the plateau check), the resolved configs and the base models' build metrics.

The page opens with the generated verdict: whether n needed (relative to each s's own asymptote) grows linearly in s
in dictionary mode (log-log slope and its interval), whether the method reaches a lower TV than full fine-tuning and
LoRA at equal n, zero forgetting with input rows only, and what old-only contexts lose with output rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.data.markov import MarkovChain
from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    legend,
    provenance,
    pyplot,
    save_figure,
    table,
    write_page,
)
from zoo.stats import CONFIDENCE, Stat, fmt_stat, paired, stat, t_critical
from zoo.verdict import Claim, seeds_note, verdict_section

PAPER = "vocab_extend"
ARM_KEY = "demo/vocab_extend/arm"
N_KEY = "datamodule.source.num_train"
LR_KEY = "demo.lr"
LR_LEVELS = ("vlow", "low", "mid", "high", "vhigh")
TV = "transition_tv/new_tv"
TV_START = "transition_tv/new_tv_start"
OLD_TV, OLD_TV_START, OLD_TV_CHANGE = (
    "transition_tv/old_tv",
    "transition_tv/old_tv_start",
    "transition_tv/old_tv_change",
)
OLD_NEW_MASS = "transition_tv/old_new_mass"
FORGETTING = ("forgetting/max_abs_logit_diff", "forgetting/kl_mean")
MASS = "forgetting/new_token_mass"
MASKED = ("forgetting_masked/max_abs_logit_diff", "forgetting_masked/kl_mean", "forgetting_masked/new_token_mass")
REMOVAL = ("forgetting/removed_max_abs_param_diff", "forgetting/removed_max_abs_logit_diff")
VAL = "val/loss"
BASELINES = ("full", "lora")
# the method arm the baselines are compared with, the output-rows arm and the free-rows arm
METHOD, OUTPUT_ROWS, FREE = "d4", "o4", "f4"
# a halfway-to-final validation-loss fall larger than this means "still falling" (not at a plateau)
PLATEAU = 0.02
# verdict effects below this (TV, mass) would call for 5 seeds
SMALL_EFFECT = 0.02


# -- reading the sweep -----------------------------------------------------------------------------------------------
def arm_of(run: Run) -> str:
    return run.arm.get(ARM_KEY) or run.choice(ARM_KEY) or "all"


def lr_of(run: Run) -> str:
    """The run's point of its arm's learning-rate grid (``low``/``mid``/``high``), read from the learning rate it
    trained with (the full sweep runs ``demo.lr=chosen``, an alias of one point)."""
    grid = run.get(f"demo.lr_grid.{arm_of(run)}") or {}
    lr = float(run.get("module.optimizer.lr"))
    for level in LR_LEVELS:
        if level in grid and math.isclose(float(grid[level]), lr, rel_tol=1e-9):
            return level
    return f"{lr:g}"


def n_of(run: Run) -> int:
    value = run.choice(N_KEY)
    return int(value) if value is not None else int(run.get(N_KEY))


def dictionary_size(run: Run) -> int:
    return int(run.get("task.dictionary_size"))


def mode_of(run: Run) -> str:
    return str(run.get("module.mode"))


@dataclass
class Design:
    """The finished runs by (arm, n, lr point), one per seed, and the learning-rate point chosen per arm.

    Attributes:
        tune_n: the n at which the grid was tuned (every point of every arm there, on the tuning seeds).
        chosen: per arm, the point with the lowest validation loss at ``tune_n`` (mean over the seeds every point has).
        used: per (arm, n), the point whose runs the page reports: the chosen one where it was run, else the one the
            sweep ran (a disagreement the fair-test section states).
    """

    arms: list[str]
    ns: list[int]
    seeds: list[int]
    cells: dict[tuple[str, int, str], dict[int | None, Run]]
    tune_n: int
    chosen: dict[str, str]
    used: dict[tuple[str, int], str]
    tuning_seeds: dict[str, list[int | None]]

    def runs(self, arm: str, n: int | None = None) -> list[Run]:
        """The reported runs of ``arm`` at ``n`` (every n when ``None``), one per seed."""
        ns = self.ns if n is None else [n]
        return [r for m in ns if (arm, m) in self.used for r in self.cells[(arm, m, self.used[(arm, m)])].values()]

    def by_seed(self, arm: str, n: int, metric: str | Callable[[Run], float]) -> dict[int | None, float]:
        fn = metric if callable(metric) else (lambda r: r.last(metric))
        return {r.seed: fn(r) for r in self.runs(arm, n)}

    def arm_ns(self, arm: str) -> list[int]:
        """The n values at which ``arm`` has reported runs."""
        return [n for n in self.ns if (arm, n) in self.used]

    def levels(self, arm: str, n: int) -> list[str]:
        found = [lv for (a, m, lv) in self.cells if a == arm and m == n]
        return [lv for lv in LR_LEVELS if lv in found] + sorted(lv for lv in found if lv not in LR_LEVELS)

    def edges(self, arm: str) -> tuple[str, str]:
        """The grid points with the smallest and the largest learning rate at ``tune_n``."""
        levels = sorted(self.levels(arm, self.tune_n), key=lambda lv: self.lr(arm, lv))
        return levels[0], levels[-1]

    def lr(self, arm: str, level: str) -> float:
        runs = self.cells.get((arm, self.tune_n, level)) or next(
            rs for (a, _, lv), rs in self.cells.items() if a == arm and lv == level
        )
        return float(next(iter(runs.values())).get("module.optimizer.lr"))

    def tuning_loss(self, arm: str, level: str) -> float:
        """Mean validation loss of one grid point at ``tune_n`` over the seeds every point of the arm has."""
        runs = self.cells.get((arm, self.tune_n, level), {})
        return _mean(runs[k].last(VAL) for k in self.tuning_seeds[arm] if k in runs)

    @property
    def mismatched(self) -> list[tuple[str, int]]:
        """(arm, n) whose reported runs are not at the arm's chosen point."""
        return [(a, n) for (a, n), lv in self.used.items() if a in self.chosen and lv != self.chosen[a]]


def design(sweep: Sweep) -> Design:
    """Group the finished runs (the last launched run per seed of a cell) and choose each arm's learning rate: the
    grid point with the lowest validation loss at ``demo.tune_n`` (mean over the seeds every point was run on; ties:
    the first point of the grid). The validation rows are not the contexts the page reports TV on."""
    cells: dict[tuple[str, int, str], dict[int | None, Run]] = {}
    # in the order the runs started: a later run of the same cell and seed (a rerun) replaces an earlier one
    for run in sorted(sweep.runs, key=lambda r: (str(r.info.get("started_at") or ""), r.number)):
        if run.finished:
            cells.setdefault((arm_of(run), n_of(run), lr_of(run)), {})[run.seed] = run
    arms = list(dict.fromkeys(a for a, _, _ in cells))
    ns = sorted({n for _, n, _ in cells})
    first = next(r for r in sweep.runs if r.finished)
    tune_n = int(first.get("demo.tune_n", ns[len(ns) // 2]))
    d = Design(arms, ns, sorted({k for rs in cells.values() for k in rs if k is not None}), cells, tune_n, {}, {}, {})
    for arm in arms:
        levels = d.levels(arm, tune_n)
        if not levels:
            continue
        seeds = set.intersection(*(set(cells[(arm, tune_n, lv)]) for lv in levels))
        d.tuning_seeds[arm] = sorted(seeds, key=lambda k: -1 if k is None else k)
        d.chosen[arm] = min(levels, key=lambda lv: d.tuning_loss(arm, lv))
    for arm in arms:
        for n in ns:
            levels = d.levels(arm, n)
            if not levels:
                continue
            if arm in d.chosen and d.chosen[arm] in levels:
                d.used[(arm, n)] = d.chosen[arm]
            else:  # the sweep ran another point here: report the one with the most seeds
                d.used[(arm, n)] = max(levels, key=lambda lv: len(cells[(arm, n, lv)]))
    return d


def _mean(values: Any) -> float:
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(xs) / len(xs) if xs else math.inf


# -- n needed relative to each s's own asymptote ----------------------------------------------------------------------
def crossing(points: Sequence[tuple[float, float]], level: float) -> float:
    """The smallest ``n`` at which the TV falls to ``level`` or below, interpolated linearly in ``(log n, TV)``
    between the last grid point above ``level`` and the first one at or below it; ``nan`` when no grid point is at or
    below ``level``; the smallest ``n`` when it already is."""
    points = sorted(points)
    for i, (n, tv) in enumerate(points):
        if tv <= level:
            if i == 0:
                return float(n)
            n0, tv0 = points[i - 1]
            frac = (tv0 - level) / (tv0 - tv)
            return math.exp(math.log(n0) + frac * (math.log(n) - math.log(n0)))
    return math.nan


def gap_needed(start: float, points: Sequence[tuple[float, float]], fraction: float) -> tuple[float, float]:
    """``(n needed, level)``: the smallest n at which the TV has closed ``fraction`` of the gap between ``start`` (the
    untrained rows' TV) and the asymptote (the TV at the largest n): ``level = asymptote + (1 - fraction) * (start -
    asymptote)``. ``nan`` when the TV never fell below ``start``."""
    asymptote = sorted(points)[-1][1]
    if not start > asymptote:
        return math.nan, math.nan
    level = asymptote + (1.0 - fraction) * (start - asymptote)
    return crossing(points, level), level


def loglog_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float, int]:
    """Least-squares slope of ``log y`` on ``log x`` with its 95% t-interval half-width, the intercept, and the
    number of points (``nan`` where fewer than three points or one x)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0 and not math.isnan(y)]
    k = len(pts)
    if k < 3 or len({p[0] for p in pts}) < 2:
        return math.nan, math.nan, math.nan, k
    mx = sum(p[0] for p in pts) / k
    my = sum(p[1] for p in pts) / k
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    intercept = my - slope * mx
    residual = sum((p[1] - intercept - slope * p[0]) ** 2 for p in pts)
    se = math.sqrt(residual / (k - 2) / sxx)
    return slope, t_critical(k - 2) * se, intercept, k


@dataclass
class Needed:
    """n needed to close ``fraction`` of the gap, per dictionary arm and seed, and the log-log fit over s."""

    fraction: float
    needed: dict[str, list[float]]
    rows: list[list[Any]]
    slope: float
    half: float
    intercept: float
    points: int
    sizes: list[int]

    def slope_stat(self, minus: float = 0.0) -> Stat:
        """The slope (minus ``minus``) as a :class:`Stat` with the fit's interval (for a verdict line)."""
        lo, hi = self.slope - self.half, self.slope + self.half
        return Stat(self.slope - minus, math.nan, self.points, lo - minus, hi - minus, CONFIDENCE)


def dictionary_arms(d: Design) -> list[str]:
    """The arms of the slope fit: new rows only, dictionary mode, no output rows, ordered by s."""
    found = [
        a
        for a in d.arms
        if a not in BASELINES
        and len(d.arm_ns(a)) >= 3
        and mode_of(d.runs(a)[0]) == "dictionary"
        and not d.runs(a)[0].get("module.output_rows")
    ]
    return sorted(found, key=lambda a: dictionary_size(d.runs(a)[0]))


def needed_for(d: Design, fraction: float, arms: list[str]) -> Needed:
    """Per dictionary arm and seed: n needed to close ``fraction`` of its gap (the smallest grid n when the TV is
    already there: censored, shown as "<= n" and left out of the fit, like a crossing that cannot be computed)."""
    needed: dict[str, list[float]] = {}
    rows, fit_s, fit_n = [], [], []
    smallest = d.ns[0]
    for a in arms:
        s = dictionary_size(d.runs(a)[0])
        values, asymptotes, starts = [], [], []
        for seed in d.seeds:
            points = [(n, r.last(TV)) for n in d.ns for r in d.runs(a, n) if r.seed == seed]
            start = _mean(r.last(TV_START) for r in d.runs(a) if r.seed == seed)
            if len(points) < 2:
                values.append(math.nan)
                continue
            v, _ = gap_needed(start, points, fraction)
            values.append(v)
            asymptotes.append(sorted(points)[-1][1])
            starts.append(start)
        needed[a] = values
        inside = [v for v in values if not math.isnan(v) and v > smallest]
        fit_s += [s] * len(inside)
        fit_n += inside
        rows.append(
            [
                s,
                fmt_stat(stat(starts), ci=False),
                fmt_stat(stat(asymptotes), ci=False),
                ", ".join(show_needed(v, smallest) for v in values),
                fmt_stat(stat(inside), 0, ci=False) if inside else "n/a",
                f"{len(inside)}/{len(values)}",
            ]
        )
    slope, half, intercept, k = loglog_fit(fit_s, fit_n)
    return Needed(fraction, needed, rows, slope, half, intercept, k, sorted(set(fit_s)))


def show_needed(v: float, smallest: int) -> str:
    return "n/a" if math.isnan(v) else f"<= {smallest}" if v <= smallest else f"{v:.0f}"


def asymptote_change(d: Design, arm: str) -> Stat:
    """Per seed, the TV's fall between the two largest n as a share of the arm's gap (start - final): near 0 when the
    largest n is at the asymptote."""
    if len(d.ns) < 2:
        return stat([])
    a, b = d.ns[-2], d.ns[-1]
    before, after = d.by_seed(arm, a, TV), d.by_seed(arm, b, TV)
    start = d.by_seed(arm, b, TV_START)
    return stat(
        (before[k] - after[k]) / (start[k] - after[k])
        for k in after
        if k in before and k in start and start[k] > after[k]
    )


def fit_sentence(fit: Needed, band: float) -> str:
    if math.isnan(fit.slope):
        return f"Too few points inside the grid ({fit.points}) to fit a slope."
    lo, hi = fit.slope - fit.half, fit.slope + fit.half
    if 1 - band <= lo and hi <= 1 + band:
        reading = f"inside 1 ± {band}: n needed grows linearly in s"
    elif hi < 1 - band or lo > 1 + band:
        reading = f"wholly outside 1 ± {band}: n needed grows {'slower' if hi < 1 - band else 'faster'} than linearly"
    else:
        reading = f"not resolved against 1 ± {band}"
    grows = (
        "grows with s" if lo > 0 else "falls with s" if hi < 0 else "growth with s not resolved (interval contains 0)"
    )
    return (
        f"Log-log fit of n needed on s over the {fit.points} (s, seed) points inside the grid (s in "
        f"{{{', '.join(map(str, fit.sizes))}}}): slope {fit.slope:.2f}, {round(100 * CONFIDENCE)}% CI "
        f"[{lo:.2f}, {hi:.2f}]: {reading}; n needed: {grows}."
    )


# -- the verdict -----------------------------------------------------------------------------------------------------
def grid_mean(d: Design, arm: str, metric: str, ns: Sequence[int] | None = None) -> dict[int | None, float]:
    """Per seed, the mean of ``metric`` over ``ns`` (default: the arm's own n grid; each n at the arm's chosen
    learning rate); seeds missing an n are left out."""
    ns = list(ns if ns is not None else d.arm_ns(arm))
    out: dict[int | None, list[float]] = {}
    for n in ns:
        for seed, v in d.by_seed(arm, n, metric).items():
            out.setdefault(seed, []).append(v)
    return {k: sum(v) / len(v) for k, v in out.items() if len(v) == len(ns)}


def claims(d: Design, labels: dict[str, str], headline: Needed | None, band: float, margin: float, mass_band: float):
    """The paper's claims as this demo tests them, and the output-rows trade-off."""

    def lab(arm: str) -> str:
        return labels.get(arm, arm)

    found = []
    if headline is not None:
        found += [
            Claim(
                "samples needed to learn a new token grow with its dictionary size s (dictionary mode)",
                f"log-log slope of n needed (to close {headline.fraction:.0%} of each s's gap to its own asymptote) "
                f"on s, s in {{{', '.join(map(str, headline.sizes))}}}",
                headline.slope_stat(),
                "higher",
                0.0,
                2,
            ),
            Claim(
                "samples needed grow linearly in s (dictionary mode)",
                f"the same slope minus 1 (linear: 0; band ± {band})",
                headline.slope_stat(minus=1.0),
                "within",
                band,
                2,
            ),
        ]
    if METHOD in d.arms:
        for base in BASELINES:
            common = [n for n in d.arm_ns(base) if n in d.arm_ns(METHOD)]
            for n in sorted({min(common), max(common)}) if base in d.arms and common else []:
                where = "fewest" if n == min(common) else "most"
                found.append(
                    Claim(
                        f"the method reaches a lower TV than {lab(base).split(',')[0]} at equal n (n = {n}, the "
                        f"{where} samples compared)",
                        f"TV to the true new rows, {lab(base)} − {lab(METHOD)}, paired by seed (each arm at its "
                        "chosen lr)",
                        paired(d.by_seed(base, n, TV), d.by_seed(METHOD, n, TV)),
                        "higher",
                        margin,
                    )
                )
    method_runs = [r for a in d.arms if a not in BASELINES and a != OUTPUT_ROWS for r in d.runs(a)]
    if method_runs:
        found.append(
            Claim(
                "no forgetting: new input rows only leave old-only contexts unchanged",
                f"max |Δ logit| on old-only contexts, per run ({len(method_runs)} runs of the new-rows arms without "
                "output rows)",
                stat(r.last(FORGETTING[0]) for r in method_runs),
                "within",
                1e-6,
                3,
            )
        )
    if OUTPUT_ROWS in d.arms:
        found.append(
            Claim(
                f"with output rows, old-only contexts lose less than {mass_band:g} of their probability to the new "
                "tokens",
                f"probability on the new tokens after old-only contexts, {lab(OUTPUT_ROWS)}, mean over the n grid per "
                f"seed (band {mass_band})",
                stat(grid_mean(d, OUTPUT_ROWS, MASS).values()),
                "within",
                mass_band,
            )
        )
    return found


CANNOT_TEST = (
    "the paper's scale (real LMs, real new words, dictionaries chosen from definitions or translations) and its "
    "theorem's constants; here the chain is first-order, the model a 2-layer Llama whose dictionary-mixed input row "
    "cannot reproduce the mixed successor row exactly (each s has its own TV floor), n is a grid of a few values "
    "(n needed is interpolated between them), and forgetting is measured on held-out contexts of the same chain."
)


# -- the page --------------------------------------------------------------------------------------------------------
def build(sweep: Sweep, out: Path) -> list[Path]:
    first = next(r for r in sweep.runs if r.finished)
    labels = first.get("demo.labels", {}) or {}
    fractions = [float(f) for f in (first.get("demo.gap_closed") or [0.9])]
    band = float(first.get("demo.slope_band", 0.5))
    margin = float(first.get("demo.margin", 0.01))
    mass_band = float(first.get("demo.mass_band", 0.01))
    d = design(sweep)

    def lab(arm: str) -> str:
        return labels.get(arm, arm)

    dict_arms = dictionary_arms(d)
    fits = [needed_for(d, f, dict_arms) for f in fractions] if dict_arms else []
    headline = fits[0] if fits else None
    all_claims = claims(d, labels, headline, band, margin, mass_band)
    verdict = verdict_section(all_claims, CANNOT_TEST)
    png = plot(d, lab, dict_arms, fits, out / f"{PAPER}.png")

    tv_rows = [
        [lab(a), len({r.seed for r in d.runs(a)}), fmt_stat(stat(r.last(TV_START) for r in d.runs(a)), ci=False)]
        + [fmt_stat(stat(r.last(TV) for r in d.runs(a, n)), ci=False) for n in d.ns]
        for a in d.arms
    ]
    text = [
        "# Vocabulary extension demo: new tokens on a Markov chain, samples needed vs dictionary size, forgetting",
        "",
        "Paper: *Memory as a Markov Matrix: Sample Efficient Knowledge Expansion via Token-to-Dictionary Mapping* "
        "(arXiv 2605.04308). Built through the demo path (`conf/demo/vocab_extend.yaml`, page builder "
        "`demos/vocab_extend.py`). Toy scale on a shared CPU: this page reports what was measured.",
        "",
        *fair_test(d, sweep, lab, all_claims),
        provenance(sweep, PAPER),
        "",
        *setup(first, d, sweep, lab),
        "",
        "## Learning rate chosen per arm",
        "",
        f"Each arm has a grid of {'/'.join(sorted({str(len(d.levels(a, d.tune_n))) for a in d.arms}))} learning "
        f"rates (`demo.lr_grid`), every point run at n = {d.tune_n}; the page keeps the point "
        "with the lowest validation loss (mean over the seeds every point was run on) and reports that point's runs "
        "at every n below.",
        "",
        table(
            ["arm", f"grid point (lr): validation loss at n = {d.tune_n}", "chosen", "point of the reported runs"],
            selection_rows(d, lab),
        ),
        "## TV to the true new rows vs n (mean ± sd over seeds)",
        "",
        "`transition_tv/new_tv`: mean over the 8 new tokens and "
        f"{first.get('callbacks.transition_tv.contexts_per_token')} held-out contexts each of "
        "TV(p̂(· | context + new token), P'_j), after training on n new-token transitions (n/8 per token); 'untrained': "
        "the same at fit start (the rows' initialisation).",
        "",
        table(["arm", "seeds", "untrained", *(f"n = {n}" for n in d.ns)], tv_rows),
        *baseline_section(d, lab),
        *needed_section(d, fits, band),
        f"![TV vs n and n needed vs s]({png.name})",
        "",
        *forgetting_section(d, lab, first),
        "What this toy can and cannot show: " + CANNOT_TEST,
        "",
    ]
    return [write_page(out, PAPER, text, verdict), png]


def selection_rows(d: Design, lab: Callable[[str], str]) -> list[list[Any]]:
    """Per arm: each grid point's learning rate and validation loss at ``tune_n``, the chosen point, and the point the
    reported runs used at every n."""
    rows = []
    for a in d.arms:
        points = []
        for lv in d.levels(a, d.tune_n):
            run = next(iter(d.cells[(a, d.tune_n, lv)].values()))
            points.append(f"{lv} ({float(run.get('module.optimizer.lr')):g}): {d.tuning_loss(a, lv):.4f}")
        used = sorted({lv for (x, _), lv in d.used.items() if x == a})
        rows.append(
            [
                lab(a),
                "; ".join(points) or "n/a",
                f"{d.chosen[a]}" if a in d.chosen else "n/a",
                ", ".join(used),
            ]
        )
    return rows


def baseline_section(d: Design, lab: Callable[[str], str]) -> list[str]:
    others = [a for a in (*BASELINES, FREE, OUTPUT_ROWS) if a in d.arms and a != METHOD]
    if METHOD not in d.arms or not others:
        return []
    rows, reading = [], []
    for a in others:
        cells, better, worse = [], [], []
        for n in d.ns:
            p = paired(d.by_seed(a, n, TV), d.by_seed(METHOD, n, TV))
            cells.append("n/a" if p.n < 2 else f"{p.mean:+.3f} [{p.lo:+.3f}, {p.hi:+.3f}]")
            if p.n >= 2 and p.lo > 0:
                better.append(n)
            elif p.n >= 2 and p.hi < 0:
                worse.append(n)
        rows.append([f"{lab(a)} − {lab(METHOD)}", *cells])
        if a in BASELINES:
            reading.append(
                f"- Against {lab(a)}: the method is closer to the true rows at n in {{{', '.join(map(str, better))}}}, "
                f"{lab(a)} at n in {{{', '.join(map(str, worse))}}} (intervals excluding 0; the other n are not "
                "resolved)."
            )
    return [
        "## The method against the baselines at equal n",
        "",
        "Paired by seed (same chain, dictionaries and rows), each arm at its chosen learning rate: TV of the arm "
        f"minus TV of {lab(METHOD)}, mean and {round(100 * CONFIDENCE)}% CI (positive: the method is closer to the "
        "true rows).",
        "",
        table(["difference", *(f"n = {n}" for n in d.ns)], rows),
        *reading,
        "",
    ]


def needed_section(d: Design, fits: list[Needed], band: float) -> list[str]:
    if not fits:
        return []
    arms = dictionary_arms(d)
    change = ", ".join(
        f"s = {dictionary_size(d.runs(a)[0])}: {fmt_stat(asymptote_change(d, a), ci=False)}" for a in arms
    )
    lines = [
        "## n needed vs s (dictionary mode), relative to each s's own asymptote",
        "",
        "Each s has its own TV floor (a mixed input row passed through the frozen network cannot reproduce the mixed "
        "successor row exactly), so a fixed threshold would measure the floor. Per seed, 'start' is the TV of the "
        f"untrained rows (fit start) and the asymptote the TV at the largest n ({d.ns[-1]}); n needed is the n at "
        "which the TV has closed the given fraction of that gap (linear interpolation in log n between grid points; "
        f"'<= {d.ns[0]}': already there at the smallest n, left out of the fit). How close the largest n is to the "
        f"asymptote: the TV's fall from n = {d.ns[-2] if len(d.ns) > 1 else d.ns[0]} to n = {d.ns[-1]} as a share of "
        f"the gap (mean ± sd over seeds), {change}.",
        "",
    ]
    for fit in fits:
        lines += [
            f"**{fit.fraction:.0%} of the gap closed**",
            "",
            table(
                ["s", "start TV", "asymptote TV", "n needed, per seed", "mean ± sd (inside the grid)", "inside"],
                fit.rows,
            ),
            fit_sentence(fit, band),
            "",
        ]
    return lines


def forgetting_section(d: Design, lab: Callable[[str], str], first: Run) -> list[str]:
    rows = []
    for a in d.arms:
        runs = d.runs(a)
        if not runs:
            continue
        rows.append(
            [
                lab(a),
                len(runs),
                *(f"{max(r.last(m) for r in runs):.3g}" for m in FORGETTING),
                f"{max(r.last(MASS) for r in runs):.3g}",
                f"{sum(r.last(FORGETTING[0]) == 0.0 and r.last(FORGETTING[1]) == 0.0 for r in runs)}/{len(runs)}",
                f"{max(r.last(MASKED[1]) for r in runs):.3g}",
                *(f"{max(r.last(m) for r in runs):.3g}" for m in REMOVAL),
                f"{sum(all(r.last(m) == 0.0 for m in REMOVAL) for r in runs)}/{len(runs)}",
            ]
        )
    lines = [
        "## Forgetting and reversibility (old-only held-out contexts)",
        "",
        f"Forgetting: max |Δ logit| over the old tokens and mean KL(p_base ‖ p) on "
        f"{first.get('callbacks.forgetting.max_contexts')} held-out old-chain contexts (every position), against the "
        "model at fit start; new-token mass: the probability p puts on the new tokens there; 'masked': the same KL "
        "with the new-token logits masked while the context holds no new token. Reversibility: after "
        "`vocab_extension.remove()`, the largest change of any entry of the model's state and of the old-context "
        "logits against copies taken at fit start. Maxima over all n and seeds of the arm (chosen learning rates).",
        "",
        table(
            [
                "arm",
                "runs",
                "max |Δ logit|",
                "max KL mean",
                "max new-token mass",
                "runs with both exactly 0",
                "masked: max KL mean",
                "after remove(): max |Δ param|",
                "after remove(): max |Δ logit|",
                "runs restored exactly",
            ],
            rows,
        ),
    ]
    if OUTPUT_ROWS in d.arms:
        lines += output_rows_section(d, lab)
    return lines


def output_rows_section(d: Design, lab: Callable[[str], str]) -> list[str]:
    """What old-only contexts lose when the new tokens can be emitted, and what the output rows cost the new rows."""
    rows = []
    for name, fn in (
        ("new-token mass, every position of the old-only contexts", lambda r: r.last(MASS)),
        ("KL(p_base ‖ p), same positions", lambda r: r.last(FORGETTING[1])),
        ("−log(1 − mass) at the mean mass (the KL if the mass were equal everywhere)", None),
        ("new-token mass after the old-only TV contexts", lambda r: r.last(OLD_NEW_MASS)),
        ("TV to the true old rows minus the base model's", lambda r: r.last(OLD_TV_CHANGE)),
        ("masked: KL(p_base ‖ p)", lambda r: r.last(MASKED[1])),
    ):
        cells = []
        for n in d.ns:
            runs = d.runs(OUTPUT_ROWS, n)
            if not runs:
                cells.append("n/a")
            elif fn is None:
                mass = _mean(r.last(MASS) for r in runs)
                cells.append(f"{-math.log1p(-mass):.4f}" if mass < 1 else "n/a")
            else:
                cells.append(fmt_stat(stat(fn(r) for r in runs), 4, ci=False))
        rows.append([name, *cells])
    tv_cost = []
    if METHOD in d.arms:
        for n in d.ns:
            p = paired(d.by_seed(OUTPUT_ROWS, n, TV), d.by_seed(METHOD, n, TV))
            tv_cost.append("n/a" if p.n < 2 else f"{p.mean:+.3f} [{p.lo:+.3f}, {p.hi:+.3f}]")
        rows.append([f"TV to the true new rows, {lab(OUTPUT_ROWS)} − {lab(METHOD)} (paired)", *tv_cost])
    mass = stat(grid_mean(d, OUTPUT_ROWS, MASS).values())
    logit = max((r.last(FORGETTING[0]) for r in d.runs(OUTPUT_ROWS)), default=math.nan)
    masked = max((r.last(MASKED[1]) for r in d.runs(OUTPUT_ROWS)), default=math.nan)
    return [
        f"**Output rows: what old-only contexts lose** ({lab(OUTPUT_ROWS)}; mean ± sd over seeds, chosen learning "
        "rates). The loss never targets a new token (the rows hold new tokens only in the prompt), so training can "
        "only push the new logits down on old contexts; with tied embeddings the new output rows are the new input "
        "rows, so that push also moves the rows the transitions are learned with.",
        "",
        table(["measure", *(f"n = {n}" for n in d.ns)], rows),
        f"Trade-off, from these runs: the old logits stay exact (max |Δ logit| {logit:.3g}), but the new tokens take "
        f"{fmt_stat(mass, 4)} of the probability after old-only contexts (mean over the n grid, per seed), and every "
        "old probability shrinks by the factor 1 − mass; masking the new logits until a new token appears restores "
        f"the base model's distribution exactly (masked max KL {masked:.3g}) at the price of never emitting a new "
        "token spontaneously.",
        "",
    ]


def fair_test(d: Design, sweep: Sweep, lab: Callable[[str], str], all_claims: list[Claim]) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""
    lines = ["## Fair test", ""]
    base_arms = [b for b in BASELINES if b in d.arms]
    if base_arms:
        moved = {b: sum(r.last(FORGETTING[0]) > 0 for r in d.runs(b)) for b in base_arms}
        small = d.ns[0]
        overfit = "; ".join(
            f"{lab(b)}: TV {fmt_stat(stat(r.last(TV) for r in d.runs(b, small)), ci=False)} at n = {small} vs "
            f"{fmt_stat(stat(r.last(TV_START) for r in d.runs(b, small)), ci=False)} untrained"
            for b in base_arms
        )
        lines.append(
            "- **The baselines' failures can occur.** Full fine-tuning and LoRA train other weights on the same rows, "
            "so they can forget the old chain and overfit a few transitions: their old-context logits moved in "
            + ", ".join(f"{moved[b]} of {len(d.runs(b))} runs ({lab(b)})" for b in base_arms)
            + f"; at the smallest n, {overfit}."
        )
    if METHOD in d.arms and base_arms:
        start_m = stat(r.last(TV_START) for r in d.runs(METHOD))
        start_b = stat(r.last(TV_START) for b in base_arms for r in d.runs(b))
        lines.append(
            "- **The method's signal carries information the baselines lack.** Every arm gets the dictionary: the "
            "baselines' free new rows start at the mean of the dictionary's rows; the method keeps each new row a "
            "mixture of those rows (s weights to learn instead of 64 free entries, and no other weight), which is what "
            "makes it sample-efficient if the claim holds. The untrained rows start at TV "
            f"{fmt_stat(start_m, ci=False)} ({lab(METHOD)}) and {fmt_stat(start_b, ci=False)} (baselines' free rows)."
        )
    edges = [a for a, lv in d.chosen.items() if len(d.levels(a, d.tune_n)) > 2 and lv in d.edges(a)]
    grid = {a: len(d.levels(a, d.tune_n)) for a in d.arms}
    seeds = sorted({len(v) for v in d.tuning_seeds.values()})
    mismatch = d.mismatched
    lines += [
        f"- **Same tuning effort for every arm.** Each arm has a grid of "
        f"{', '.join(sorted(set(map(str, grid.values()))))} learning rates (`demo.lr_grid`), every point run at n = "
        f"{d.tune_n} on {', '.join(map(str, seeds))} seed(s) (the CPU allowed one grid per arm, not one per n); the "
        "point with the lowest validation loss is kept for every n and seed (table below). "
        + (
            f"{len(edges)} of {len(d.chosen)} choices fall on an edge of the grid (the best point may lie beyond it): "
            + ", ".join(f"{lab(a)} ({d.chosen[a]})" for a in edges)
            + "."
            if edges
            else "No choice falls on an edge of its grid."
        )
        + (
            " **The reported runs do not use the chosen point** at "
            + ", ".join(f"{lab(a)} n = {n} ({d.used[(a, n)]} instead of {d.chosen[a]})" for a, n in mismatch)
            + "."
            if mismatch
            else " The reported runs at every n use the chosen point."
        ),
        f"- **Chosen on a split that is not reported.** The choice reads `val/loss` on "
        f"{d.runs(d.arms[0])[0].get('datamodule.source.num_val')} validation rows of new-token transitions (the data "
        "source's validation split); the page reports TV on the held-out contexts of `TransitionTV` (drawn with "
        f"seed {d.runs(d.arms[0])[0].get('callbacks.transition_tv.seed')}, against the true rows), never used for a "
        "choice.",
    ]
    lines.append("- **Models trained to a plateau.** " + plateau_text(d, sweep, lab))
    per_arm = {a: len({r.seed for r in d.runs(a)}) for a in d.arms}
    seeds = min(per_arm.values(), default=0)
    counts = sorted(set(per_arm.values()))
    spread = (
        f"{counts[0]} seeds per arm"
        if len(counts) == 1
        else "seeds per arm: " + ", ".join(f"{lab(a)} {k}" for a, k in per_arm.items())
    )
    lines += [
        f"- **Seeds.** {spread} (chain, dictionaries, base model and rows vary together; paired comparisons use the "
        f"seeds both arms have); {seeds_note(all_claims, seeds, SMALL_EFFECT)}.",
        "",
    ]
    return lines


def val_change(run: Run) -> float:
    """Relative change of the validation loss from the previous validation to the last one (``nan`` with one)."""
    points = run.series(VAL)
    if len(points) < 2 or not points[-2][1]:
        return math.nan
    return (points[-1][1] - points[-2][1]) / points[-2][1]


def plateau_text(d: Design, sweep: Sweep, lab: Callable[[str], str]) -> str:
    parts = []
    falling_total, runs_total = 0, 0
    for a in d.arms:
        changes = [val_change(r) for r in d.runs(a)]
        changes = [c for c in changes if not math.isnan(c)]
        falling = sum(c < -PLATEAU for c in changes)
        falling_total += falling
        runs_total += len(changes)
        if changes:
            parts.append(f"{lab(a)} {100 * _mean(changes):+.1f}% ({falling} of {len(changes)} still falling)")
    base_loss = artifact_values(sweep.runs, "demo_policy", "val/loss")
    met = "met" if runs_total and falling_total == 0 else "not met"
    return (
        "Validation loss from halfway to the last step (mean relative change per arm; 'still falling': by more than "
        f"{100 * PLATEAU:.0f}%): "
        + "; ".join(parts)
        + f". A plateau in every reported run: **{met}**"
        + (f" ({falling_total} of {runs_total} runs still falling)" if falling_total else "")
        + ". A rising loss (small n, many epochs) is overfitting past the plateau, not under-training. The base "
        f"models: held-out loss {fmt_stat(stat(base_loss), ci=False)} nats per token (chain entropy rates on the "
        "setup line)."
    )


def setup(first: Run, d: Design, sweep: Sweep, lab: Callable[[str], str]) -> list[str]:
    """The setup paragraph, filled from the resolved config."""
    base_loss = artifact_values(sweep.runs, "demo_policy", "val/loss")
    entropy = [
        MarkovChain(
            int(r.get("task.num_states")),
            int(r.get("task.support")),
            float(r.get("task.concentration")),
            int(r.get("task.chain_seed")),
        ).entropy_rate()
        for r in {int(r.get("task.chain_seed")): r for r in sweep.runs if r.finished}.values()
    ]
    old_tv = stat(r.last(OLD_TV_START) for a in d.arms for r in d.runs(a))
    arms = "; ".join(
        f"{lab(a)} (`module.mode={d.runs(a)[0].get('module.mode')}`, `tuning="
        f"{d.runs(a)[0].get('module.tuning')}`, lr grid "
        + ", ".join(
            f"{float(next(iter(d.cells[(a, d.tune_n, lv)].values())).get('module.optimizer.lr')):g}"
            for lv in d.levels(a, d.tune_n)
        )
        + ")"
        for a in d.arms
        if d.runs(a)
    )
    return [
        f"Setup: random sparse Markov chain on T = {first.get('task.num_states')} old tokens (each row a Dirichlet "
        f"draw over {first.get('task.support')} successors; chain and dictionaries drawn per seed), one character "
        f"per state. Base model: {first.get('backbone.num_hidden_layers')}-layer Llama, hidden "
        f"{first.get('backbone.hidden_size')}, trained by `+method=sft` on {first.get('demo.model.num_train')} "
        f"chain sequences for {first.get('demo.model.steps')} steps (artifact cache, one per seed): held-out "
        f"loss {fmt_stat(stat(base_loss), ci=False)} nats per completion token (EOS included) vs the chains' "
        f"entropy rates {fmt_stat(stat(entropy), ci=False)}; its TV on old rows {fmt_stat(old_tv, ci=False)}. "
        f"m = {first.get('task.num_new_tokens')} new tokens; token j's successor row P'_j = Σ_i w_ji P_(D_j,i) over "
        f"a dictionary of s old states ({first.get('task.dictionary_weights')} weights). Each run trains on n ∈ "
        f"{{{', '.join(map(str, d.ns))}}} new-token transitions (per arm: "
        + ", ".join(f"{lab(a)} {{{', '.join(map(str, d.arm_ns(a)))}}}" for a in d.arms if d.arm_ns(a))
        + f"; rows of {first.get('task.length')} states: a chain "
        f"prefix, the new token, its successor and the chain onwards) for {first.get('trainer.max_steps')} steps of "
        f"batch {first.get('datamodule.batch_size')} (AdamW, weight decay {first.get('module.optimizer.weight_decay')}"
        f"). Arms: {arms}. Seeds {', '.join(map(str, d.seeds))} (how many per arm: the fair-test section).",
    ]


def plot(d: Design, lab: Callable[[str], str], dict_arms: list[str], fits: list[Needed], path: Path) -> Path:
    """TV vs n per arm (mean, 95% CI over seeds), and n needed vs s on log-log axes with the fit, per gap fraction
    (points inside the n grid only)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for a in d.arms:
        ns = d.arm_ns(a)
        if len(ns) < 2:
            continue
        stats = [stat(r.last(TV) for r in d.runs(a, n)) for n in ns]
        lo = [s.mean - s.lo if s.n > 1 else 0 for s in stats]
        hi = [s.hi - s.mean if s.n > 1 else 0 for s in stats]
        style = "--" if a in BASELINES else ":" if a in (FREE, OUTPUT_ROWS) else "-"
        axes[0].errorbar(ns, [s.mean for s in stats], yerr=[lo, hi], marker="o", capsize=3, ls=style, label=lab(a))
    axes[0].set(xscale="log", xlabel="n (new-token transitions)", ylabel="TV to true new rows", title="TV vs n")
    legend(axes[0], fontsize=6)
    xs = [dictionary_size(d.runs(a)[0]) for a in dict_arms]
    for color, fit in enumerate(fits):
        points = [(x, v) for x, a in zip(xs, dict_arms) for v in fit.needed[a] if not math.isnan(v) and v > d.ns[0]]
        if points:
            axes[1].scatter(*zip(*points), color=f"C{color}", alpha=0.7, label=f"{fit.fraction:.0%} of the gap")
        if not math.isnan(fit.slope):
            grid = [min(fit.sizes), max(fit.sizes)]
            axes[1].plot(
                grid,
                [math.exp(fit.intercept) * g**fit.slope for g in grid],
                color=f"C{color}",
                label=f"fit, slope {fit.slope:.2f}",
            )
    axes[1].set(xscale="log", yscale="log", xlabel="s (dictionary size)", ylabel="n needed", title="n needed vs s")
    if xs:
        axes[1].set_xticks(xs, [str(x) for x in xs])
    legend(axes[1], fontsize=7)
    return save_figure(fig, path)
