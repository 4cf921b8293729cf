"""Page builder of the DTS demo (arXiv 2511.00640): ``docs/results/dts.md`` + ``dts.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=dts`` (``conf/demo/dts.yaml``: setting × arm × seed); page:
``python -m zoo.report demo dts``. Read from the sweep: the test metrics of each run (``test/exact_match`` and
``DecodeStats``' ``test/decode/*``), the per-problem records (``eval_records.jsonl``: completion, correctness, DTS's
branch positions and the entropy / varentropy at each token of the returned completion), ``run_info.json`` (the base
policy each run used, with its build metrics) and the resolved configs.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from zoo.data.forked import BRANCHES, ForkedTask
from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    contrast,
    fmt_stat,
    provenance,
    pyplot,
    save_figure,
    stat,
    table,
    write_page,
)

PAPER = "dts"
RECORDS = "eval_records.jsonl"
SETTINGS = ("forked", "multisum")
ARMS = ("sample", "greedy", "self_consistency", "dts_greedy", "dts_stable")
DTS_ARMS = ("dts_greedy", "dts_stable")
# (metric, column) of the arm table: the module's accuracy and DecodeStats' per-problem means
COLUMNS = (
    ("test/exact_match", "accuracy"),
    ("test/decode/repetition_rate", "repetition rate"),
    ("test/decode/tokens_per_problem", "tokens / problem (returned)"),
    ("test/decode/decoded_tokens_per_problem", "tokens / problem (decoded)"),
    ("test/decode/branch_events", "branch events"),
    ("test/decode/max_active", "max active"),
)
# the fork token of task=forked: completion position 1 (after <think>) with the zoo's character tokenizer
FORK_POSITION = 1


def records(run: Run) -> list[dict[str, Any]]:
    """The run's per-problem test records (empty when it wrote none)."""
    return run.read_jsonl(RECORDS) if run.file(RECORDS).is_file() else []


def branch_shares(run: Run) -> dict[str, float]:
    """Share of problems whose returned completion took each branch of the forked task (``other``: none)."""
    rows = records(run)
    counts = Counter(ForkedTask.branch_of(r["completion"]) or "other" for r in rows)
    return {b: counts[b] / len(rows) if rows else math.nan for b in (*BRANCHES, "other")}


def branching(run: Run) -> dict[str, float]:
    """Where a DTS run branched: the share of its branch events at the fork position, mean ``H`` / ``V`` of the
    returned completions at the fork, and the largest ``V`` at any other position of a returned completion (median
    over problems)."""
    rows = records(run)
    steps = [s for r in rows for s in r.get("branch_steps", [])]
    at_fork = [r for r in rows if len(r.get("varentropies", [])) > FORK_POSITION]
    others = sorted(
        max((v for i, v in enumerate(r["varentropies"]) if i != FORK_POSITION), default=0.0)
        for r in rows
        if r.get("varentropies")
    )
    return {
        "at_fork": sum(s == FORK_POSITION for s in steps) / len(steps) if steps else math.nan,
        "fork_h": _mean(r["entropies"][FORK_POSITION] for r in at_fork),
        "fork_v": _mean(r["varentropies"][FORK_POSITION] for r in at_fork),
        "other_v": others[len(others) // 2] if others else math.nan,
        "positions": len(set(steps)),
    }


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def varentropy_profile(runs: list[Run]) -> tuple[list[float], list[float]]:
    """Mean ``H`` and ``V`` by completion position over the returned completions of ``runs``."""
    by_h: dict[int, list[float]] = {}
    by_v: dict[int, list[float]] = {}
    for run in runs:
        for r in records(run):
            for i, (h, v) in enumerate(zip(r.get("entropies", []), r.get("varentropies", []))):
                by_h.setdefault(i, []).append(h)
                by_v.setdefault(i, []).append(v)
    n = max(by_v, default=-1) + 1
    return [_mean(by_h.get(i, [])) for i in range(n)], [_mean(by_v.get(i, [])) for i in range(n)]


def plot(sweep: Sweep, labels: dict[str, str], tau_v: float, out: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    width = 0.8 / len(ARMS)
    for i, arm in enumerate(ARMS):
        accs = [stat(r.last("test/exact_match") for r in sweep.arm(f"{s}/{arm}")) for s in SETTINGS]
        xs = [j + (i - (len(ARMS) - 1) / 2) * width for j in range(len(SETTINGS))]
        err = [0.0 if math.isnan(a.hi) else a.hi - a.mean for a in accs]
        axes[0].bar(xs, [a.mean for a in accs], width, yerr=err, label=labels.get(arm, arm))
    axes[0].set_xticks(range(len(SETTINGS)), [f"task={s}" for s in SETTINGS])
    axes[0].set_ylabel("test accuracy (mean over seeds, 95% CI)")
    axes[0].legend(fontsize=7)
    for ax, setting in zip(axes[1:], SETTINGS):
        h, v = varentropy_profile(sweep.arm(f"{setting}/dts_greedy"))
        ax.plot(range(len(v)), v, marker=".", label="varentropy V")
        ax.plot(range(len(h)), h, marker=".", alpha=0.6, label="entropy H")
        ax.axhline(tau_v, color="k", ls="--", lw=0.8, label=f"tau_V = {tau_v:g}")
        ax.set_xlabel("position in the returned completion (DTS-Greedy)")
        ax.set_title(f"task={setting}: mean H, V at T_ent by position", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out)


def arm_table(sweep: Sweep, setting: str, labels: dict[str, str]) -> str:
    rows = []
    for arm in ARMS:
        runs = sweep.arm(f"{setting}/{arm}")
        rows.append([labels.get(arm, arm), *(fmt_stat(stat(r.last(m) for r in runs), ci=(i == 0)) for i, (m, _) in enumerate(COLUMNS))])
    return table(["arm", *(c for _, c in COLUMNS)], rows)


def build(sweep: Sweep, out: Path) -> list[Path]:
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    tau_v = float(first.get("demo.varentropy_threshold", math.nan))
    decoder = next((r.get("module.decoder", {}) for r in sweep.runs if r.name.endswith("/dts_greedy")), {}) or {}
    budget = first.get("module.generation.max_new_tokens")
    num_test = first.get("datamodule.source.num_test")
    num_traces = first.get("demo.num_traces")
    recipe = first.get("base_policy", {}) or {}
    backbone = first.get("backbone", {}) or {}
    seeds = len(sweep.seeds) or 1
    forked = (sweep.arm("forked/sample") or sweep.runs)[0]
    png = plot(sweep, labels, tau_v, out / f"{PAPER}.png")

    def acc(setting: str, arm: str) -> list[float]:
        return [r.last("test/exact_match") for r in sweep.arm(f"{setting}/{arm}")]

    def metric(setting: str, arm: str, name: str) -> list[float]:
        return [r.last(name) for r in sweep.arm(f"{setting}/{arm}")]

    text = [
        "# DTS demo: decoding tree sketching vs sampling, greedy and self-consistency",
        "",
        provenance(sweep, PAPER),
        "",
        "## Setup",
        "",
        f"One base SFT policy per seed and task (`+method=sft` through the artifact cache: a {backbone.get('num_hidden_layers')}-layer "
        f"Llama, hidden {backbone.get('hidden_size')}, {recipe.get('num_train')} rows x {recipe.get('max_epochs')} epochs) is "
        f"decoded by five arms on the same {num_test} held-out problems ({seeds} seeds), every trace with the same budget "
        f"of {budget} new tokens: sampling at T 0.6 (one trace), greedy (one trace), self-consistency ({num_traces} samples "
        f"at T 0.6, majority vote of the verifier's answers), DTS-Greedy (the first finished trace of the tree) and "
        f"DTS-Stable (majority vote of the first {num_traces} finished traces). DTS knobs: tau_H "
        f"{decoder.get('entropy_threshold')}, tau_V {decoder.get('varentropy_threshold')}, k {decoder.get('branch_top_k')}, "
        f"max_active {decoder.get('max_active')}, T {decoder.get('temperature')}, T_ent {decoder.get('entropy_temperature')}, "
        f"rule {decoder.get('branch_rule')}.",
        "",
        "- **task=forked** plants one fork right after `<think>`: a short correct line (training share "
        f"{forked.get('task.p_short')}), a loop of {forked.get('task.loop_lines')} repeated lines that cannot end within "
        f"the budget ({forked.get('task.p_loop')}), a medium wrong continuation ({forked.get('task.p_wrong')}). "
        "Everything else is a copy of the question's word.",
        "- **task=multisum** (running sums of 3-5 digits) has no planted fork: the uncertain tokens are the digits the "
        "small policy has not learned well.",
        "",
        "Metrics (per problem, mean over problems, then mean ± sd over seeds [95% CI of the mean] for accuracy): "
        "**accuracy** = the task verifier on the returned completion (for the voting arms: the completion with the "
        "winning answer); **repetition rate** = share of problems whose returned completion has no EOS within the budget; "
        "**tokens (returned)** = length of the returned completion; **tokens (decoded)** = tokens generated by all "
        "samples / hypotheses of the problem (the decoding work); **branch events** = branches of the DTS tree; "
        "**max active** = most hypotheses alive at once.",
        "",
        f"tau_V is lowered from the default 1.5 to {tau_v:g} for this toy: the fork of a small model between three "
        "options has a varentropy far below 1.5, which was set for the long-tailed next-token distributions of "
        "reasoning LLMs over a large vocabulary.",
        "",
    ]
    for setting in SETTINGS:
        text += [f"## {labels.get(setting, setting)}", "", arm_table(sweep, setting, labels), ""]
        text += [
            "- " + contrast("DTS-Greedy", acc(setting, "dts_greedy"), "sampling", acc(setting, "sample"), "accuracy"),
            "- "
            + contrast(
                "DTS-Stable", acc(setting, "dts_stable"), "self-consistency", acc(setting, "self_consistency"), "accuracy"
            ),
            "- " + contrast("DTS-Greedy", acc(setting, "dts_greedy"), "greedy", acc(setting, "greedy"), "accuracy"),
            "- "
            + contrast(
                "DTS-Greedy",
                metric(setting, "dts_greedy", "test/decode/repetition_rate"),
                "sampling",
                metric(setting, "sample", "test/decode/repetition_rate"),
                "repetition rate",
            ),
            "",
        ]
        if setting == "forked":
            rows = []
            for arm in ARMS:
                shares = [branch_shares(r) for r in sweep.arm(f"{setting}/{arm}")]
                rows.append(
                    [labels.get(arm, arm), *(fmt_stat(stat(s[b] for s in shares), ci=False) for b in (*BRANCHES, "other"))]
                )
            text += [
                "Which continuation the returned completion took (share of problems; read from its first reasoning word):",
                "",
                table(["arm", *BRANCHES, "other"], rows),
                "",
            ]
        rows = []
        for arm in DTS_ARMS:
            b = [branching(r) for r in sweep.arm(f"{setting}/{arm}")]
            rows.append(
                [
                    labels.get(arm, arm),
                    fmt_stat(stat(x["at_fork"] for x in b), ci=False),
                    fmt_stat(stat(x["positions"] for x in b), digits=1, ci=False),
                    fmt_stat(stat(x["fork_h"] for x in b), ci=False),
                    fmt_stat(stat(x["fork_v"] for x in b), ci=False),
                    fmt_stat(stat(x["other_v"] for x in b), ci=False),
                ]
            )
        text += [
            f"Where DTS branched (position {FORK_POSITION} of the completion is the token right after `<think>`, the "
            "planted fork of task=forked; H and V at T_ent of the returned completions):",
            "",
            table(
                [
                    "arm",
                    f"branch events at position {FORK_POSITION}",
                    "distinct branch positions",
                    f"H at position {FORK_POSITION}",
                    f"V at position {FORK_POSITION}",
                    "largest V elsewhere (median problem)",
                ],
                rows,
            ),
            "",
        ]
    base = artifact_values(sweep.runs, "base_policy", "val/exact_match")
    text += [
        f"![accuracy by arm and V/H profile]({png.name})",
        "",
        "## Reading",
        "",
        f"- Base policies: greedy validation exact match at the end of their SFT {fmt_stat(stat(base), ci=False)} "
        f"({len(base)} policies).",
        "- The comparison is at a matched budget per trace; the decoding work differs (tokens decoded): "
        "self-consistency decodes every sample to its end, DTS decodes the tree until the first (greedy) or the first "
        "B (stable) traces finish.",
        "- What this toy can show: that branching at a decision token and returning the first finished trace avoids "
        "the long non-terminating continuation and the longer wrong one whenever the short correct one is among the "
        "top-k at the fork, and where (at which positions) DTS branches. What it cannot show: the paper's gains on "
        "reasoning benchmarks with billion-parameter models, where correct traces are not planted to be the shortest.",
    ]
    return [write_page(out, PAPER, text), png]
