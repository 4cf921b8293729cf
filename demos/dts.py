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

import torch

from zoo.data.forked import BRANCHES, ForkedTask
from zoo.generation.dts import entropy_varentropy
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
EVENTS = "branch events / finished traces per problem"
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


def branching(run: Run) -> dict[str, Any]:
    """Where a DTS run branched: branch events per problem, the share of them at the fork position, the positions
    they happened at, mean ``H`` / ``V`` of the returned completions at the fork, and the largest ``V`` at any other
    position of a returned completion and at any position (medians over problems)."""
    rows = records(run)
    steps = [s for r in rows for s in r.get("branch_steps", [])]
    at_fork = [r for r in rows if len(r.get("varentropies", [])) > FORK_POSITION]
    others = sorted(
        max((v for i, v in enumerate(r["varentropies"]) if i != FORK_POSITION), default=0.0)
        for r in rows
        if r.get("varentropies")
    )
    anywhere = sorted(max(r["varentropies"]) for r in rows if r.get("varentropies"))
    return {
        "at_fork": sum(s == FORK_POSITION for s in steps) / len(steps) if steps else math.nan,
        "steps": Counter(steps),
        "finished": _mean(r.get("num_finished", 0) for r in rows),
        "fork_h": _mean(r["entropies"][FORK_POSITION] for r in at_fork),
        "fork_v": _mean(r["varentropies"][FORK_POSITION] for r in at_fork),
        "other_v": others[len(others) // 2] if others else math.nan,
        "max_v": anywhere[len(anywhere) // 2] if anywhere else math.nan,
    }


def common_positions(counts: Counter, top: int = 4) -> str:
    """The most frequent branch positions with their share of all branch events (``"1 (62%), 5 (10%)"``)."""
    total = sum(counts.values())
    return ", ".join(f"{pos} ({100 * n / total:.0f}%)" for pos, n in counts.most_common(top)) if total else "none"


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
    legend(axes[0], fontsize=7)
    for ax, setting in zip(axes[1:], SETTINGS):
        h, v = varentropy_profile(sweep.arm(f"{setting}/dts_greedy"))
        ax.plot(range(len(v)), v, marker=".", label="varentropy V")
        ax.plot(range(len(h)), h, marker=".", alpha=0.6, label="entropy H")
        ax.axhline(tau_v, color="k", ls="--", lw=0.8, label=f"tau_V = {tau_v:g}")
        ax.set_xlabel("position in the returned completion (DTS-Greedy)")
        ax.set_title(f"task={setting}: mean H, V at T_ent by position", fontsize=9)
        legend(ax, fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out)


def arm_table(sweep: Sweep, setting: str, labels: dict[str, str]) -> str:
    rows = []
    for arm in ARMS:
        runs = sweep.arm(f"{setting}/{arm}")
        cells = [fmt_stat(stat(r.last(m) for r in runs), ci=(m == COLUMNS[0][0])) for m, _ in COLUMNS]
        rows.append([labels.get(arm, arm), *cells])
    return table(["arm", *(c for _, c in COLUMNS)], rows)


def branch_table(sweep: Sweep, setting: str, labels: dict[str, str], fork: bool) -> str:
    """Where each DTS arm branched; with ``fork``, the share at the fork position and ``H`` / ``V`` there."""
    rows = []
    for arm in DTS_ARMS:
        found = [branching(r) for r in sweep.arm(f"{setting}/{arm}")]
        pooled = sum((b["steps"] for b in found), Counter())
        runs = sweep.arm(f"{setting}/{arm}")
        events = fmt_stat(stat(r.last("test/decode/branch_events") for r in runs), ci=False)
        events += " / " + fmt_stat(stat(b["finished"] for b in found), digits=1, ci=False)
        if fork:
            at_fork = [fmt_stat(stat(b[k] for b in found), ci=False) for k in ("at_fork", "fork_h", "fork_v")]
            rows.append([labels.get(arm, arm), events, at_fork[0], common_positions(pooled), *at_fork[1:]])
        else:
            rows.append([labels.get(arm, arm), events, common_positions(pooled)])
        rows[-1].append(fmt_stat(stat(b["other_v" if fork else "max_v"] for b in found), ci=False))
    where = "most frequent branch positions (share of events, all seeds)"
    if fork:
        at = f"position {FORK_POSITION}"
        header = ["arm", EVENTS, f"share at {at}", where, f"H at {at}", f"V at {at}"]
        return table([*header, "largest V at another position (median problem)"], rows)
    anywhere = "largest V in the returned completion (median problem)"
    return table(["arm", EVENTS, where, anywhere], rows)


def contrasts(sweep: Sweep, setting: str) -> list[str]:
    """The comparisons of the paper's claim, each a sentence from the numbers ("not shown" within noise)."""

    def values(arm: str, metric: str = "test/exact_match") -> list[float]:
        return [r.last(metric) for r in sweep.arm(f"{setting}/{arm}")]

    repetition = "test/decode/repetition_rate"
    pairs = [
        ("DTS-Greedy", "dts_greedy", "sampling", "sample", "test/exact_match", "accuracy"),
        ("DTS-Greedy", "dts_greedy", "greedy", "greedy", "test/exact_match", "accuracy"),
        ("DTS-Stable", "dts_stable", "self-consistency", "self_consistency", "test/exact_match", "accuracy"),
        ("DTS-Stable", "dts_stable", "sampling", "sample", "test/exact_match", "accuracy"),
        ("DTS-Greedy", "dts_greedy", "sampling", "sample", repetition, "repetition rate"),
        ("DTS-Stable", "dts_stable", "self-consistency", "self_consistency", repetition, "repetition rate"),
        ("DTS-Greedy", "dts_greedy", "sampling", "sample", "test/decode/tokens_per_problem", "returned length"),
    ]
    return [f"- {contrast(na, values(a, m), nb, values(b, m), what)}" for na, a, nb, b, m, what in pairs]


def setup_text(sweep: Sweep, tau_v: float) -> list[str]:
    first = sweep.runs[0]
    forked = (sweep.arm("forked/sample") or sweep.runs)[0]
    dts = next((r.get("module.decoder", {}) for r in sweep.runs if r.name.endswith("/dts_greedy")), {}) or {}
    recipe = first.get("base_policy", {}) or {}
    backbone = first.get("backbone", {}) or {}
    traces = first.get("demo.num_traces")
    seeds = len(sweep.seeds) or 1
    shares = tuple(float(forked.get(f"task.{k}", math.nan)) for k in ("p_short", "p_loop", "p_wrong"))
    t_ent = float(dts.get("entropy_temperature") or math.nan)
    fork_h, fork_v = (float(x) for x in entropy_varentropy(torch.tensor(shares).log(), t_ent))
    knobs = ", ".join(
        f"{name} {dts.get(key)}"
        for name, key in (
            ("tau_H", "entropy_threshold"),
            ("tau_V", "varentropy_threshold"),
            ("k", "branch_top_k"),
            ("max_active", "max_active"),
            ("T", "temperature"),
            ("T_ent", "entropy_temperature"),
            ("rule", "branch_rule"),
        )
    )
    return [
        "## Setup",
        "",
        f"One base SFT policy per seed and task (`+method=sft` through the artifact cache: a "
        f"{backbone.get('num_hidden_layers')}-layer Llama, hidden {backbone.get('hidden_size')}, "
        f"{recipe.get('num_train')} rows x {recipe.get('max_epochs')} epochs) is decoded by five arms on the same "
        f"{first.get('datamodule.source.num_test')} held-out problems per seed ({seeds} seeds), every trace with the "
        f"same budget of {first.get('module.generation.max_new_tokens')} new tokens: sampling at T 0.6 (one trace), "
        f"greedy (one trace), self-consistency ({traces} samples at T 0.6, majority vote of the verifier's answers), "
        f"DTS-Greedy (the first finished trace of the tree) and DTS-Stable (majority vote of the first {traces} "
        f"finished traces). DTS knobs: {knobs}.",
        "",
        "- **task=forked** plants one fork right after `<think>`: a short correct line (training share "
        f"{forked.get('task.p_short')}), a loop of {forked.get('task.loop_lines')} repeated lines that cannot end "
        f"within the budget ({forked.get('task.p_loop')}), a medium wrong continuation ({forked.get('task.p_wrong')}). "
        "Everything else is a copy of the question's word.",
        "- **task=multisum** (running sums of 3-5 digits) has no planted fork: the uncertain tokens are wherever the "
        "small policy has not learned the sums well.",
        "",
        "Metrics (per problem, mean over the problems of a run; mean ± sd over seeds, with the 95% CI of the mean for "
        "accuracy): **accuracy** = the task verifier on the returned completion (voting arms: the first completion "
        "with the winning answer); **repetition rate** = share of problems whose returned completion has no EOS "
        "within the budget; **tokens (returned)** = length of the returned completion; **tokens (decoded)** = tokens "
        "generated by all samples / hypotheses of the problem (the decoding work); **branch events** = branches of "
        "the DTS tree; **max active** = most hypotheses alive at once.",
        "",
        f"tau_V is lowered from the default 1.5 to {tau_v:g} here: a fork between three options has a varentropy "
        f"well below 1.5 (H {fork_h:.2f}, V {fork_v:.2f} for the training shares {shares} at T_ent "
        f"{dts.get('entropy_temperature')}; the trained policies' values are in the tables below), a threshold set for "
        "the long-tailed next-token distributions of reasoning LLMs over a large vocabulary.",
        "",
    ]


def forked_reading(sweep: Sweep, labels: dict[str, str]) -> list[str]:
    """Sentences on task=forked filled from the records: which continuation each DTS arm returns, and how many of its
    branch events lie beyond the longest short (correct) continuation, i.e. inside the loop or the wrong one."""
    short_len = max(
        (
            int(r["completion_tokens"])
            for run in sweep.runs
            if run.name.startswith("forked/")
            for r in records(run)
            if ForkedTask.branch_of(r["completion"]) == "short" and r.get("finished")
        ),
        default=0,
    )
    lines = []
    for arm in DTS_ARMS:
        runs = sweep.arm(f"forked/{arm}")
        shares = [branch_shares(r) for r in runs]
        steps = [s for r in runs for row in records(r) for s in row.get("branch_steps", [])]
        beyond = sum(s >= short_len for s in steps) / len(steps) if steps else math.nan
        lines.append(
            f"- {labels.get(arm, arm)} returned the short correct continuation on "
            f"{fmt_stat(stat(s['short'] for s in shares), ci=False)} of problems and the wrong one on "
            f"{fmt_stat(stat(s['wrong'] for s in shares), ci=False)}; {100 * beyond:.0f}% of its branch events "
            f"(all seeds) are at positions >= {short_len}, the length of the longest short continuation, i.e. inside "
            "the loop or the wrong continuation."
        )
    lines.append(
        "- DTS-Stable votes over finished traces, not over probability mass: a continuation whose tokens the policy "
        "hesitates over branches more and can finish with several traces, while a continuation without hesitation "
        "finishes as one trace; DTS-Greedy only needs the short one to finish first."
    )
    return lines


def build(sweep: Sweep, out: Path) -> list[Path]:
    labels = sweep.runs[0].get("demo.labels", {}) or {}
    tau_v = float(sweep.runs[0].get("demo.varentropy_threshold", math.nan))
    png = plot(sweep, labels, tau_v, out / f"{PAPER}.png")
    text = [
        "# DTS demo: decoding tree sketching vs sampling, greedy and self-consistency",
        "",
        provenance(sweep, PAPER),
        "",
        *setup_text(sweep, tau_v),
    ]
    for setting in SETTINGS:
        runs = [r for arm in ARMS for r in sweep.arm(f"{setting}/{arm}")]
        base = artifact_values(runs, "base_policy", "val/exact_match")
        text += [
            f"## {labels.get(setting, setting)}",
            "",
            f"Base policies: greedy validation exact match at the end of their SFT {fmt_stat(stat(base), ci=False)} "
            f"({len(base)} policies).",
            "",
            arm_table(sweep, setting, labels),
            "",
            *contrasts(sweep, setting),
            "",
        ]
        if setting == "forked":
            rows = []
            for arm in ARMS:
                shares = [branch_shares(r) for r in sweep.arm(f"{setting}/{arm}")]
                cells = [fmt_stat(stat(s[b] for s in shares), ci=False) for b in (*BRANCHES, "other")]
                rows.append([labels.get(arm, arm), *cells])
            text += [
                "Which continuation the returned completion took (share of problems, from its first reasoning word):",
                "",
                table(["arm", *BRANCHES, "other"], rows),
                "",
            ]
        if setting == "forked":
            text += [*forked_reading(sweep, labels), ""]
        fork = setting == "forked"
        where = f"; position {FORK_POSITION}, right after `<think>`, is the planted fork" if fork else ""
        text += [
            f"Where DTS branched (positions count from 0 = the first generated token{where}; H and V at T_ent of the "
            "returned completions):",
            "",
            branch_table(sweep, setting, labels, fork),
            "",
        ]
    text += [
        f"![accuracy by arm; mean H and V by position]({png.name})",
        "",
        "## What this toy can and cannot show",
        "",
        "- The comparison is at a matched budget per trace; the decoding work differs (tokens decoded): "
        "self-consistency decodes every sample to its end, DTS decodes its tree until the first (greedy) or the first "
        "B (stable) traces finish.",
        "- It can show whether branching at a decision token and returning the first finished trace leaves behind the "
        "long non-terminating continuation and the longer wrong one, and at which positions DTS branches. It cannot "
        "show the paper's gains on reasoning benchmarks with billion-parameter models, where correct traces are not "
        "planted to be the shortest.",
    ]
    return [write_page(out, PAPER, text), png]
