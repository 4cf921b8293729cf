"""Page builder of the ThoughtFold demo (arXiv 2606.03503): ``docs/results/thoughtfold.md`` + ``thoughtfold.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=thoughtfold`` (``conf/demo/thoughtfold.yaml``: arm × seed); page:
``python -m zoo.report demo thoughtfold``. Read from the sweep: the GRPO module's logged ``train/accuracy``,
``train/completion_length``, ``val/exact_match``; ``ReasoningRedundancy``'s ``{train,val}/think_tokens``,
``redundant_rate``, ``essential_retention``; ThoughtFold's ``train/tf_*`` (pairs, validation samples and tokens);
the resolved configs (batch size, group size) for the tokens sampled; and the ThoughtFold arm's trained pairs
(``preference_pairs.jsonl``, :class:`zoo.callbacks.PreferencePairRecords`): which lines their rejected (pushed-down) and
chosen (pushed-up) spans hold.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    contrast,
    curve,
    legend,
    plot_curves,
    provenance,
    pyplot,
    save_figure,
    table,
    write_page,
)
from zoo.stats import (
    compare,
    fmt_stat,
    stat,
)

PAPER = "thoughtfold"
ARMS = ("grpo", "additive", "gr3", "thoughtfold", "thoughtfold_light")
CURVES = ("train/think_tokens", "train/redundant_rate", "train/essential_retention", "train/accuracy")


def rollout_tokens(run: Run) -> float:
    """Tokens sampled for rollouts over the run: per logged step, mean completion length x completions per step."""
    rows = int(run.get("datamodule.batch_size", 0)) * int(run.get("module.group_size", 0))
    return sum(v for _, v in run.series("train/completion_length")) * rows


def validation_tokens(run: Run) -> float:
    """Tokens sampled by ThoughtFold's validation of prunings over the run (0 for the other arms)."""
    return sum(v for _, v in run.series("train/tf_validation_tokens"))


def total(run: Run, metric: str) -> float:
    return sum(v for _, v in run.series(metric))


def max_of(runs: list[Run], metric: str) -> float:
    """The largest logged value of ``metric`` over the runs (``nan`` when never logged)."""
    values = [v for r in runs for _, v in r.series(metric)]
    return max(values) if values else math.nan


def mean_of(run: Run, metric: str) -> float:
    """The mean of ``metric`` over a run's logged steps (``nan`` when never logged)."""
    points = run.series(metric)
    return sum(v for _, v in points) / len(points) if points else math.nan


def first(run: Run, metric: str) -> float:
    points = run.series(metric)
    return points[0][1] if points else math.nan


def is_redundant_line(line: str) -> bool:
    """The task's injected redundant steps (``check N``, ``MultiSum`` with ``redundant_prob > 0``)."""
    return line.startswith("check ")


def stated_value(line: str) -> str:
    """The number a reasoning line states: after the last ``=`` of a partial sum, after ``check`` of a check line."""
    return line.rsplit("=", 1)[-1].strip() if "=" in line else line.removeprefix("check ").strip()


def task_text(run: Run) -> str:
    """What the run's ``MultiSum`` task writes, from its resolved config."""
    task = run.get("task", {}) or {}
    partials = task.get("partials", "chain")
    if partials == "pairs":
        essential = (
            "one line per disjoint operand pair (`3+5=8`; essential) and the answer, the sum of the pair sums, after "
            "`</think>` with no line of its own"
        )
    else:
        essential = "a running sum, one line per operand after the first (essential), the answer after `</think>`"
    return (
        f"`task={run.group_choice('task')}`: sums of {task.get('min_operands')}-{task.get('max_operands')} operands "
        f"in [{task.get('min_value', 0)}, {task.get('max_value')}] (partials={partials}), whose reference "
        f"reasonings hold {essential}, and an injected `check N` line (redundant, labelled) after an essential line "
        f"with probability {task.get('redundant_prob')}"
    )


def pair_audit(run: Run) -> dict[str, float]:
    """Shares of a run's trained pairs: ``essential_pushed_down`` (pairs whose rejected span holds an essential
    line), ``redundant_only_pushed_down`` (it holds only redundant lines), ``one_line_chosen`` (the chosen reasoning
    is a single line), ``last_line_states_answer`` (the last line of the chosen reasoning states the chosen answer,
    so a fold keeping only that line can pass verification), and ``pairs`` (their number; 0 without records)."""
    records = run.read_jsonl("preference_pairs.jsonl") if run.file("preference_pairs.jsonl").is_file() else []
    pruned = [r for r in records if r.get("rejected_scored") and "</think>" not in r["rejected_scored"]]
    if not records:
        return {"pairs": 0.0}

    def lines(text: str) -> list[str]:
        return [line for line in text.replace("<think>", "").split("\n") if line.strip()]

    def states_answer(chosen: str) -> bool:
        reasoning, _, answer = chosen.partition("</think>")
        body = lines(reasoning)
        return bool(body) and stated_value(body[-1]) == answer.split("<eos>")[0].strip()

    essential = [any(not is_redundant_line(x) for x in lines(r["rejected_scored"])) for r in pruned]
    chosen_lines = [len(lines(r["chosen"].split("</think>")[0])) for r in records]
    return {
        "pairs": float(len(records)),
        "essential_pushed_down": sum(essential) / max(len(pruned), 1),
        "redundant_only_pushed_down": sum(not e for e in essential) / max(len(pruned), 1),
        "one_line_chosen": sum(n == 1 for n in chosen_lines) / len(records),
        "last_line_states_answer": sum(states_answer(r["chosen"]) for r in records) / len(records),
    }


def audit_text(label: str, audits: list[dict[str, float]]) -> list[str]:
    """The pair-audit paragraph of one ThoughtFold arm (nothing without records)."""
    audits = [a for a in audits if a["pairs"]]
    if not audits:
        return []
    return [
        f"{label}: over the trained pairs of its runs ({fmt_stat(stat(a['pairs'] for a in audits), 0, ci=False)} "
        "pairs per run) the pruned span the DPO loss pushes down holds an essential line (a partial sum) in "
        f"{fmt_stat(stat(a['essential_pushed_down'] for a in audits), ci=False)} of them and only redundant `check` "
        f"lines in {fmt_stat(stat(a['redundant_only_pushed_down'] for a in audits), ci=False)}; the chosen reasoning "
        f"is a single line in {fmt_stat(stat(a['one_line_chosen'] for a in audits), ci=False)}, and its last line "
        f"states the chosen answer in {fmt_stat(stat(a['last_line_states_answer'] for a in audits), ci=False)}.",
        "",
    ]


def build(sweep: Sweep, out: Path) -> list[Path]:
    head = sweep.runs[0]
    labels = head.get("demo.labels", {}) or {}
    arm_key = next((k for k in sweep.swept if k.endswith("/arm")), None)

    def runs_of(arm: str) -> list[Run]:
        return [r for r in sweep.runs if r.arm.get(arm_key) == arm]

    arms = [a for a in ARMS if runs_of(a)]
    png = plot(arms, runs_of, labels, out / f"{PAPER}.png")
    seeds = len(sweep.seeds) or 1
    logged_every = int(head.get("trainer.log_every_n_steps", 1))
    rows = []
    for arm in arms:
        runs = runs_of(arm)
        rows.append(
            [
                labels.get(arm, arm),
                fmt_stat(stat(r.last("val/exact_match") for r in runs)),
                fmt_stat(stat(r.last("val/think_tokens") for r in runs), 1),
                fmt_stat(stat(r.last("val/redundant_rate") for r in runs)),
                fmt_stat(stat(r.last("val/essential_retention") for r in runs)),
            ]
        )
    compute = []
    for arm in arms:
        runs = runs_of(arm)
        compute.append(
            [
                labels.get(arm, arm),
                fmt_stat(stat(rollout_tokens(r) / 1000 for r in runs), 1, ci=False),
                fmt_stat(stat(validation_tokens(r) / 1000 for r in runs), 1, ci=False),
                fmt_stat(stat((rollout_tokens(r) + validation_tokens(r)) / 1000 for r in runs), 1, ci=False),
                fmt_stat(stat(total(r, "train/tf_validation_samples") for r in runs), 0, ci=False)
                if arm.startswith("thoughtfold")
                else "",
                fmt_stat(stat(total(r, "train/tf_pairs_built") for r in runs), 0, ci=False)
                if arm.startswith("thoughtfold")
                else "",
                fmt_stat(stat(total(r, "train/tf_pairs_accepted") for r in runs), 0, ci=False)
                if arm.startswith("thoughtfold")
                else "",
                fmt_stat(stat(mean_of(r, "train/clipped_ratio") for r in runs), 4, ci=False),
            ]
        )
    base = sweep.runs
    tf = (runs_of("thoughtfold") or [head])[0]
    audit_lines = []
    for tf_arm in [a for a in arms if a.startswith("thoughtfold")]:
        audit_lines += audit_text(labels.get(tf_arm, tf_arm), [pair_audit(r) for r in runs_of(tf_arm)])
    if audit_lines:
        audit_lines = [
            "## What ThoughtFold's pairs train",
            "",
            *audit_lines,
            "Verification samples the answer after the folded reasoning: a fold whose last kept line states the "
            "answer can pass it whatever essential lines it dropped; where no line states the answer, dropping an "
            "essential line leaves the answer to be computed from the prompt alone.",
            "",
        ]
    text = [
        "# ThoughtFold demo: GRPO vs length penalty vs GR3 vs ThoughtFold on redundant-step sums (toy scale)",
        "",
        "Paper: *ThoughtFold: Folding Reasoning Chains via Introspective Preference Learning* (arXiv:2606.03503). "
        "Built through the demo path (`conf/demo/thoughtfold.yaml`, page builder `demos/thoughtfold.py`).",
        "",
        provenance(sweep, PAPER),
        "",
        f"Task: {task_text(head)}.",
        "",
        "Setup: tiny Llama from the cached base SFT policy of the task (one for every arm and seed, "
        f"built with seed {head.get('base_policy.seed')}: {head.get('base_policy.max_epochs')} epochs of "
        f"{head.get('base_policy.num_train')} rows; the seeds vary the RL phase). "
        f"GRPO with G={head.get('module.group_size')}, {head.get('datamodule.batch_size')} prompts per step, "
        f"max {head.get('module.generation.max_new_tokens')} new tokens, lr {head.get('module.optimizer.lr')}, "
        f"{head.get('trainer.max_steps')} steps per run, {seeds} seed{'s' if seeds != 1 else ''}; the GRPO, "
        "additive-penalty and GR3 arms are the GR3 demo's. ThoughtFold: phase 1 tail truncation + phase 2 folding "
        f"by {tf.get('module.aux.importance')} importance, {tf.get('module.aux.repeat')} validation answers per "
        f"candidate, threshold {tf.get('module.aux.threshold')}, at most {tf.get('module.aux.folder.max_iterations')} "
        f"oracle calls per phase, at most {tf.get('module.aux.max_rollouts')} rollouts folded per step, DPO beta "
        f"{tf.get('module.aux.beta')} against the {tf.get('module.aux.reference')} reference, weight "
        f"{tf.get('module.aux.weight')}. Validation: greedy decoding of "
        f"{head.get('datamodule.source.num_val')} held-out prompts at the last step. Cells: mean ± sd over seeds "
        "[95% confidence interval, Student t].",
        "",
        "Base policy: validation exact match at the end of its SFT build "
        f"{fmt_stat(stat(artifact_values(base, 'base_policy', 'val/exact_match')), ci=False)} (greedy, the build's "
        "held-out prompts); training rollouts of the first step (all runs, sampled at temperature 1): think tokens "
        f"{fmt_stat(stat(first(r, 'train/think_tokens') for r in base), 1, ci=False)}, redundant-line rate "
        f"{fmt_stat(stat(first(r, 'train/redundant_rate') for r in base), ci=False)}, essential-line retention "
        f"{fmt_stat(stat(first(r, 'train/essential_retention') for r in base), ci=False)}, accuracy "
        f"{fmt_stat(stat(first(r, 'train/accuracy') for r in base), ci=False)}.",
        "",
        "## Final validation (greedy, held-out prompts)",
        "",
        table(
            ["arm", "exact match", "think tokens", "redundant-line rate", "essential-line retention"],
            rows,
        ),
        "",
        "## Compute (whole run)",
        "",
        table(
            [
                "arm",
                "rollout tokens (k)",
                "validation tokens (k)",
                "total tokens sampled (k)",
                "validation samples",
                "pairs built",
                "pairs trained",
                "rollouts truncated",
            ],
            compute,
        ),
        "",
        f"Token totals are summed over the logged steps (every {logged_every} step(s)); the importance forwards "
        "(one batched forward of n + 1 rows per folded rollout) are not counted as sampled tokens. Rollouts "
        "truncated: the share of training rollouts cut at max_new_tokens "
        f"({head.get('module.generation.max_new_tokens')}; a truncated completion has no answer, so truncation would "
        "let the correctness reward shorten reasonings by itself); validation generations cut: at most "
        f"{max_of(sweep.runs, 'val/clipped_ratio'):.3f} in any run.",
        "",
        *audit_lines,
        "## Reading",
        "",
        *reading(runs_of, labels),
        "",
        "What this toy run can and cannot show: the redundancy is known exactly, so the redundant-line rate and the "
        "essential-line retention measure *what* each arm removes; a few dozen GRPO steps on a sub-million-parameter "
        "model are far from the paper's scale (7B reasoning models, long chains), and the comparisons above are "
        "reported as shown only where their 95% interval excludes 0.",
        "",
        f"![curves]({png.name})",
        "",
    ]
    return [write_page(out, PAPER, text), png]


def reading(runs_of: Any, labels: dict[str, str]) -> list[str]:
    """Templated contrasts (Welch 95% intervals over seeds; "not shown" when they contain 0)."""

    def last(arm: str, metric: str) -> list[float]:
        return [r.last(metric) for r in runs_of(arm)]

    def line(a: str, b: str, metric: str, what: str) -> str | None:
        if not last(a, metric) or not last(b, metric):
            return None
        return "- " + contrast(labels.get(a, a), last(a, metric), labels.get(b, b), last(b, metric), what) + "."

    def verdict(arm: str) -> str | None:
        """The claim for one ThoughtFold arm against GRPO: shorter, and no drop of accuracy or retention shown."""
        if not last(arm, "val/think_tokens") or not last("grpo", "val/think_tokens"):
            return None
        shorter = compare(last(arm, "val/think_tokens"), last("grpo", "val/think_tokens"))
        accuracy = compare(last(arm, "val/exact_match"), last("grpo", "val/exact_match"))
        retention = compare(last(arm, "val/essential_retention"), last("grpo", "val/essential_retention"))
        fewer = shorter.shown and shorter.delta < 0
        less_accurate = accuracy.shown and accuracy.delta < 0
        less_retained = retention.shown and retention.delta < 0
        claim = fewer and not less_accurate and not less_retained
        return (
            f"- {labels.get(arm, arm)}: **{'shown' if claim else 'not shown'}** (think tokens lower: "
            f"{'yes' if fewer else 'no'}; exact match lower: {'yes' if less_accurate else 'no'}; essential-line "
            f"retention lower: {'yes' if less_retained else 'no'})."
        )

    lines = [
        "**The paper's claim (fewer reasoning tokens than GRPO at equal accuracy, by removing redundant rather than "
        "essential lines), per ThoughtFold arm** (95% Welch intervals over seeds; equal accuracy = no drop of exact "
        "match shown, which at this number of seeds and prompts leaves a wide margin):",
        "",
        *[verdict(arm) for arm in ("thoughtfold", "thoughtfold_light")],
        "",
        line("thoughtfold", "grpo", "val/think_tokens", "Final think tokens"),
        line("thoughtfold", "grpo", "val/redundant_rate", "Final redundant-line rate"),
        line("thoughtfold", "grpo", "val/essential_retention", "Final essential-line retention"),
        line("thoughtfold", "grpo", "val/exact_match", "Final validation exact match"),
        line("additive", "grpo", "val/think_tokens", "Final think tokens"),
        line("additive", "grpo", "val/essential_retention", "Final essential-line retention"),
        line("thoughtfold", "additive", "val/essential_retention", "Final essential-line retention"),
        line("thoughtfold", "additive", "val/exact_match", "Final validation exact match"),
        line("thoughtfold", "gr3", "val/think_tokens", "Final think tokens"),
        line("thoughtfold", "gr3", "val/exact_match", "Final validation exact match"),
        line("thoughtfold_light", "grpo", "val/think_tokens", "Final think tokens"),
        line("thoughtfold_light", "grpo", "val/essential_retention", "Final essential-line retention"),
        line("thoughtfold_light", "grpo", "val/exact_match", "Final validation exact match"),
        line("thoughtfold_light", "grpo", "val/redundant_rate", "Final redundant-line rate"),
        line("additive", "grpo", "val/redundant_rate", "Final redundant-line rate"),
        line("thoughtfold_light", "additive", "val/think_tokens", "Final think tokens"),
        line("thoughtfold_light", "gr3", "val/think_tokens", "Final think tokens"),
        line("thoughtfold_light", "gr3", "val/exact_match", "Final validation exact match"),
    ]
    return [x for x in lines if x is not None]


def plot(arms: list[str], runs_of: Any, labels: dict[str, str], path: Path) -> Path:
    """One panel per metric: mean curve over seeds with its 95% band."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.4 * len(CURVES), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], CURVES):
        plot_curves(ax, {labels.get(a, a): curve(runs_of(a), metric) for a in arms}, smooth=3)
        ax.set_title(metric, fontsize=8)
        ax.set_xlabel("step")
    legend(axes[0][0], fontsize=7)
    return save_figure(fig, path)
