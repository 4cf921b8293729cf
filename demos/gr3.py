"""Page builder of the GR3 demo (arXiv 2603.10535): ``docs/results/gr3.md`` + ``gr3.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=gr3`` (``conf/demo/gr3.yaml``: setting × seed × shaper); page:
``python -m zoo.report demo gr3``. Read from the sweep: the GRPO module's logged ``train/completion_length``,
``train/accuracy``, ``train/reward``, ``train/gr3_alpha`` and ``val/exact_match`` series, the resolved configs and
``run_info.json`` (the base policy each run started from, whose SFT log gives its validation-loss curve). Only
finished runs are read; a setting or seed the sweep did not finish is named on the page.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from zoo.report import (
    Run,
    Sweep,
    base_policy_val_losses,
    curve,
    decaying_schedule_caveat,
    last_change,
    legend,
    paired_contrast,
    plot_curves,
    provenance,
    pyplot,
    save_figure,
    table,
    write_page,
)
from zoo.stats import Stat, fmt_stat, paired, stat
from zoo.verdict import Claim, seeds_note, verdict_section

PAPER = "gr3"
LENGTH = "train/completion_length"
REWARD = "train/reward"
EXACT = "val/exact_match"
CURVES = (LENGTH, "train/accuracy", EXACT)
# gr3_wide: GR3 with its calibration's alpha grid extended past the paper's largest value, a sensitivity check of the
# grid's edge (no claim of the paper reads it)
ARMS = ("grpo", "additive", "additive_strong", "gr3", "gr3_wide")
SETTINGS = ("rlhf", "rlvr")
SETTING_GROUP, ARM_GROUP = "demo/gr3/setting", "demo/gr3/arm"
# "final" values of a logged training series: the mean over the logged steps of the last TAIL steps (one logged step
# is 64 completions; the mean over several is less noisy); "early": the logged steps up to EARLY
TAIL = 20
EARLY = 5
# the smallest length (tokens) and exact-match effects that count in the verdict; the equivalence band of "keeps
# GRPO's accuracy"
LENGTH_MARGIN = 2.0
MARGIN = 0.02
KEEP_BAND = 0.05
# exact-match effects smaller than this call for at least 5 seeds
SMALL_EFFECT = 0.05
# a model is at a plateau when its curve moved by less than this fraction: the base policy's validation loss over its
# last epoch; each RL arm's training reward between the last quarter of training and the quarter before, mean over
# seeds (a single seed's reward dips and recovers within a run: one seed's quarter-to-quarter change reads its dips)
PLATEAU = 0.05
# settings every arm of a setting must share (the arms differ only by the shaper)
SHARED = (
    "module.optimizer",
    "module.group_size",
    "module.generation",
    "datamodule.batch_size",
    "datamodule.source",
    "trainer.max_steps",
    "base_policy",
    "backbone",
)


def mean(xs: Any) -> float:
    xs = [float(x) for x in xs if not math.isnan(float(x))]
    return sum(xs) / len(xs) if xs else math.nan


def window(run: Run, metric: str, first: float, last: float) -> float:
    """Mean of ``metric`` over its logged steps in ``[first, last]``."""
    return mean(v for s, v in run.series(metric) if first <= s <= last)


def final(run: Run, metric: str) -> float:
    """Mean of ``metric`` over the logged steps of the run's last :data:`TAIL` steps."""
    steps = [s for s, _ in run.series(metric)]
    return window(run, metric, max(steps) - TAIL + 1, max(steps)) if steps else math.nan


def early(run: Run, metric: str = LENGTH) -> float:
    """Mean of ``metric`` over the logged steps up to :data:`EARLY` (the start of RL, close to the base policy)."""
    return window(run, metric, 0, EARLY)


def logged_every(run: Run) -> str:
    """``at every step`` or ``every N steps`` (``trainer.log_every_n_steps``)."""
    n = run.get("trainer.log_every_n_steps")
    return "at every step" if n == 1 else f"every {n} steps"


def reward_change(run: Run) -> float:
    """Relative change of the mean training reward from the third to the last quarter of the run's steps."""
    steps = [s for s, _ in run.series(REWARD)]
    if not steps:
        return math.nan
    end = max(steps) + 1
    before = window(run, REWARD, end / 2, 3 * end / 4 - 1)
    after = window(run, REWARD, 3 * end / 4, end)
    return (after - before) / abs(before) if before else math.nan


class Demo:
    """The finished runs of the sweep by setting, arm and seed."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.runs = [r for r in sweep.runs if r.finished]
        found = {self.setting(r) for r in self.runs}
        self.settings = [s for s in SETTINGS if s in found] + sorted(s for s in found if s not in SETTINGS)
        self.shapers = [a for a in ARMS if any(self.shaper(r) == a for r in self.runs)]
        self.labels: dict[str, str] = {}
        for run in sweep.runs:  # launches of different dates may each know a different set of arms
            for key, label in (run.get("demo.labels", {}) or {}).items():
                self.labels.setdefault(key, label)

    @staticmethod
    def setting(run: Run) -> str | None:
        """The run's setting (``demo/gr3/setting``), swept or given once on the command line."""
        return run.group_choice(SETTING_GROUP) or run.choice(SETTING_GROUP)

    @staticmethod
    def shaper(run: Run) -> str | None:
        return run.group_choice(ARM_GROUP) or run.choice(ARM_GROUP)

    def of(self, setting: str | None, arm: str) -> list[Run]:
        return [r for r in self.runs if self.setting(r) == setting and self.shaper(r) == arm]

    def by_seed(self, setting: str | None, arm: str, fn: Any) -> dict[Any, float]:
        """``{seed: fn(run)}``: the unit of the paired comparisons (the arms of a seed share the base policy, the
        prompt order and the sampling seed)."""
        return {r.seed: float(fn(r)) for r in self.of(setting, arm)}

    def effect(self, setting: str | None, a: str, b: str, fn: Any) -> Stat:
        return paired(self.by_seed(setting, a, fn), self.by_seed(setting, b, fn))

    def lab(self, key: str | None) -> str:
        return self.labels.get(key, key) if key else "setting not recorded"


def calibrated_alphas(runs: list[Run]) -> tuple[list[float], Stat, int]:
    """The calibration grid of the runs (the first run's ``alpha_grid``; ``[]`` without runs), the alpha each ended
    at, and how many ended at the grid's largest value."""
    grid = [float(a) for a in (runs[0].get("callbacks.gr3_calibration.alpha_grid") or [])] if runs else []
    ends = [r.last("train/gr3_alpha") for r in runs]
    top = sum(math.isclose(a, max(grid), rel_tol=1e-6) for a in ends) if grid else 0
    return grid, stat(ends), top


def wider_grid(demo: Demo) -> str:
    """The sensitivity check of the calibration's grid edge (arm ``gr3_wide``, when it ran): where its alpha ends, and
    its length and exact match against GR3 on the paper's grid, per setting, paired by seed; ``""`` without it."""
    wide = [r for s in demo.settings for r in demo.of(s, "gr3_wide")]
    if not wide:
        return ""
    grid, alphas, top = calibrated_alphas(wide)
    parts = []
    for setting in demo.settings:
        if not demo.of(setting, "gr3_wide") or not demo.of(setting, "gr3"):
            continue
        length = demo.effect(setting, "gr3_wide", "gr3", final_length)
        exact = demo.effect(setting, "gr3_wide", "gr3", last_exact)
        parts.append(
            f"{demo.lab(setting).split(':')[0]}: completion length {length.mean:+.1f} [{length.lo:+.1f}, "
            f"{length.hi:+.1f}], final exact match {exact.mean:+.3f} [{exact.lo:+.3f}, {exact.hi:+.3f}] (n={exact.n})"
        )
    return (
        f" With the grid extended to {max(grid):g} ({demo.lab('gr3_wide')}, a sensitivity check, not a claim of the "
        f"paper) the calibrated alpha ends at {fmt_stat(alphas, 2, ci=False)} over {alphas.n} runs, {top} of them at "
        "the extended grid's largest value"
        + (f"; against GR3 on the paper's grid, paired by seed: {'; '.join(parts)}" if parts else "")
        + "."
    )


def last_exact(run: Run) -> float:
    return run.last(EXACT)


def final_length(run: Run) -> float:
    return final(run, LENGTH)


# -- the verdict ------------------------------------------------------------------------------------------------------
def claims(demo: Demo) -> list[Claim]:
    """The paper's claims (abstract: GR3 keeps GRPO-like training dynamics and downstream scores on RLHF and RLVR
    while strongly reducing length, and beats length-regularized baselines; its multiplicative, reward-gated rescaling
    avoids the additive penalty's "compensatory" shortcut) as this demo tests them, per setting, each a difference
    paired by seed."""
    found = []
    lab = demo.lab
    for setting in demo.settings:
        where = lab(setting).split(":")[0]
        found += [
            Claim(
                f"GR3 reduces completion length relative to GRPO ({where})",
                f"completion length over the last {TAIL} steps, {lab('gr3')} − {lab('grpo')}, tokens (a cut counts "
                f"beyond {LENGTH_MARGIN:g})",
                demo.effect(setting, "gr3", "grpo", final_length),
                "lower",
                LENGTH_MARGIN,
                digits=1,
            ),
            Claim(
                f"GR3 keeps GRPO's accuracy ({where})",
                f"final validation exact match, {lab('gr3')} − {lab('grpo')} (kept: no loss beyond {KEEP_BAND})",
                demo.effect(setting, "gr3", "grpo", last_exact),
                "not_lower",
                KEEP_BAND,
            ),
            Claim(
                f"GR3 beats a length-regularized baseline ({where})",
                f"final validation exact match, {lab('gr3')} − {lab('additive')}",
                demo.effect(setting, "gr3", "additive", last_exact),
                "higher",
                MARGIN,
            ),
            Claim(
                f"GR3 avoids the additive penalty's compensatory shortcut ({where})",
                f"final validation exact match, {lab('gr3')} − {lab('additive_strong')}",
                demo.effect(setting, "gr3", "additive_strong", last_exact),
                "higher",
                MARGIN,
            ),
        ]
    return found


def cannot_test(demo: Demo) -> str:
    missing = [lab for s in SETTINGS if s not in demo.settings for lab in [demo.lab(s)]]
    text = (
        "the paper's models, benchmarks (AIME, MATH500, Arena-Hard, ...) and its length cuts; a real reward model "
        "(the RLHF setting's proxy rewards length by construction); a tuned length-regularized baseline (the additive "
        "penalty is run at two fixed lambdas, not swept)"
    )
    if missing:
        text += f"; the setting{'s' if len(missing) > 1 else ''} {', '.join(missing)}, not run in this sweep"
    return text + "."


# -- the fair test ----------------------------------------------------------------------------------------------------
def fair_test(demo: Demo, found: list[Claim]) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""
    lab = demo.lab
    lines = ["## Fair test", ""]
    failures = []
    for setting in demo.settings:
        growth = paired(demo.by_seed(setting, "grpo", final_length), demo.by_seed(setting, "grpo", early))
        occurs = "occurs" if growth.n >= 2 and growth.lo > 0 else "does not occur (the interval reaches 0 or below)"
        grpo = demo.of(setting, "grpo")
        failures.append(
            f"{lab(setting).split(':')[0]}: GRPO's length goes from {mean(early(r) for r in grpo):.1f} (logged steps "
            f"up to {EARLY}) to {mean(final_length(r) for r in grpo):.1f} (last {TAIL} steps), growth "
            f"{fmt_stat(growth, 1)} tokens: the length growth GR3 targets **{occurs}**"
        )
        strong = demo.of(setting, "additive_strong")
        if strong:
            failures[-1] += (
                f"; the strong additive penalty ends at length {mean(final_length(r) for r in strong):.1f} and exact "
                f"match {mean(last_exact(r) for r in strong):.3f} (GRPO {mean(last_exact(r) for r in grpo):.3f})"
            )
    lines.append("- **The baseline's failure can occur.** " + "; ".join(failures) + ".")
    gr3 = [r for s in demo.settings for r in demo.of(s, "gr3")]
    grid, alphas, top = calibrated_alphas(gr3)
    at_top = (
        f"; {top} of {len(gr3)} runs end at the grid's largest alpha {max(grid):g}, where the calibration constraint "
        "never binds"
        if grid
        else ""
    )
    lines.append(
        "- **The method's signal carries information the baseline lacks.** GRPO sees no length; the additive penalty "
        "sees each completion's absolute length and charges wrong answers too; GR3 divides the reward by "
        "1 + alpha · length / (its group's mean length), so the budget follows each prompt's own group and a zero "
        f"reward stays zero. Its calibrated alpha ends at {fmt_stat(alphas, 2, ci=False)} over {alphas.n} runs"
        + at_top
        + "."
        + wider_grid(demo)
    )
    differ = []
    for setting in demo.settings:
        runs = [r for a in demo.shapers for r in demo.of(setting, a)]
        for key in SHARED:
            # within a seed (the seeds vary the data and initialisation seeds by design)
            if any(len({repr(r.get(key)) for r in runs if r.seed == seed}) > 1 for seed in {r.seed for r in runs}):
                differ.append(f"{key} ({lab(setting).split(':')[0]})")
    lams = {
        a: demo.of(s, a)[0].get("module.shaper.lam")
        for s in demo.settings
        for a in ("additive", "additive_strong")
        if demo.of(s, a)
    }
    first = demo.runs[0]
    same = (
        f"every arm shares lr {first.get('module.optimizer.lr')}, G={first.get('module.group_size')}, "
        f"{first.get('datamodule.batch_size')} prompts per step, {first.get('trainer.max_steps')} steps and the base "
        "policy"
        if not differ
        else f"**settings differ between arms: {', '.join(differ)}**"
    )
    lines.append(
        f"- **Same tuning effort for every arm.** No arm is selected by a score: {same}. The additive penalty runs at "
        f"two fixed lambdas ({', '.join(f'{v:g}' for v in dict.fromkeys(lams.values()) if v is not None)}), both "
        "reported; GR3's alpha is set by its own online calibration (the paper's procedure, part of the method) from "
        f"the start value {first.get('module.shaper.alpha', gr3[0].get('module.shaper.alpha') if gr3 else None)}. "
        "No arm's learning rate or steps were swept."
    )
    lines.append(
        "- **Chosen on a split that is not reported.** Nothing is chosen on the reported validation prompts: the "
        "lambdas are fixed, and GR3's calibration reads only its training rollout groups."
    )
    logged = {tuple(c) for c in (base_policy_val_losses(r) for r in demo.runs) if c}
    base_curves = {c for c in logged if len(c) >= 2}
    if logged and not base_curves:
        base = "the base policy validated once, so no change of its validation loss can be read (**not shown**)"
    elif base_curves:
        changes = [last_change(c) for c in base_curves]
        worst = max(changes, key=abs)
        base = (
            f"the base policy's validation loss changed by {100 * worst:+.1f}% over its last epoch "
            f"(**{'met' if abs(worst) < PLATEAU else 'not met'}**)"
        )
    else:
        base = "the base policy's validation-loss log was not found (**not shown**)"
    rl = []
    for setting in demo.settings:
        cells = []
        for arm in demo.shapers:
            change = [reward_change(r) for r in demo.of(setting, arm)]
            worst = max((c for c in change if not math.isnan(c)), key=abs, default=math.nan)
            if math.isnan(worst):
                cells.append(f"{lab(arm)} n/a (no reward before the last quarter: not shown)")
                continue
            arm_change = mean([c for c in change if not math.isnan(c)])
            met = "met" if abs(arm_change) < PLATEAU else "**not met**"
            cells.append(f"{lab(arm)} {100 * arm_change:+.1f}% (worst seed {100 * worst:+.1f}%): {met}")
        rl.append(f"{lab(setting).split(':')[0]}: " + ", ".join(cells))
    lines.append(
        f"- **Models trained to a plateau.** A plateau is a change below {100 * PLATEAU:.0f}%: {base}. RL arms, change "
        "of the mean training reward from the third to the last quarter of the steps, mean over seeds (a single "
        "seed's reward dips and recovers within a run, so its own quarter-to-quarter change reads its dips; the seed "
        "that moved most is shown beside it): "
        + "; ".join(rl)
        + "."
        + decaying_schedule_caveat(demo.runs, "base_policy", "epoch", relative=PLATEAU, whose="The base policy's")
    )
    seeds = len({r.seed for r in demo.runs})
    lines.append(
        f"- **Seeds.** {seeds} seed{'s' if seeds != 1 else ''} (the RL phase's prompt order and sampling; one base "
        f"policy for all); {seeds_note([c for c in found if c.digits == 3], seeds, SMALL_EFFECT)} (exact-match "
        "effects)."
    )
    return [*lines, ""]


# -- the page ---------------------------------------------------------------------------------------------------------
def setting_section(demo: Demo, setting: str | None) -> list[str]:
    rows = []
    for shaper in demo.shapers:
        runs = demo.of(setting, shaper)
        rows.append(
            [
                demo.lab(shaper),
                str(len(runs)),
                fmt_stat(stat(early(r) for r in runs), 1, ci=False),
                fmt_stat(stat(final_length(r) for r in runs), 1),
                fmt_stat(stat(final(r, "train/accuracy") for r in runs)),
                fmt_stat(stat(final(r, REWARD) for r in runs)),
                fmt_stat(stat(last_exact(r) for r in runs)),
                fmt_stat(stat(r.last("train/gr3_alpha") for r in runs), 2, ci=False)
                if shaper.startswith("gr3")
                else "",
            ]
        )
    return [
        f"## {demo.lab(setting)}",
        "",
        table(
            [
                "arm",
                "seeds",
                f"length (logged steps ≤ {EARLY})",
                f"length (last {TAIL} steps)",
                f"train accuracy (last {TAIL} steps)",
                f"reward (last {TAIL} steps)",
                "val exact match (last)",
                "GR3 alpha (last, calibrated)",
            ],
            rows,
        ),
        *reading(demo, setting),
        "",
    ]


def reading(demo: Demo, setting: str | None) -> list[str]:
    """Contrasts for one setting, paired by seed ("not shown" when the interval contains 0)."""

    def line(a: str, b: str, fn: Any, what: str) -> str:
        if not demo.of(setting, a) or not demo.of(setting, b):
            return ""
        return (
            "- "
            + paired_contrast(
                demo.lab(a), demo.by_seed(setting, a, fn), demo.lab(b), demo.by_seed(setting, b, fn), what
            )
            + "."
        )

    lines = [
        line("gr3", "grpo", final_length, f"Completion length (last {TAIL} steps)"),
        line("additive", "grpo", final_length, f"Completion length (last {TAIL} steps)"),
        line("gr3", "additive", final_length, f"Completion length (last {TAIL} steps)"),
        line("gr3", "grpo", last_exact, "Final validation exact match"),
        line("gr3", "additive", last_exact, "Final validation exact match"),
        line("gr3", "additive_strong", last_exact, "Final validation exact match"),
    ]
    return [x for x in lines if x]


def build(sweep: Sweep, out: Path) -> list[Path]:
    demo = Demo(sweep)
    first = demo.runs[0]
    png = plot(demo, out / f"{PAPER}.png")
    seeds = sorted({r.seed for r in demo.runs})
    task = str(first.get("task._target_", "")).rsplit(".", 1)[-1]
    found = claims(demo)
    text = [
        "# GR3 demo: GRPO vs additive length penalty vs GR3 (toy scale)",
        "",
        "Paper: *GR3* (arXiv:2603.10535). Built through the demo path (`conf/demo/gr3.yaml`, page builder "
        "`demos/gr3.py`).",
        "",
        provenance(sweep, PAPER),
        "",
        f"Setup: tiny Llama from the cached base SFT policy of the task ({task}); GRPO with "
        f"G={first.get('module.group_size')}, {first.get('datamodule.batch_size')} prompts per step, "
        f"max {first.get('module.generation.max_new_tokens')} new tokens, lr {first.get('module.optimizer.lr')}, "
        f"{first.get('trainer.max_steps')} steps per run; finished runs read: {len(demo.runs)} of {len(sweep.runs)} "
        f"(seeds {', '.join(map(str, seeds))}). Cells: mean ± sd over seeds [95% confidence interval, Student t]; "
        f"lengths are generated tokens (EOS included); training series are logged {logged_every(first)}. Contrasts "
        "are paired by seed (the arms of a seed share the "
        "base policy, the prompt order and the sampling seed).",
        "",
        *fair_test(demo, found),
    ]
    for setting in demo.settings:
        text += setting_section(demo, setting)
    text += [f"![curves]({png.name})", ""]
    verdict = verdict_section(found, cannot_test(demo))
    return [write_page(out, PAPER, text, verdict), png]


def plot(demo: Demo, path: Path) -> Path:
    """One row per setting, one panel per metric: mean curve over seeds with its 95% band."""
    plt = pyplot()
    settings = demo.settings or [None]
    fig, axes = plt.subplots(
        len(settings), len(CURVES), figsize=(4.6 * len(CURVES), 3.3 * len(settings)), squeeze=False
    )
    for row, setting in zip(axes, settings):
        for ax, metric in zip(row, CURVES):
            plot_curves(ax, {demo.lab(s): curve(demo.of(setting, s), metric) for s in demo.shapers})
            ax.set_title(f"{demo.lab(setting) if setting else ''}\n{metric}", fontsize=8)
            ax.set_xlabel("step")
        legend(row[0], fontsize=7)
    return save_figure(fig, path)
