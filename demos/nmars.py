"""Page builder of the N-MARS demo (ICML 2026 poster 61349): ``docs/results/nmars.md`` + ``nmars.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=nmars`` (``conf/demo/nmars.yaml``: arm x seed); page:
``python -m zoo.report demo nmars``. Read from the sweep: the last validation of every run as logged by
``callbacks.undo_metrics`` (:class:`zoo.callbacks.UndoMetrics`: ``val/T<t>/exact_match``, ``val/T<t>/undo_rate``,
``val/T<t>/failed_correction_rate``, ``val/deviation_logprob``) and the module (``val/exact_match``, greedy), the
data-stage runs each run used (``run_info.json`` artifacts of kind ``nmars_data``: ``offline/*``), and the resolved
configs.
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
    legend,
    provenance,
    pyplot,
    save_figure,
    table,
    write_page,
)
from zoo.stats import (
    fmt_stat,
    stat,
)

PAPER = "nmars"
ARMS = ("sft_ref", "sft_plain", "msft", "msft_grpo")
DEVIATION = "val/deviation_logprob"


def temperatures(run: Run) -> list[float]:
    """The sampling temperatures UndoMetrics evaluated at (from the run's config)."""
    return [float(t) for t in run.get("callbacks.undo_metrics.temperatures", []) or []]


def metric(t: float, name: str) -> str:
    """``val/T<t>/<name>``, the name UndoMetrics logs under."""
    return f"val/T{t:g}/{name}"


def paired(a: list[Run], b: list[Run], name: str) -> str:
    """Per-seed differences ``a - b`` of a metric (runs of one seed share the base policy and the rows), as a
    sentence: the differences, how many are positive, and their mean with its 95% interval."""
    by_seed = {r.get("seed"): r.last(name) for r in b}
    diffs = [r.last(name) - by_seed[r.get("seed")] for r in a if r.get("seed") in by_seed]
    diffs = [d for d in diffs if not math.isnan(d)]
    if not diffs:
        return "no paired seeds"
    s = stat(diffs)
    shown = s.n >= 2 and (s.lo > 0 or s.hi < 0)
    return (
        f"per-seed differences {', '.join(f'{d:+.3f}' for d in diffs)} (positive in {sum(d > 0 for d in diffs)} of "
        f"{len(diffs)} seeds; mean {fmt_stat(s)}{'' if shown else ', interval contains 0: not shown'})"
    )


def build(sweep: Sweep, out: Path) -> list[Path]:
    arms = sweep.arms()
    first = sweep.runs[0]
    labels: dict[str, str] = first.get("demo.labels", {}) or {}
    temps = temperatures(first)
    order = [a for a in ARMS if a in arms] + [a for a in arms if a not in ARMS]

    def last(arm: str, name: str) -> list[float]:
        return [r.last(name) for r in arms.get(arm, [])]

    def cell(arm: str, name: str, ci: bool = True) -> str:
        s = stat(last(arm, name))
        return "n/a" if s.n == 0 else fmt_stat(s, ci=ci)

    em_rows = [
        [labels.get(a, a), cell(a, "val/exact_match"), *(cell(a, metric(t, "exact_match")) for t in temps)]
        for a in order
    ]
    undo_rows = [
        [
            labels.get(a, a),
            *(cell(a, metric(t, "undo_rate"), ci=False) for t in temps),
            *(cell(a, metric(t, "failed_correction_rate"), ci=False) for t in temps),
            cell(a, DEVIATION),
        ]
        for a in order
    ]
    wall = [
        [labels.get(a, a), f"{stat(float(r.info.get('wall_seconds', 'nan')) for r in arms[a]).mean:.0f}"] for a in order
    ]
    deviating = artifact_values(sweep.runs, "nmars_data", "offline/nonzero_num_undos", "train")
    undos = artifact_values(sweep.runs, "nmars_data", "offline/mean_num_undos", "train")
    rows = artifact_values(sweep.runs, "nmars_data", "offline/rows", "train")
    seeds = len(sweep.seeds) or 1
    demo = first.get("demo", {}) or {}
    data = demo.get("data", {}) or {}
    base = demo.get("base", {}) or {}
    png = plot(order, arms, labels, temps, out / f"{PAPER}.png")
    name = {a: labels.get(a, a) for a in ARMS}
    hottest = max(temps) if temps else None
    text = [
        "# N-MARS demo: an <UNDO> token learned from the policy's own deviations",
        "",
        "Paper: *N-MARS: Non-Monotonic AutoRegressive Sequence modeling* (ICML 2026 poster 61349; no arXiv release, "
        "the method is reconstructed from the abstract and the authors' work-in-progress repository, see "
        "`docs/methods/nmars_sft.md`). Built through the demo path (`conf/demo/nmars.yaml`, page builder "
        "`demos/nmars.py`).",
        "",
        provenance(sweep, PAPER),
        "",
        f"Setup: task `{first.get('task._target_', '?').rsplit('.', 1)[-1]}` (lengths "
        f"{first.get('task.min_length')}-{first.get('task.max_length')}), tiny Llama "
        f"({first.get('backbone.hidden_size')} hidden, {first.get('backbone.num_hidden_layers')} layers). "
        f"SFT on references = the cached base SFT policy of each seed ({base.get('num_train')} examples x "
        f"{base.get('max_epochs')} epochs). Its samples at temperature "
        f"1.2 on {data.get('num_train')} training prompts, aligned with the references (difflib, autojunk off) and "
        "augmented with one `<UNDO>` per deviating token plus the correction, are the training rows of the SFT arms "
        f"({demo.get('sft_epochs')} epochs); masked SFT + GRPO continues the masked-SFT recipe for "
        f"{demo.get('grpo_steps')} GRPO steps with the N-MARS reward (module/grpo/rewards=nmars). Every arm is "
        f"evaluated once, at its end, on the same {data.get('num_val')} held-out prompts, with undo-aware decoding "
        f"(physical sequence kept in context, output = resolved sequence, at most "
        f"{first.get('module.decoder.max_undos')} UNDOs), max {first.get('module.generation.max_new_tokens')} new "
        f"tokens; {seeds} seed{'s' if seeds != 1 else ''}. Cells: mean ± sd over seeds [95% confidence interval, "
        "Student t].",
        "",
        "Training rows (the data stage on the training prompts, one run per seed): "
        + (
            f"{fmt_stat(stat(rows), 0, ci=False)} rows, a fraction {fmt_stat(stat(deviating), ci=False)} of the "
            f"samples deviate from the reference, {fmt_stat(stat(undos), 2, ci=False)} `<UNDO>` per row."
            if rows
            else "no data-stage metrics recorded."
        ),
        "",
        "## Resolved exact match on held-out prompts",
        "",
        table(["arm", "greedy", *(f"T = {t:g}" for t in temps)], em_rows),
        "",
        "## Use of `<UNDO>` and the safety gap",
        "",
        "Undo rate: fraction of generations with at least one `<UNDO>`. Failed correction: among generations with an "
        "`<UNDO>`, the fraction whose resolved output is still wrong. Deviation log-prob: mean log-probability of the "
        "held-out rows' error tokens given their prefix (the tokens masked SFT never trains; n/a for the GRPO arm, "
        "whose evaluation batches are prompts only).",
        "",
        table(
            [
                "arm",
                *(f"undo rate T = {t:g}" for t in temps),
                *(f"failed correction T = {t:g}" for t in temps),
                "deviation log-prob",
            ],
            undo_rows,
        ),
        "",
        "## Reading",
        "",
        "- Safety gap: "
        + contrast(
            name["sft_plain"],
            last("sft_plain", DEVIATION),
            name["msft"],
            last("msft", DEVIATION),
            "the mean log-prob of held-out deviation tokens",
        )
        + " (the paper's claim: higher under plain SFT).",
        f"- Safety gap paired by seed ({name['sft_plain']} minus {name['msft']}): "
        + paired(arms.get("sft_plain", []), arms.get("msft", []), DEVIATION)
        + ".",
        f"- Deviation log-prob paired by seed ({name['msft']} minus {name['sft_ref']}, i.e. what masked SFT did to "
        "the never-trained error tokens): " + paired(arms.get("msft", []), arms.get("sft_ref", []), DEVIATION) + ".",
    ]
    if hottest is not None:
        em = metric(hottest, "exact_match")
        text += [
            f"- Exact match at T = {hottest:g}: "
            + contrast(name["msft"], last("msft", em), name["sft_ref"], last("sft_ref", em), "resolved exact match")
            + ".",
            f"- Exact match at T = {hottest:g}: "
            + contrast(name["msft"], last("msft", em), name["sft_plain"], last("sft_plain", em), "resolved exact match")
            + ".",
            f"- Exact match at T = {hottest:g}: "
            + contrast(name["msft_grpo"], last("msft_grpo", em), name["msft"], last("msft", em), "resolved exact match")
            + ".",
        ]
    text += [
        "",
        "What this can and cannot show: a 0.9M-parameter model on a task whose errors are cheap to detect, a few "
        "minutes of training per arm, one round of self-deviation data. It tests the mechanism (the model learns to "
        "emit `<UNDO>` after its own errors and the resolved output improves, or does not) and the direction of the "
        "safety gap; it does not reproduce the paper's numbers or settings (1B-8B models, GSM8K/MATH/MBPP).",
        "",
        "Mean wall time per run (seconds, this machine, shared and loaded; includes building the prerequisites the "
        "first run of a seed needed):",
        "",
        table(["arm", "seconds"], wall),
        "",
        f"![exact match and undo rate]({png.name})",
        "",
    ]
    return [write_page(out, PAPER, text), png]


def plot(order: list[str], arms: dict[str, list[Run]], labels: dict[str, str], temps: list[float], path: Path) -> Path:
    """Bars: resolved exact match (greedy and each temperature) and undo rate per arm, mean ± sd over seeds."""
    plt = pyplot()
    fig, (ax_em, ax_undo) = plt.subplots(1, 2, figsize=(11, 4))
    settings: list[tuple[str, Any]] = [("greedy", "val/exact_match")] + [
        (f"T = {t:g}", metric(t, "exact_match")) for t in temps
    ]
    width = 0.8 / max(1, len(settings))
    for j, (label, name) in enumerate(settings):
        means, sds = zip(*(_mean_sd(arms[a], name) for a in order)) if order else ((), ())
        ax_em.bar([i + j * width for i in range(len(order))], means, width, yerr=sds, label=label, capsize=2)
    width = 0.8 / max(1, len(temps))
    for j, t in enumerate(temps):
        means, sds = zip(*(_mean_sd(arms[a], metric(t, "undo_rate")) for a in order)) if order else ((), ())
        ax_undo.bar([i + j * width for i in range(len(order))], means, width, yerr=sds, label=f"T = {t:g}", capsize=2)
    for ax, title in ((ax_em, "resolved exact match"), (ax_undo, "undo rate")):
        ax.set_xticks([i + 0.4 - 0.4 / max(1, len(settings)) for i in range(len(order))])
        ax.set_xticklabels([labels.get(a, a) for a in order], rotation=15, ha="right", fontsize=8)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        legend(ax, fontsize=8)
    ax_em.set_ylim(0, 1)
    fig.tight_layout()
    return save_figure(fig, path)


def _mean_sd(runs: list[Run], name: str) -> tuple[float, float]:
    s = stat(r.last(name) for r in runs)
    mean = 0.0 if s.n == 0 or math.isnan(s.mean) else s.mean
    sd = 0.0 if s.n < 2 or math.isnan(s.sd) else s.sd
    return mean, sd
