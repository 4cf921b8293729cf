"""Page builder of the WET demo (a reconstruction; research notes inference.md 2(d)): ``docs/results/wet.md`` +
``wet.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=wet`` (``conf/demo/wet.yaml``); page:
``python -m zoo.report demo wet``. Everything below is read from the sweep: the callback's per-row records
(``wet_records.jsonl``: distance, late conflicting mention, answer, misattribution, world entropy ``H`` and gate at
the answer position), the fit each run used (``wet_fit.json``: heads, scores), the logged metrics, the resolved
configs and ``run_info.json`` (the base policy each seed used, with its build metrics).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from zoo.interp.probes import auroc
from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    contrast,
    legend,
    paired_contrast,
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

PAPER = "wet"
RECORDS = "wet_records.jsonl"
FIT = "wet_fit.json"
ARMS = ("none", "wet", "random", "probe")
Row = dict[str, Any]


def records(run: Run) -> list[Row]:
    """The callback's per-row records of the run's test stage."""
    return [r for r in run.read_jsonl(RECORDS) if r["stage"] == "test"] if run.file(RECORDS).is_file() else []


def in_distribution(row: Row, bins: Sequence[Sequence[int]]) -> bool:
    """A prompt like the training ones: distance in the first bin (the training range), no late mention."""
    return row["conflict_world"] < 0 and bins[0][0] <= row["distance"] <= bins[0][1]


def mean(xs: Any) -> float:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else math.nan


def entropy_auroc(rows: list[Row]) -> float:
    """AUROC of ``H`` at the answer position for predicting a misattribution (``nan`` when one outcome is absent)."""
    labels = [r["misattributed"] for r in rows]
    if len(set(labels)) < 2:
        return math.nan
    return auroc(torch.tensor([r["entropy"] for r in rows]), torch.tensor(labels))


def per_run(run: Run, bins: Sequence[Sequence[int]]) -> dict[str, float]:
    """The run's rates: overall, in distribution, by distance bin with and without a late conflicting mention."""
    rows = records(run)
    if not rows:  # a run that did not finish: left out
        return {}
    ind = [r for r in rows if in_distribution(r, bins)]
    out = {
        "n": float(len(rows)),
        "accuracy": mean(r["correct"] for r in rows),
        "wmr": mean(r["misattributed"] for r in rows),
        "auroc": entropy_auroc(rows),
        "accuracy_ind": mean(r["correct"] for r in ind),
        "wmr_ind": mean(r["misattributed"] for r in ind),
        "false_gate": mean(r["gate"] > 0 for r in ind),
        "gate_drift": mean(r["gate"] > 0 for r in rows if not in_distribution(r, bins)),
        "entropy_ind": mean(r["entropy"] for r in ind),
        "entropy_drift": mean(r["entropy"] for r in rows if not in_distribution(r, bins)),
        "gate_open_wrong": mean(r["gate"] > 0 for r in rows if r["misattributed"]),
        "gate_mean_wrong": mean(r["gate"] for r in rows if r["misattributed"]),
    }
    for conflict in (False, True):
        tag = "conflict" if conflict else "plain"
        picked = [r for r in rows if (r["conflict_world"] >= 0) == conflict]
        out[f"wmr_{tag}"] = mean(r["misattributed"] for r in picked)
        out[f"accuracy_{tag}"] = mean(r["correct"] for r in picked)
        out[f"auroc_{tag}"] = entropy_auroc(picked)
        out[f"to_conflict_{tag}"] = mean(r["attributed_world"] == r["conflict_world"] for r in picked)
        for i, (lo, hi) in enumerate(bins):
            in_bin = [r for r in picked if lo <= r["distance"] <= hi]
            out[f"wmr_{tag}_{i}"] = mean(r["misattributed"] for r in in_bin)
            out[f"n_{tag}_{i}"] = float(len(in_bin))
    return out


def heads_of(run: Run) -> str:
    """The rescaled heads of the run, ``L<layer>H<head>``."""
    if not run.file(FIT).is_file():
        return "-"
    return ", ".join(f"L{layer}H{head}" for layer, head in run.read_json(FIT)["heads"])


def build(sweep: Sweep, out: Path) -> list[Path]:
    arms = sweep.arms()
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    bins = [tuple(b) for b in first.get("demo.bins")]
    rates = {name: [per_run(r, bins) for r in runs] for name, runs in arms.items()}
    by_seed = {name: {r.seed: v for r, v in zip(arms[name], rates[name])} for name in arms}

    def paired(arm: str, base: str, key: str) -> str:
        """Same-seed comparison of two arms on ``key`` (the arms of a seed share the policy, probe and prompts)."""
        a = {seed: v[key] for seed, v in by_seed.get(arm, {}).items() if key in v}
        b = {seed: v[key] for seed, v in by_seed.get(base, {}).items() if key in v}
        what = "WMR" if key.startswith("wmr") else "accuracy" if key.startswith("accuracy") else key
        return paired_contrast(lab(arm), a, lab(base), b, what)

    def values(arm: str, key: str) -> list[float]:
        return [v[key] for v in rates.get(arm, []) if key in v and not math.isnan(v[key])]

    def cell(arm: str, key: str, digits: int = 3, ci: bool = True) -> str:
        return fmt_stat(stat(values(arm, key)), digits, ci) if values(arm, key) else "-"

    def lab(arm: str) -> str:
        return labels.get(arm, arm)

    names = [a for a in ARMS if a in arms] + [a for a in arms if a not in ARMS]
    main_rows = [
        [
            lab(a),
            cell(a, "accuracy"),
            cell(a, "wmr"),
            cell(a, "accuracy_ind"),
            cell(a, "false_gate", ci=False),
            cell(a, "auroc", ci=False),
        ]
        for a in names
    ]
    bin_names = [f"{lo}–{hi}" for lo, hi in bins]
    distance_rows = {
        tag: [[lab(a)] + [cell(a, f"wmr_{tag}_{i}", ci=False) for i in range(len(bins))] for a in names]
        for tag in ("plain", "conflict")
    }
    counts = {
        tag: [f"{stat(values(names[0], f'n_{tag}_{i}')).mean:.0f}" for i in range(len(bins))]
        for tag in ("plain", "conflict")
    }
    head_rows = [[lab(a)] + [heads_of(r) for r in arms[a]] for a in names]
    png = plot(names, lab, values, bin_names, out / f"{PAPER}.png")

    cfg = first.config
    # the gate settings of a rescaling arm (the no-intervention arm has alpha = 0)
    wet = (arms.get("wet") or sweep.runs)[0].config.get("callbacks", {}).get("wet", {})
    eval_task, task, recipe = cfg.get("eval_task", {}), cfg.get("task", {}), cfg.get("base_policy", {})
    policy_em = stat(artifact_values(sweep.runs, "base_policy", "val/exact_match"))
    seeds = len(sweep.seeds) or 1
    log_k = math.log(task.get("num_worlds", 4))
    backbone = cfg.get("backbone", {})
    layers, heads = backbone.get("num_hidden_layers"), backbone.get("num_attention_heads")
    candidates = (layers - wet.get("probe_layer", 0) - 1) * heads if layers and heads else "?"
    text = [
        "# WET (World Entropy Tethering) — demo results",
        "",
        "WET could not be retrieved (no paper text, arXiv id or code); the zoo's WET is a **reconstruction** from the "
        "abstract (`docs/methods/wet.md`), and so is this demo's task (research notes `inference.md` §2(d)). "
        "Regenerated through the demo path (`conf/demo/wet.yaml`, page builder `demos/wet.py`).",
        "",
        provenance(sweep, PAPER),
        "",
        "Task (`zoo/data/multiworld.py`): multi-world key–value recall, `W2:qhdkw E07=` → `N`: "
        f"{task.get('num_worlds')} worlds, {task.get('num_entities')} entities, each world a permutation of the values "
        "(rows of a Latin square, so every wrong answer that is another world's value is attributable to it); "
        f"W{task.get('dominant_world')} is {task.get('dominant_prob')} of the training draws (the parametric prior); "
        f"training distractor spans of {task.get('min_distractors')}–{task.get('max_distractors')} characters, no "
        "conflicting mentions.",
        "",
        f"Setup, per seed (the seed is the whole pipeline's: policy, probe, head ranking, test prompts; {seeds} "
        f"seed{'s' if seeds != 1 else ''}): policy = the cached base SFT policy of `task=multiworld` (tiny Llama, "
        f"{recipe.get('num_train')} rows × {recipe.get('max_epochs')} epochs, batch {recipe.get('batch_size')}, peak "
        f"lr {recipe.get('lr')}; held-out greedy exact match {fmt_stat(policy_em, ci=False)}); world probe on the "
        f"residual after layer {wet.get('probe_layer')}, fitted on {wet.get('max_rows')} training prompts; "
        f"{wet.get('num_heads')} rescaled heads above it; gate `g = clip((H − η)/(log K − η), 0, 1)` with "
        f"η = {wet.get('eta')} (log K = {log_k:.3f}), heads × (1 + α g) with α = {wet.get('alpha')} (no-intervention "
        f"arm: α = 0), β = {wet.get('beta')}. Test: {stat(values(names[0], 'n')).mean:.0f} prompts per run with "
        f"distractor spans of {eval_task.get('min_distractors')}–{eval_task.get('max_distractors')} characters and a "
        f"late conflicting mention (` see W<k'>`) with probability {eval_task.get('conflict_prob')}; greedy decoding. "
        "The same prompts and the same probe (hence the same `H` at the answer position, which is read below the "
        "rescaled heads) in every arm of a seed; only the rescaled heads differ.",
        "",
        "Definitions: WMR (world misattribution rate) = answers that are the entity's value in another world; "
        "accuracy = exact answers; *in distribution* = distance "
        f"{bins[0][0]}–{bins[0][1]} without a conflicting mention (like the training prompts); false-gate rate = "
        "in-distribution rows whose gate opens at the answer position (`g > 0`); AUROC of `H` = how well the world "
        "entropy at the answer position ranks misattributed answers above the others (all test rows). Distance = "
        "distractor characters between the world tag and the query (a late mention included).",
        "",
        f"Cells: mean ± sd over the {seeds} seeds [95% confidence interval of the mean, Student t; wide with few "
        "seeds].",
        "",
        table(
            ["arm", "accuracy", "WMR", "accuracy (in distribution)", "false-gate rate", "AUROC of H for WMR"],
            main_rows,
        ),
        "WMR by distance, prompts **without** a conflicting mention (rows per bin and seed: "
        + ", ".join(f"{b}: {c}" for b, c in zip(bin_names, counts["plain"]))
        + "):",
        "",
        table(["arm"] + bin_names, distance_rows["plain"]),
        "WMR by distance, prompts **with** a late conflicting mention (rows per bin and seed: "
        + ", ".join(f"{b}: {c}" for b, c in zip(bin_names, counts["conflict"]))
        + "):",
        "",
        table(["arm"] + bin_names, distance_rows["conflict"]),
        f"![WMR vs distance]({png.name})",
        "",
        "Rescaled heads per seed (`L<layer>H<head>`; the no-intervention arm lists the score-matching heads it "
        "would rescale):",
        "",
        table(["arm"] + [f"seed {s}" for s in sweep.seeds], head_rows),
        "## Reading",
        "",
        *reading(values, paired, lab, bins, wet),
        "",
        "## What this scale can and cannot show",
        "",
        "- It can show whether the mechanism, as reconstructed, moves the measured rates on a task where world "
        "misattribution is well defined and every wrong answer is attributable; whether the world entropy read by a "
        "linear probe flags the rows that go wrong; and whether rescaling heads chosen by the geometry model differs "
        "from rescaling random heads or heads chosen by probe accuracy.",
        "- It cannot show anything about the paper's models, benchmarks or numbers (none could be retrieved), and a "
        f"{layers}-layer × {heads}-head model leaves few candidate heads above the probe layer ({candidates} here), "
        "so the rankers can agree by chance. η, α and the number of heads are the method config's defaults; the "
        "probe layer was chosen on in-distribution prompts (false-gate rate, see `conf/demo/wet.yaml`), not on WMR.",
    ]
    return [write_page(out, PAPER, text), png]


def reading(
    values: Callable[[str, str], list[float]],
    paired: Callable[[str, str, str], str],
    lab: Callable[[str], str],
    bins: Sequence[Sequence[int]],
    wet: dict,
) -> list[str]:
    """The reading, sentence by sentence from the numbers (``not shown`` where the seeds do not resolve it). Arms
    of one seed share the policy, probe and test prompts, so each arm comparison is also given paired by seed."""

    def m(arm: str, key: str) -> float:
        return stat(values(arm, key)).mean

    last = len(bins) - 1
    notes = [
        "- Drift by distance alone: "
        + contrast(
            f"{lab('none')}, distance {bins[last][0]}–{bins[last][1]}",
            values("none", f"wmr_plain_{last}"),
            f"distance {bins[0][0]}–{bins[0][1]}",
            values("none", "wmr_plain_0"),
            "WMR without a conflicting mention",
        )
        + ".",
        "- Drift by a late conflicting mention: "
        + contrast(
            "prompts with the mention",
            values("none", "wmr_conflict"),
            "prompts without it",
            values("none", "wmr_plain"),
            f"WMR ({lab('none')})",
        )
        + f"; {m('none', 'to_conflict_conflict'):.3f} of the answers to prompts with a mention are the mentioned "
        "world's value.",
        f"- World entropy as a detector ({lab('none')}): AUROC of `H` for predicting a misattribution "
        f"{fmt_stat(stat(values('none', 'auroc')))} over all rows, "
        f"{fmt_stat(stat(values('none', 'auroc_conflict')), ci=False)} among prompts with a conflicting mention; "
        f"mean `H` in distribution {m('none', 'entropy_ind'):.3f} vs {m('none', 'entropy_drift'):.3f} under drift; "
        f"the gate opens on {m('none', 'false_gate'):.3f} of in-distribution rows (η = {wet.get('eta')}) and "
        f"{m('none', 'gate_drift'):.3f} of the others. Among the misattributed answers the gate is open on "
        f"{m('none', 'gate_open_wrong'):.3f} of the rows at the answer position, with mean g "
        f"{m('none', 'gate_mean_wrong'):.3f}"
        + (
            ": the rescaling (factor 1 + α g) acts on a minority of the rows it targets, and weakly."
            if m("none", "gate_open_wrong") < 0.5 and m("none", "gate_mean_wrong") < 0.5
            else "."
        ),
    ]
    for arm in ("wet", "random", "probe"):
        notes.append(
            "- "
            + contrast(lab(arm), values(arm, "wmr"), lab("none"), values("none", "wmr"), "WMR")
            + "; "
            + paired(arm, "none", "wmr")
            + "; in distribution, "
            + paired(arm, "none", "accuracy_ind")
            + "."
        )
    notes += [
        "- WET against the baselines of head choice: "
        + paired("wet", "random", "wmr")
        + "; "
        + paired("wet", "probe", "wmr")
        + ".",
        "- Under conflicting mentions only: "
        + paired("wet", "none", "wmr_conflict")
        + "; "
        + paired("wet", "none", "accuracy_conflict")
        + ".",
    ]
    return notes


def plot(
    names: list[str],
    lab: Callable[[str], str],
    values: Callable[[str, str], list[float]],
    bin_names: list[str],
    path: Path,
) -> Path:
    """WMR vs distance bin per arm (mean and 95% CI over seeds), without / with a late conflicting mention."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6), sharey=True)
    xs = list(range(len(bin_names)))
    for ax, tag, title in zip(axes, ("plain", "conflict"), ("no conflicting mention", "late conflicting mention")):
        for offset, arm in enumerate(names):
            stats = [stat(values(arm, f"wmr_{tag}_{i}")) for i in xs]
            ys = [s.mean for s in stats]
            err = [[s.mean - s.lo if s.n > 1 else 0 for s in stats], [s.hi - s.mean if s.n > 1 else 0 for s in stats]]
            shifted = [x + 0.06 * (offset - (len(names) - 1) / 2) for x in xs]
            ax.errorbar(shifted, ys, yerr=err, marker="o", capsize=3, label=f"{lab(arm)} (n={stats[0].n})")
        ax.set_xticks(xs, bin_names)
        ax.set(xlabel="distance (distractor characters)", title=title)
    axes[0].set_ylabel("world misattribution rate")
    legend(axes[0], fontsize=7)
    fig.suptitle("WET demo: WMR vs distance (mean, 95% CI over seeds)", fontsize=9)
    return save_figure(fig, path, dpi=120)
