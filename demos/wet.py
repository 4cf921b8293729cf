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
    LOSS_FLOOR_NATS,
    Run,
    Sweep,
    artifact_values,
    contrast,
    decaying_schedule_caveat,
    legend,
    loss_settled,
    paired_contrast,
    provenance,
    pyplot,
    save_figure,
    table,
    val_loss_plateau,
    write_page,
)
from zoo.stats import (
    fmt_stat,
    paired,
    stat,
)
from zoo.verdict import Claim, seeds_note, verdict_section

PAPER = "wet"
RECORDS = "wet_records.jsonl"
FIT = "wet_fit.json"
ARMS = ("none", "wet", "random", "probe")
Row = dict[str, Any]
# the smallest WMR (or accuracy) difference between arms that counts as an effect in the verdict, and the band within
# which in-distribution accuracy counts as unchanged
MARGIN = 0.005
# paired differences smaller than this call for at least 5 seeds (docs: >= 3 seeds, >= 5 where the effect is small)
SMALL_EFFECT = 0.02
# a base policy is at a plateau when its validation loss changed by less than this fraction over its last epoch, or by
# less than zoo.report.LOSS_FLOOR_NATS in absolute terms (a loss this close to 0 moves by large fractions of itself:
# 0.0006 -> 0.0005 is -17% of a loss that is already at its floor)
PLATEAU = 0.05


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
        "gate_open_right": mean(r["gate"] > 0 for r in rows if r["correct"]),
        "gate_mean_right": mean(r["gate"] for r in rows if r["correct"]),
        "gate_mean_ind": mean(r["gate"] for r in ind),
        "gate_mean_drift": mean(r["gate"] for r in rows if not in_distribution(r, bins)),
        "wmr_drift": mean(r["misattributed"] for r in rows if not in_distribution(r, bins)),
        "accuracy_drift": mean(r["correct"] for r in rows if not in_distribution(r, bins)),
    }
    out["gate_gap"] = out["gate_mean_wrong"] - out["gate_mean_right"]
    out["auroc_excess"] = out["auroc"] - 0.5
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


def head_set(run: Run) -> frozenset[tuple[int, int]] | None:
    """The heads the run rescaled (``None`` without a fit file)."""
    if not run.file(FIT).is_file():
        return None
    return frozenset((int(layer), int(head)) for layer, head in run.read_json(FIT)["heads"])


def heads_of(run: Run) -> str:
    """The rescaled heads of the run, ``L<layer>H<head>``."""
    heads = head_set(run)
    if heads is None:
        return "-"
    return ", ".join(f"L{layer}H{head}" for layer, head in sorted(heads))


def jaccard(a: frozenset | None, b: frozenset | None) -> float:
    """``|a & b| / |a | b|`` of two head sets (``nan`` when one is missing)."""
    if a is None or b is None or not (a | b):
        return math.nan
    return len(a & b) / len(a | b)


def overlaps(arms: dict[str, list[Run]]) -> dict[tuple[str, str], dict[int, float]]:
    """Jaccard overlap of the head sets of two rescaling arms, per seed."""
    sets = {arm: {r.seed: head_set(r) for r in runs} for arm, runs in arms.items()}
    pairs = [("wet", "random"), ("wet", "probe"), ("random", "probe")]
    return {
        (a, b): {seed: jaccard(sets[a][seed], sets[b].get(seed)) for seed in sets[a]}
        for a, b in pairs
        if a in sets and b in sets
    }


def build(sweep: Sweep, out: Path) -> list[Path]:
    arms = sweep.arms()
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    bins = [tuple(b) for b in first.get("demo.bins")]
    rates = {name: [per_run(r, bins) for r in runs] for name, runs in arms.items()}
    by_seed = {name: {r.seed: v for r, v in zip(arms[name], rates[name])} for name in arms}

    def paired_text(arm: str, base: str, key: str) -> str:
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
    # one column per seed: a merged sweep's runs are not in seed order
    head_rows = [
        [lab(a)] + [heads_of(by_seed[seed]) if seed in by_seed else "-" for seed in sweep.seeds]
        for a in names
        for by_seed in [{r.seed: r for r in arms[a]}]
    ]
    jac = overlaps(arms)
    overlap_rows = [
        [f"{lab(a)} vs {lab(b)}"] + [f"{per_seed.get(seed, math.nan):.2f}" for seed in sweep.seeds]
        for (a, b), per_seed in jac.items()
    ]
    gate_rows = [
        [
            lab(a),
            cell(a, "gate_mean_wrong", ci=False),
            cell(a, "gate_mean_right", ci=False),
            cell(a, "gate_open_wrong", ci=False),
            cell(a, "gate_open_right", ci=False),
            cell(a, "gate_mean_ind", ci=False),
            cell(a, "gate_mean_drift", ci=False),
        ]
        for a in names
    ]
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
    etas = [float(r.read_json(FIT)["eta"]) for r in sweep.runs if r.file(FIT).is_file()]
    eta_text = (
        f"η calibrated per seed as the {wet.get('eta_quantile')} quantile of `H` at the last prompt token of "
        f"{wet.get('source', {}).get('num_val')} held-out in-distribution prompts "
        f"(the `{wet.get('calibration_split')}` split of the policy's task; "
        f"η = {min(etas):.3f}–{max(etas):.3f} over the runs)"
        if wet.get("eta_quantile") is not None and etas
        else f"η = {wet.get('eta')}"
    )
    found = claims(by_seed, lab)
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
        f"lr {recipe.get('lr')}, {layers} layers × {heads} heads; held-out greedy exact match "
        f"{fmt_stat(policy_em, ci=False)}); world probe on the residual after layer {wet.get('probe_layer')}, fitted "
        f"on {wet.get('max_rows')} training prompts at `{wet.get('probe_positions')}` positions (the prompt anchors "
        f"are the tokens matched by `{wet.get('anchor_pattern')}`, the world tag's number; see "
        '`docs/methods/wet.md`, "Where the probe is fitted"); '
        f"{wet.get('num_heads')} rescaled heads among the {candidates} above it; gate "
        f"`g = clip((H − η)/(log K − η), 0, 1)` with {eta_text} (log K = {log_k:.3f}), heads × (1 + α g) with "
        f"α = {wet.get('alpha')} (no-intervention arm: α = 0), β = {wet.get('beta')}. "
        f"Test: {stat(values(names[0], 'n')).mean:.0f} prompts per run with "
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
        f"Overlap of the rescaled head sets (Jaccard index |A ∩ B| / |A ∪ B|, per seed; {wet.get('num_heads')} heads "
        f"of {candidates} eligible; 1 = the same heads, 0 = disjoint):",
        "",
        table(["arms"] + [f"seed {s}" for s in sweep.seeds], overlap_rows),
        "Gate at the answer position (the last prompt token; mean over seeds of the per-run means): mean `g` and the "
        "share of rows with `g > 0`, on misattributed vs correct answers, and mean `g` in distribution vs under drift "
        "(`H` is read below the rescaled heads, so the gate at this position is the same in every arm of a seed):",
        "",
        table(
            [
                "arm",
                "mean g, misattributed",
                "mean g, correct",
                "g > 0, misattributed",
                "g > 0, correct",
                "mean g, in distribution",
                "mean g, drift",
            ],
            gate_rows,
        ),
        "## Reading",
        "",
        *reading(values, paired_text, lab, bins, wet),
        "",
        *fair_test(sweep, values, jac, found, lab, wet, candidates),
        "## What this scale can and cannot show",
        "",
        "- It can show whether the mechanism, as reconstructed, moves the measured rates on a task where world "
        "misattribution is well defined and every wrong answer is attributable; whether the world entropy read by a "
        "linear probe flags the rows that go wrong; and whether rescaling heads chosen by the geometry model differs "
        "from rescaling random heads or heads chosen by probe accuracy.",
        f"- It cannot show anything about the paper's models, benchmarks or numbers (none could be retrieved). Every "
        f"knob (probe layer {wet.get('probe_layer')}, probe positions, the η quantile, α, "
        f"{wet.get('num_heads')} heads) is the same in every arm (`conf/demo/wet.yaml`); none was tuned on the arms' "
        "WMR (the probe layer was chosen on a dev split, by how well `H` flags the no-intervention policy's "
        "misattributions).",
    ]
    return [write_page(out, PAPER, text, verdict(found)), png]


def claims(by_seed: dict[str, dict[int, dict[str, float]]], lab: Callable[[str], str]) -> list[Claim]:
    """The claims the demo tests (the abstract's: WET lowers world misattribution, through entropy-gated rescaling of
    the heads a geometry model picks; the research notes' expectations: WMR rises with drift, H flags it, the gate
    stays closed in distribution), each a paired difference over seeds (the arms of a seed share the policy, the
    probe and the prompts)."""

    def of(arm: str, key: str) -> dict[int, float]:
        return {seed: v[key] for seed, v in by_seed.get(arm, {}).items() if key in v and not math.isnan(v[key])}

    def zero(arm: str, key: str) -> dict[int, float]:
        return dict.fromkeys(of(arm, key), 0.0)

    found = [
        Claim(
            "world misattribution rises under drift (longer spans, a late conflicting mention)",
            f"WMR, drift − in distribution, {lab('none')}, paired by seed",
            paired(of("none", "wmr_drift"), of("none", "wmr_ind")),
            "higher",
            MARGIN,
        ),
        Claim(
            "the world entropy H flags misattribution",
            f"AUROC of H for a misattribution − 0.5 (chance), {lab('none')}, all test rows, per seed",
            paired(of("none", "auroc_excess"), zero("none", "auroc_excess")),
            "higher",
            0.0,
        ),
        Claim(
            "the gate opens on the rows that go wrong",
            f"mean g at the answer position, misattributed − correct rows, {lab('none')}, per seed",
            paired(of("none", "gate_gap"), zero("none", "gate_gap")),
            "higher",
            0.0,
        ),
    ]
    for base, claim in (
        ("none", "WET lowers world misattribution under drift vs no intervention"),
        ("random", "WET lowers world misattribution under drift vs rescaling random heads"),
        ("probe", "WET lowers world misattribution under drift vs rescaling the top heads by probe accuracy"),
    ):
        found.append(
            Claim(
                claim,
                f"WMR on drift rows, {lab('wet')} − {lab(base)}, paired by seed",
                paired(of("wet", "wmr_drift"), of(base, "wmr_drift")),
                "lower",
                MARGIN,
            )
        )
    found.append(
        Claim(
            "WET leaves in-distribution accuracy unchanged",
            f"accuracy in distribution, {lab('wet')} − {lab('none')}, paired by seed (band ±{MARGIN})",
            paired(of("wet", "accuracy_ind"), of("none", "accuracy_ind")),
            "within",
            MARGIN,
        )
    )
    return found


def verdict(found: list[Claim]) -> list[str]:
    return verdict_section(
        found,
        "anything about the paper's models, benchmarks or numbers (no paper text, code or results could be "
        "retrieved; the method and this task are reconstructions); whether WET's geometry model finds heads on "
        "natural-language worlds (fictional settings, documents), where the world is not one tagged token.",
    )


def fair_test(
    sweep: Sweep,
    values: Callable[[str, str], list[float]],
    jac: dict[tuple[str, str], dict[int, float]],
    found: list[Claim],
    lab: Callable[[str], str],
    wet: dict,
    candidates: Any,
) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""

    def m(arm: str, key: str) -> float:
        return stat(values(arm, key)).mean

    lines = ["## Fair test", ""]
    wmr_conflict, wmr_drift = m("none", "wmr_conflict"), m("none", "wmr_drift")
    occurs = wmr_drift > MARGIN
    lines.append(
        "- **The baseline's failure can occur.** Without intervention the policy misattributes "
        f"{wmr_drift:.3f} of the drift rows ({wmr_conflict:.3f} of the prompts with a late conflicting mention; "
        f"{m('none', 'wmr_ind'):.3f} in distribution): "
        + ("**met**." if occurs else f"**not met** (below the verdict's margin {MARGIN}).")
    )
    wet_random = stat(v for v in jac.get(("wet", "random"), {}).values() if not math.isnan(v))
    wet_probe = stat(v for v in jac.get(("wet", "probe"), {}).values() if not math.isnan(v))
    gap = m("none", "gate_gap")
    differ = wet_random.n > 0 and wet_random.mean < 1 and wet_probe.n > 0 and wet_probe.mean < 1
    lines.append(
        "- **The method's signal carries information the baselines lack.** WET's heads come from the score-matching "
        f"geometry model; overlap of its head set with the random heads {fmt_stat(wet_random, 2, ci=False)}, with "
        f"the probe-accuracy heads {fmt_stat(wet_probe, 2, ci=False)} (Jaccard, mean over seeds; {candidates} "
        "eligible heads) -- the rankers "
        + ("pick different heads: **met**" if differ else "pick the same heads: **not met**")
        + f". The gate reads `H`, which the no-intervention arm does not use: mean g on misattributed rows "
        f"{m('none', 'gate_mean_wrong'):.3f} vs {m('none', 'gate_mean_right'):.3f} on correct ones ("
        + ("higher on the rows that go wrong" if gap > 0 else "not higher on the rows that go wrong")
        + f"); AUROC of H {m('none', 'auroc'):.3f}."
    )
    lines.append(
        "- **Same tuning effort for every arm.** None for any arm: the probe positions, the η quantile, "
        f"α = {wet.get('alpha')} and {wet.get('num_heads')} heads are fixed in `conf/demo/wet.yaml`, and the probe "
        f"layer ({wet.get('probe_layer')}) was chosen once, on a dev split of drifted prompts answered without "
        "intervention (see that file), before the arms were compared; all are the same in every rescaling arm, only "
        "the ranker differs (the no-intervention arm: α = 0)."
    )
    lines.append(
        "- **Thresholds chosen on a split that is not reported.** η is the "
        f"{wet.get('eta_quantile')} quantile of `H` on the `{wet.get('calibration_split')}` split of the policy's task "
        "(in-distribution prompts drawn with seed + 1); the probe and the rankers are fitted on its `train` split; "
        "the tables report the test prompts (seed + 2, with drift). The false-gate rate on the reported "
        f"in-distribution rows is {m('none', 'false_gate'):.3f} (about {1 - float(wet.get('eta_quantile') or 0):.2f} "
        "expected from the calibration)."
        if wet.get("eta_quantile") is not None
        else f"- **Thresholds chosen on a split that is not reported.** η = {wet.get('eta')} is fixed, not chosen."
    )
    loss, change = val_loss_plateau(sweep.runs)
    _, drop = val_loss_plateau(sweep.runs, absolute=True)
    em = stat(artifact_values(sweep.runs, "base_policy", "val/exact_match"))
    met = "met" if loss.n and loss_settled(change.mean, drop.mean, PLATEAU) else "not met"
    lines.append(
        f"- **Models trained to a plateau.** The base policies (one per seed, the same for every arm): final "
        f"validation loss {fmt_stat(loss, 4, ci=False)}, change over the last epoch {100 * change.mean:+.1f}% "
        f"({drop.mean:+.4f} nats per token; mean over the {loss.n} policies; a plateau by the loss: a change of less "
        f"than {100 * PLATEAU:.0f}%, or of less than {LOSS_FLOOR_NATS:g} nats where the loss is this close to 0 that a "
        f"few ten-thousandths are large fractions of it: **{met}**); held-out exact match {fmt_stat(em, ci=False)}."
        + decaying_schedule_caveat(sweep.runs, "base_policy", "epoch", relative=PLATEAU)
    )
    seeds = len(sweep.seeds)
    lines += [
        f"- **Seeds.** {seeds} seeds (policy, probe, ranking and test prompts vary together); "
        f"{seeds_note(found, seeds, SMALL_EFFECT)}.",
        "",
    ]
    return lines


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
    alpha = float(wet.get("alpha", 0.0))
    threshold = (
        f"η calibrated as the {wet.get('eta_quantile')} quantile of `H` on in-distribution `val` prompts"
        if wet.get("eta_quantile") is not None
        else f"η = {wet.get('eta')}"
    )
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
        f"the gate opens on {m('none', 'false_gate'):.3f} of in-distribution rows ({threshold}) and "
        f"{m('none', 'gate_drift'):.3f} of the others. Among the misattributed answers the gate is open on "
        f"{m('none', 'gate_open_wrong'):.3f} of the rows at the answer position, with mean g "
        f"{m('none', 'gate_mean_wrong'):.3f} (a mean factor 1 + α g of {1 + alpha * m('none', 'gate_mean_wrong'):.3f} "
        f"on the rescaled heads at α = {alpha:g})"
        + (
            ": the rescaling acts on a minority of the rows it targets, and weakly."
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
