"""Page builder of the ThoughtFold demo (arXiv 2606.03503): ``docs/results/thoughtfold.md`` + ``thoughtfold.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=thoughtfold`` (``conf/demo/thoughtfold.yaml``: arm × grid point ×
seed); page: ``python -m zoo.report demo thoughtfold``. Every arm has a grid of settings of its knob
(``demo.grid``); each run decodes the held-out prompts greedily at its last step (``EvalRecords``:
``eval_records.jsonl``). The first half of those prompts is the selection split: each arm's setting is the one with
the fewest think tokens among those whose mean exact match there is within ``demo.em_tolerance`` of the arm's best;
the second half is the reported split. Also read: ``ReasoningRedundancy``'s ``train/*`` curves, ThoughtFold's
``train/tf_*`` (pairs, validation samples and tokens), ``LineRemovalProbe``'s ``probe/*`` (does verification fail
when an essential line is removed), the trained pairs (``preference_pairs.jsonl``) and the resolved configs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import instantiate

from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    build_run,
    curve,
    legend,
    plot_curves,
    provenance,
    pyplot,
    quarter_change,
    save_figure,
    table,
    write_page,
)
from zoo.rl.thoughtfold import reasoning_stats
from zoo.stats import Stat, fmt_stat, paired, stat
from zoo.verdict import Claim, verdict_section

PAPER = "thoughtfold"
ARM_KEY = "demo/thoughtfold/arm"
POINT_KEY = "demo.point"
ARMS = ("grpo", "additive", "gr3", "thoughtfold")
BASELINES = ("grpo", "additive", "gr3")
CURVES = ("train/think_tokens", "train/redundant_rate", "train/essential_retention", "train/accuracy")
METRICS = ("exact_match", "think_tokens", "redundant_rate", "essential_retention")
RECORDS = "eval_records.jsonl"
# an essential step of the task (``2*3=6``; a redundant one is ``check ok`` or ``check 6``)
ESSENTIAL_STEP = re.compile(r"\d[*+]\d+=")
# the equivalence bands of "equal accuracy" (exact match, a share of 64 prompts per seed) and "keeps every essential
# line" (essential-line retention)
SAME_EM = 0.05
SAME_RETENTION = 0.02
SEEDS_FOR_SMALL_EFFECTS = 5
# verification "fails" when an essential line is removed: the upper end of the pass rate's interval is below this
ESSENTIAL_PASS_LIMIT = 0.05
# a training curve is at a plateau when its mean change from the third to the last quarter of the steps is below this
# fraction of its third-quarter level (the zoo's plateau reading, as on the GR3 page)
PLATEAU = 0.05


def base_train_prompts(run: Run) -> set[str]:
    """The prompts of the base policy's SFT training rows (its build's ``datamodule.source``, drawn again from its
    resolved config; empty when the artifact is gone)."""
    for used in run.artifacts("base_policy"):
        config = build_run(used).config
        if config:
            source = instantiate(config["datamodule"]["source"])
            return {row["prompt"] for row in source.rows("train")}
    return set()


def split_stats(run: Run) -> dict[str, dict[str, float]]:
    """Per split (``selection``: the first half of the run's held-out prompts in evaluation order, ``reported``: the
    second half), the means of exact match, think tokens (character tokenizer: one token per character of the
    reasoning body), redundant-line rate and essential-line retention (these two over completions with a reasoning
    block), from the run's ``EvalRecords`` of its last validation."""
    if not run.file(RECORDS).is_file():
        return {}
    records = [r for r in run.read_jsonl(RECORDS) if r.get("stage") == "validate"]
    if not records:
        return {}
    last = max(r["step"] for r in records)
    records = [r for r in records if r["step"] == last]
    tokenizer = build_char_tokenizer()

    def count(body: str) -> int:
        return len(tokenizer(body, add_special_tokens=False)["input_ids"])

    half = len(records) // 2
    out = {}
    for split, rows in (("selection", records[:half]), ("reported", records[half:])):
        stats = [reasoning_stats(r["completion"], r["reference"], r["step_redundant"], count) for r in rows]
        steps = [s for s in stats if "think_steps" in s]
        out[split] = {
            "exact_match": sum(bool(r.get("correct")) for r in rows) / max(len(rows), 1),
            "think_tokens": sum(s["think_tokens"] for s in stats) / max(len(stats), 1),
            "redundant_rate": sum(s["redundant_rate"] for s in steps) / len(steps) if steps else math.nan,
            "essential_retention": sum(s["essential_retention"] for s in steps) / len(steps) if steps else math.nan,
            "prompts": float(len(rows)),
        }
        out[split]["prompt_list"] = [r["prompt"] for r in rows]  # type: ignore[assignment]
    return out


@dataclass
class Choice:
    """An arm's setting picked on the selection split, and every setting's selection-split means over seeds."""

    point: str
    means: dict[str, dict[str, float]]


class Grid:
    """The runs by (arm, grid point) with their per-split statistics, the labels and the selection."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.head = sweep.runs[0]
        self.labels = self.head.get("demo.labels", {}) or {}
        self.grid = self.head.get("demo.grid", {}) or {}
        self.knobs = self.head.get("demo.knobs", {}) or {}
        self.tolerance = float(self.head.get("demo.em_tolerance", 0.0))
        self.stats = {id(r): split_stats(r) for r in sweep.runs}
        self.arms = [a for a in ARMS if self.runs_of(a)]
        self.points = sorted({str(r.arm.get(POINT_KEY, r.get(POINT_KEY))) for r in sweep.runs})
        self.choices = {arm: self.select(arm) for arm in self.arms}

    def lab(self, arm: str) -> str:
        return self.labels.get(arm, arm)

    def runs_of(self, arm: str, point: str | None = None) -> list[Run]:
        return [
            r
            for r in self.sweep.runs
            if r.arm.get(ARM_KEY, r.group_choice("demo/thoughtfold/arm")) == arm
            and (point is None or str(r.arm.get(POINT_KEY, r.get(POINT_KEY))) == point)
        ]

    def chosen(self, arm: str) -> list[Run]:
        return self.runs_of(arm, self.choices[arm].point)

    def value(self, run: Run, split: str, metric: str) -> float:
        return self.stats[id(run)].get(split, {}).get(metric, math.nan)

    def by_seed(self, arm: str, split: str, metric: str) -> dict[int, float]:
        return {int(r.get("seed")): self.value(r, split, metric) for r in self.chosen(arm)}

    def select(self, arm: str) -> Choice:
        """The fewest mean think tokens among the settings whose mean selection-split exact match is at least the
        arm's best minus the tolerance (ties: the first setting of the grid)."""
        means = {}
        for point in sorted({str(r.arm.get(POINT_KEY, r.get(POINT_KEY))) for r in self.runs_of(arm)}):
            runs = self.runs_of(arm, point)
            means[point] = {m: stat(self.value(r, "selection", m) for r in runs).mean for m in METRICS}
        best = max(m["exact_match"] for m in means.values())
        eligible = [p for p, m in means.items() if m["exact_match"] >= best - self.tolerance]
        return Choice(min(eligible, key=lambda p: (means[p]["think_tokens"], p)), means)

    def setting(self, arm: str, point: str) -> str:
        return f"{self.knobs.get(arm, 'setting')} {(self.grid.get(arm) or {}).get(point)}"


def claims(g: Grid) -> list[Claim]:
    """The paper's claims as this demo tests them, ThoughtFold (its chosen setting) against each baseline (its
    chosen setting), paired by seed on the reported split."""

    def diff(metric: str, other: str) -> Stat:
        return paired(g.by_seed("thoughtfold", "reported", metric), g.by_seed(other, "reported", metric))

    out = []
    if "thoughtfold" not in g.arms:
        return out
    if "grpo" in g.arms:
        out += [
            Claim(
                "ThoughtFold reasons in fewer tokens than GRPO",
                "think tokens, ThoughtFold − GRPO",
                diff("think_tokens", "grpo"),
                "lower",
                digits=1,
            ),
            Claim(
                f"... at equal accuracy (within ±{SAME_EM})",
                "exact match, ThoughtFold − GRPO",
                diff("exact_match", "grpo"),
                "within",
                SAME_EM,
            ),
            Claim(
                "... by removing redundant lines",
                "redundant-line rate, ThoughtFold − GRPO",
                diff("redundant_rate", "grpo"),
                "lower",
            ),
            Claim(
                f"... and not essential ones (retention within ±{SAME_RETENTION})",
                "essential-line retention, ThoughtFold − GRPO",
                diff("essential_retention", "grpo"),
                "within",
                SAME_RETENTION,
            ),
        ]
    for other in ("additive", "gr3"):
        if other not in g.arms:
            continue
        out += [
            Claim(
                f"ThoughtFold reasons in fewer tokens than {g.lab(other)} (surpasses efficient-reasoning baselines)",
                f"think tokens, ThoughtFold − {g.lab(other)}",
                diff("think_tokens", other),
                "lower",
                digits=1,
            ),
            Claim(
                f"ThoughtFold is more accurate than {g.lab(other)} (a length penalty also removes essential lines)",
                f"exact match, ThoughtFold − {g.lab(other)}",
                diff("exact_match", other),
                "higher",
            ),
        ]
    return out


def first_values(runs: list[Run], metric: str) -> Stat:
    """A metric's first logged value over runs (the base policy's, for the training curves)."""
    return stat(r.series(metric)[0][1] for r in runs if r.series(metric))


def probe_stats(runs: list[Run], when: str) -> dict[str, Stat]:
    keys = ("pass_full", "pass_drop_essential", "pass_drop_redundant", "rows_any_essential_drop_passes", "rows")
    return {k: stat(r.last(f"probe/{when}_{k}") for r in runs) for k in keys}


def probe_table(g: Grid) -> list[str]:
    runs = g.runs_of("thoughtfold")
    if not runs or not runs[0].series("probe/start_pass_full"):
        return []
    rows = []
    for when, label in (("start", "base policy (start of training)"), ("end", "end of training")):
        s = probe_stats(runs, when)
        rows.append(
            [
                label,
                fmt_stat(s["pass_full"], ci=False),
                fmt_stat(s["pass_drop_redundant"], ci=False),
                fmt_stat(s["pass_drop_essential"], ci=False),
                fmt_stat(s["rows_any_essential_drop_passes"], ci=False),
            ]
        )
    aux = runs[0]
    return [
        "## Does verification tell an essential line from a redundant one?",
        "",
        f"`LineRemovalProbe` in every ThoughtFold run ({len(runs)} runs: all settings and seeds): on the first "
        f"{int(probe_stats(runs, 'start')['rows'].mean)} held-out prompts, the reference reasoning is validated whole, "
        "without each redundant line and without each essential line, with ThoughtFold's own verification "
        f"({aux.get('module.aux.repeat')} sampled answers, threshold {aux.get('module.aux.threshold')}). Share of "
        "candidates that pass (mean ± sd over runs):",
        "",
        table(
            [
                "policy",
                "whole reasoning",
                "one redundant line removed",
                "one essential line removed",
                "prompts where some essential removal passes",
            ],
            rows,
        ),
        "",
    ]


def pair_prompt(record: dict[str, Any]) -> str | None:
    """The prompt of a trained pair, rebuilt from its rejected reasoning when that holds every essential line (the
    products of its lines sum to the pair's answer; products of operands >= 2 are >= 4, so a missing line changes
    the sum): ``"3*4+2*2="``; ``None`` otherwise."""
    reasoning, _, answer = record.get("rejected", "").partition("</think>")
    terms = re.findall(r"(\d+)\*(\d+)=(\d+)", reasoning)
    answer = answer.replace("<eos>", "").strip()
    if len(terms) < 2 or not answer.isdigit() or sum(int(v) for _, _, v in terms) != int(answer):
        return None
    return "+".join(f"{a}*{b}" for a, b, _ in terms) + "="


def pair_audit(run: Run, seen: set[str]) -> dict[str, float]:
    """Shares of a run's trained pairs: ``essential_pushed_down`` (pairs whose pushed-down span holds an essential
    line, among those that prune lines), ``redundant_only_pushed_down`` (it holds only ``check`` lines), ``pairs``
    (their number; 0 without records), and for the pairs whose prompt can be rebuilt (:func:`pair_prompt`):
    ``seen_prompt`` (the share whose prompt is among the base policy's SFT training prompts ``seen``) and
    ``essential_pushed_down_seen`` / ``_unseen`` (the essential share on those and on the others)."""
    records = run.read_jsonl("preference_pairs.jsonl") if run.file("preference_pairs.jsonl").is_file() else []
    if not records:
        return {"pairs": 0.0}
    pruned = [r for r in records if r.get("rejected_scored") and "</think>" not in r["rejected_scored"]]
    # the scored text joins the pruned steps without their delimiters: an essential step is found by its operation
    essential = [bool(ESSENTIAL_STEP.search(r["rejected_scored"])) for r in pruned]
    prompts = [pair_prompt(r) for r in pruned]
    known = [(p in seen, e) for p, e in zip(prompts, essential) if p is not None]

    def share(values: list[bool]) -> float:
        return sum(values) / len(values) if values else math.nan

    return {
        "pairs": float(len(records)),
        "essential_pushed_down": share(essential),
        "redundant_only_pushed_down": share([not e for e in essential]),
        "rebuilt": share([p is not None for p in prompts]),
        "seen_prompt": share([k for k, _ in known]),
        "essential_pushed_down_seen": share([e for k, e in known if k]),
        "essential_pushed_down_unseen": share([e for k, e in known if not k]),
    }


def task_text(run: Run) -> str:
    task = run.get("task", {}) or {}
    low, high = int(task.get("min_operands")) // 2, int(task.get("max_operands")) // 2
    pairs = str(low) if low == high else f"{low}-{high}"
    check = (
        "a `check N` line repeating its value"
        if task.get("check_states_value", True)
        else "a `check ok` line that carries no value"
    )
    return (
        f"`task={run.group_choice('task')}`: sums of products of {pairs} distinct operand pairs with operands in "
        f"[{task.get('min_value')}, {task.get('max_value')}] (partials={task.get('partials')}); the reference "
        "reasoning holds one line per product (`2*3=6`; essential) and, after each with probability "
        f"{task.get('redundant_prob')}, {check} (redundant, labelled); the answer, the sum of the products, follows "
        "`</think>` with no line of its own"
    )


def reported_table(g: Grid) -> str:
    rows = []
    for arm in g.arms:
        runs = g.chosen(arm)
        rows.append(
            [
                g.lab(arm),
                g.setting(arm, g.choices[arm].point),
                *[
                    fmt_stat(stat(g.value(r, "reported", m) for r in runs), 1 if m == "think_tokens" else 3)
                    for m in METRICS
                ],
            ]
        )
    return table(
        ["arm", "chosen setting", "exact match", "think tokens", "redundant-line rate", "essential-line retention"],
        rows,
    )


def selection_table(g: Grid) -> str:
    rows = []
    for arm in g.arms:
        cells = []
        for point in g.points:
            m = g.choices[arm].means.get(point)
            mark = " **(chosen)**" if point == g.choices[arm].point else ""
            cells.append(
                f"{g.setting(arm, point)}: EM {m['exact_match']:.3f}, {m['think_tokens']:.1f} tokens{mark}" if m else ""
            )
        rows.append([g.lab(arm), *cells])
    return table(["arm", *g.points], rows)


def compute_table(g: Grid) -> str:
    def rollout_tokens(run: Run) -> float:
        rows = int(run.get("datamodule.batch_size", 0)) * int(run.get("module.group_size", 0))
        return sum(v for _, v in run.series("train/completion_length")) * rows

    def total(run: Run, metric: str) -> float:
        return sum(v for _, v in run.series(metric))

    rows = []
    for arm in g.arms:
        runs = g.chosen(arm)
        tf = arm == "thoughtfold"
        rows.append(
            [
                g.lab(arm),
                fmt_stat(stat(rollout_tokens(r) / 1000 for r in runs), 1, ci=False),
                fmt_stat(stat(total(r, "train/tf_validation_tokens") / 1000 for r in runs), 1, ci=False),
                fmt_stat(stat(total(r, "train/tf_pairs_accepted") for r in runs), 0, ci=False) if tf else "",
                fmt_stat(
                    stat(max((v for _, v in r.series("train/clipped_ratio")), default=0.0) for r in runs), 4, ci=False
                ),
            ]
        )
    return table(
        [
            "arm (chosen setting)",
            "rollout tokens (k)",
            "validation tokens (k)",
            "pairs trained",
            "largest share of rollouts truncated in a step",
        ],
        rows,
    )


def fair_test(g: Grid) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""
    lines = ["## Fair test", ""]
    first_redundant = first_values(g.sweep.runs, "train/redundant_rate")
    if "grpo" in g.arms and "additive" in g.arms:
        grpo_red = stat(g.value(r, "reported", "redundant_rate") for r in g.chosen("grpo"))
        add_ret = stat(g.value(r, "reported", "essential_retention") for r in g.chosen("additive"))
        lines.append(
            "- **The baselines' known failures can occur.** GRPO's reward does not see length, so it can keep the "
            "redundant lines (base rollouts' redundant-line rate at the first step "
            f"{fmt_stat(first_redundant, ci=False)}; GRPO's at the end, reported split, "
            f"{fmt_stat(grpo_red, ci=False)}); a length penalty does not tell lines apart, so it can drop essential "
            "lines (every product line is needed for the answer): the additive "
            f"penalty's essential-line retention, reported split, {fmt_stat(add_ret, ci=False)}"
            + (
                f"; within {SAME_RETENTION} of keeping every line, so the length penalty's failure did **not** "
                "occur here: the correctness reward punishes a dropped product line more than the penalty pays for "
                "it, so a claim that ThoughtFold is more accurate than the length penalties cannot show on this task."
                if add_ret.mean >= 1 - SAME_RETENTION
                else "."
            )
        )
    runs = g.runs_of("thoughtfold")
    if runs and runs[0].series("probe/start_pass_full"):
        s = probe_stats(runs, "start")
        separates = s["pass_drop_essential"].hi < s["pass_drop_redundant"].lo
        fails = s["pass_drop_essential"].hi < ESSENTIAL_PASS_LIMIT
        audits = [pair_audit(r, set()) for r in g.chosen("thoughtfold")]
        pushed = stat(a["essential_pushed_down"] for a in audits if a["pairs"])
        lines.append(
            "- **The method's signal carries information the baselines lack** "
            f"({'met' if separates and fails else 'not met'}): ThoughtFold's verification on the base policy passes "
            f"a reasoning without one redundant line in {fmt_stat(s['pass_drop_redundant'])} of candidates and "
            f"without one essential line in {fmt_stat(s['pass_drop_essential'])} (the probe above; the two intervals "
            f"{'do not overlap' if separates else 'overlap'}); a length penalty sees only the length. 'met' requires "
            f"also that removing an essential line fails verification (pass rate below {ESSENTIAL_PASS_LIMIT}, upper "
            f"end of the interval): the search validates several prunings per rollout, so a small pass rate still "
            f"lets folds drop essential lines, and {fmt_stat(pushed, ci=False)} of the trained pairs that prune lines "
            "push an essential line down."
        )
    sizes = {arm: len(g.choices[arm].means) for arm in g.arms}
    lines.append(
        f"- **Same tuning effort.** Every arm has a grid of {', '.join(f'{g.lab(a)} {n}' for a, n in sizes.items())} "
        "settings of its one knob ("
        + "; ".join(
            f"{g.lab(a)}: {g.knobs.get(a, 'setting')} "
            + ", ".join(str((g.grid.get(a) or {}).get(p)) for p in sorted(g.choices[a].means))
            for a in g.arms
        )
        + "), each run with the same seeds and steps, and the same selection rule (table above)."
    )
    prompts = stat(g.value(r, "reported", "prompts") for r in g.sweep.runs)
    seen = base_train_prompts(g.head)
    in_selection, in_base = [], []
    for run in g.sweep.runs:
        split = g.stats[id(run)]
        if not split:
            continue
        reported, selection = split["reported"]["prompt_list"], set(split["selection"]["prompt_list"])
        in_selection.append(sum(p in selection for p in reported) / max(len(reported), 1))
        in_base.append(sum(p in seen for p in reported) / max(len(reported), 1) if seen else math.nan)
    lines.append(
        "- **Chosen on a split that is not reported.** The settings are picked on the first half of each run's "
        "held-out prompts (greedy, last step); every number of the verdict and the reported table is on the second "
        f"half ({prompts.mean:.0f} prompts per run; none is a prompt of the run's RL training rows). The task has few "
        "distinct prompts, so the halves share some: reported prompts that also occur in the selection half "
        f"{fmt_stat(stat(in_selection), ci=False)} of them, and that occur among the base policy's SFT training rows "
        f"{fmt_stat(stat(in_base), ci=False)} (the base policy may have memorised their answers)."
    )
    plateau_parts, all_met = [], True
    for arm in g.arms:
        chosen = g.chosen(arm)
        parts = []
        for metric, digits in (("train/think_tokens", 1), ("train/accuracy", 3)):
            curves = [[v for _, v in r.series(metric)] for r in chosen]
            s = stat(quarter_change(c) for c in curves)
            rel = stat(quarter_change(c, relative=True) for c in curves)
            all_met &= rel.n > 0 and abs(rel.mean) < PLATEAU
            parts.append(
                f"{metric.split('/')[1]} {s.mean:+.{digits}f} [{s.lo:+.{digits}f}, {s.hi:+.{digits}f}] "
                f"({100 * rel.mean:+.1f}%)"
            )
        plateau_parts.append(f"{g.lab(arm)}: {', '.join(parts)}")
    lines.append(
        f"- **Trained to a plateau** ({'met' if all_met else 'not met'}): the change of the training curves from the "
        f"third to the last quarter of the {g.head.get('trainer.max_steps')} steps (chosen setting, mean over seeds, "
        f"95% CI, and relative to the third quarter's level; 'met' when every mean relative change is below "
        f"{100 * PLATEAU:.0f}%): {'; '.join(plateau_parts)}."
    )
    seeds = len(g.sweep.seeds)
    lines.append(
        f"- **Seeds.** {seeds} seeds per (arm, setting) "
        f"({'met' if seeds >= SEEDS_FOR_SMALL_EFFECTS else 'not met'}: at least {SEEDS_FOR_SMALL_EFFECTS}, the effects "
        "are small); the verdict pairs the arms by seed (same base policy, same held-out prompts)."
    )
    return [*lines, ""]


def plot(g: Grid, path: Path) -> Path:
    """One panel per training metric: mean curve over the seeds of each arm's chosen setting, with its 95% band."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.4 * len(CURVES), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], CURVES):
        plot_curves(ax, {g.lab(a): curve(g.chosen(a), metric) for a in g.arms}, smooth=3)
        ax.set_title(metric, fontsize=8)
        ax.set_xlabel("step")
    legend(axes[0][0], fontsize=7)
    return save_figure(fig, path)


def build(sweep: Sweep, out: Path) -> list[Path]:
    g = Grid(sweep)
    head = g.head
    png = plot(g, out / f"{PAPER}.png")
    tf = (g.runs_of("thoughtfold") or [head])[0]
    seen = base_train_prompts(head)
    audits = [pair_audit(r, seen) for r in g.chosen("thoughtfold")] if "thoughtfold" in g.arms else []
    audits = [a for a in audits if a["pairs"]]
    audit_lines = (
        [
            "## What ThoughtFold's pairs train",
            "",
            f"Chosen setting, {len(audits)} runs ({fmt_stat(stat(a['pairs'] for a in audits), 0, ci=False)} trained "
            "pairs per run): the span the DPO loss pushes down holds an essential (product) line in "
            f"{fmt_stat(stat(a['essential_pushed_down'] for a in audits), ci=False)} of the pairs that prune lines, "
            "and only redundant `check` lines in "
            f"{fmt_stat(stat(a['redundant_only_pushed_down'] for a in audits), ci=False)}. The prompt of a pair can "
            "be rebuilt from its pushed-down reasoning when that holds every product line "
            f"({fmt_stat(stat(a['rebuilt'] for a in audits), ci=False)} of them); of those, "
            f"{fmt_stat(stat(a['seen_prompt'] for a in audits), ci=False)} have a prompt the base policy was "
            "fine-tuned on (the RL training prompts are drawn from the same few distinct prompts), and the share "
            "pushing down an essential line is "
            f"{fmt_stat(stat(a['essential_pushed_down_seen'] for a in audits), ci=False)} on those against "
            f"{fmt_stat(stat(a['essential_pushed_down_unseen'] for a in audits), ci=False)} on prompts it was not "
            "fine-tuned on.",
            "",
        ]
        if audits
        else []
    )
    base = sweep.runs
    text = [
        "# ThoughtFold demo: GRPO vs length penalties vs ThoughtFold on redundant-step sums of products (toy scale)",
        "",
        "Paper: *ThoughtFold: Folding Reasoning Chains via Introspective Preference Learning* (arXiv:2606.03503). "
        "Built through the demo path (`conf/demo/thoughtfold.yaml`, page builder `demos/thoughtfold.py`).",
        "",
        provenance(sweep, PAPER),
        "",
        f"Task: {task_text(head)}.",
        "",
        "Setup: tiny Llama from the cached base SFT policy of the task (one for every arm, setting and seed, built "
        f"with seed {head.get('base_policy.seed')}: {head.get('base_policy.max_epochs')} epochs of "
        f"{head.get('base_policy.num_train')} rows; the seeds vary the RL phase). GRPO with "
        f"G={head.get('module.group_size')}, {head.get('datamodule.batch_size')} prompts per step, max "
        f"{head.get('module.generation.max_new_tokens')} new tokens, {head.get('trainer.max_steps')} steps per run, "
        f"lr {tf.get('module.optimizer.lr')} (every arm but GRPO, whose grid is the learning rate); the GRPO, "
        "additive-penalty and GR3 arms are the GR3 demo's. ThoughtFold: phase 1 tail truncation + phase 2 folding by "
        f"{tf.get('module.aux.importance')} importance, {tf.get('module.aux.repeat')} validation answers per "
        f"candidate, threshold {tf.get('module.aux.threshold')}, at most {tf.get('module.aux.folder.max_iterations')} "
        f"oracle calls per phase, at most {tf.get('module.aux.max_rollouts')} rollouts folded per step, DPO beta "
        f"{tf.get('module.aux.beta')} against the {tf.get('module.aux.reference')} reference. Evaluation: greedy "
        f"decoding of {head.get('datamodule.source.num_val')} held-out prompts at the last step, split into a "
        "selection half and a reported half. Cells: mean ± sd over seeds [95% confidence interval, Student t]; the "
        "verdict: differences paired by seed.",
        "",
        "Base policy: exact match at the end of its SFT build "
        f"{fmt_stat(stat(artifact_values(base, 'base_policy', 'val/exact_match')), ci=False)} (greedy, the build's "
        "held-out prompts); training rollouts of the first step (all runs, sampled at temperature 1): think tokens "
        f"{fmt_stat(first_values(base, 'train/think_tokens'), 1, ci=False)}, redundant-line rate "
        f"{fmt_stat(first_values(base, 'train/redundant_rate'), ci=False)}, accuracy "
        f"{fmt_stat(first_values(base, 'train/accuracy'), ci=False)}.",
        "",
        "## Reported split (each arm at its chosen setting)",
        "",
        reported_table(g),
        "",
        f"## Selection split (every setting; mean over seeds; rule: the fewest think tokens among the settings within "
        f"{g.tolerance} of the arm's best exact match)",
        "",
        selection_table(g),
        "",
        *probe_table(g),
        *audit_lines,
        "## Compute (whole run, chosen setting)",
        "",
        compute_table(g),
        "",
        "Rollout tokens: mean completion length × completions per step, summed over steps; validation tokens: "
        "ThoughtFold's answers sampled to verify prunings (the importance forwards are not counted).",
        "",
        *fair_test(g),
        f"![curves]({png.name})",
        "",
    ]
    verdict = (
        verdict_section(
            claims(g),
            "the paper's scale (7B reasoning models, thousands of reasoning tokens, natural redundancy such as "
            "re-verification and backtracking); here the redundancy is injected and labelled, the model has under a "
            f"million parameters and each run has {head.get('trainer.max_steps')} GRPO steps.",
        )
        if claims(g)
        else None
    )
    return [write_page(out, PAPER, text, verdict), png]
