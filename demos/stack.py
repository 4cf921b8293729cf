"""Page builder of the stack demo: ``docs/results/stack.md`` + ``stack.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=stack`` (``conf/demo/stack.yaml``: stage-1 training mode × stage-2
compression × decoder × seed); page: ``python -m zoo.report demo stack``. Stage 1 is a GR3 run (arXiv 2603.10535)
with QLoRA or in full precision, built per seed through the artifact cache, or nothing (the base SFT policy it starts
from); every swept run loads that model, compresses it with NanoQuant (arXiv 2602.06694) or not, and decodes the test
split with DTS-Greedy (arXiv 2511.00640) or plain sampling. Read from the sweep: each run's metrics
(``test/exact_match``, ``DecodeStats``' ``test/decode/*``, ``QuantizationReport``'s ``quant/*``), ``run_info.json``
(wall time, the artifacts it used with their build metrics) and the resolved configs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from zoo.report import (
    Run,
    Sweep,
    build_run,
    build_seconds,
    paired_contrast,
    provenance,
    pyplot,
    save_figure,
    table,
    write_page,
)
from zoo.stats import fmt_stat, paired, stat
from zoo.verdict import Claim, verdict_section

PAPER = "stack"
TRAINS = ("base", "qlora", "full")
# the stage-1 modes that train (a GR3 run each)
TRAINED = ("qlora", "full")
QUANTS = ("none", "nanoquant")
DECODERS = ("dts", "sample")
# (metric, column) of the arm table: the module's accuracy, DecodeStats' per-problem means, the measured storage
COLUMNS = (
    ("test/exact_match", "accuracy"),
    ("test/decode/repetition_rate", "repetition rate"),
    ("test/decode/tokens_per_problem", "tokens / problem (returned)"),
    ("test/decode/decoded_tokens_per_problem", "tokens / problem (decoded)"),
    ("test/decode/branch_events", "branch events"),
    ("quant/bits_per_weight", "bits / weight (decoder linears)"),
)
ACCURACY = "test/exact_match"
# the equivalence band of the "keeps its accuracy" claims (accuracy points)
MARGIN = 0.05
STAGE1 = "demo_policy"
BASE = "base_policy"
# short names of the arm values in sentences and the verdict (the tables use demo.labels)
SHORT = {
    "base": "base policy",
    "qlora": "QLoRA",
    "full": "full fine-tune",
    "nanoquant": "NanoQuant",
    "none": "as exported",
    "dts": "DTS-Greedy",
    "sample": "sampling",
}


# -- reading the sweep ------------------------------------------------------------------------------------------------
def key(run: Run) -> tuple[str, str, str]:
    """(training mode, compression, decoder) of a run, from its resolved config and group choices."""
    return (
        str(run.get("demo.train")),
        str(run.group_choice("demo/stack/quant")),
        str(run.group_choice("demo/stack/decoder")),
    )


def cells(sweep: Sweep) -> dict[tuple[str, str, str], list[Run]]:
    """The runs of every (training, compression, decoder) cell, one per seed."""
    found: dict[tuple[str, str, str], list[Run]] = {}
    for run in sweep.runs:
        found.setdefault(key(run), []).append(run)
    return found


def by_seed(runs: Iterable[Run], fn: Callable[[Run], float]) -> dict[int | None, float]:
    """``{seed: fn(run)}``: the unit of the paired comparisons (the arms of a seed share the base policy, the RL seed
    and the test problems)."""
    return {r.seed: fn(r) for r in runs}


def metric(name: str) -> Callable[[Run], float]:
    return lambda r: r.last(name)


def artifact(run: Run, kind: str = STAGE1) -> dict[str, Any]:
    """The artifact of ``kind`` the run used (its ``run_info.json`` entry: path, build metrics, ``built_now``);
    ``{}`` when it used none."""
    return next(iter(run.artifacts(kind)), {})


def own_seconds(run: Run) -> float:
    """The run's own wall time: without the prerequisites it built before its job. Its prerequisites form one chain
    (the stage-1 policy built on the base policy), so the outermost build it started holds the others."""
    built = [build_seconds(u) for u in run.artifacts() if u.get("built_now")]
    return wall(run) - max((b for b in built if not math.isnan(b)), default=0.0)


def stage1(run: Run) -> dict[str, Any]:
    """The stage-1 artifact the run decoded (``{}`` for the base arm)."""
    return artifact(run, STAGE1)


def stage1_values(runs: Iterable[Run], name: str) -> list[float]:
    """One build metric per distinct stage-1 artifact of ``runs``."""
    seen: dict[str, float] = {}
    for run in runs:
        used = stage1(run)
        value = (used.get("metrics") or {}).get(name)
        if used and value is not None:
            seen[str(used.get("path"))] = float(value)
    return list(seen.values())


def wall(run: Run) -> float:
    return float(run.info.get("wall_seconds", math.nan))


# -- labels -----------------------------------------------------------------------------------------------------------
def describe(cell: tuple[str, str, str]) -> str:
    """``QLoRA → NanoQuant → DTS-Greedy``: the arm's stages in short names."""
    return " → ".join(SHORT.get(part, part) for part in cell)


def effect(
    table_: dict[tuple[str, str, str], list[Run]], a: tuple[str, str, str], b: tuple[str, str, str], name: str
) -> Any:
    """Paired (by seed) difference ``a − b`` of a metric, with its interval."""
    fn = metric(name)
    return paired(by_seed(table_.get(a, []), fn), by_seed(table_.get(b, []), fn))


# -- the verdict ------------------------------------------------------------------------------------------------------
def verdict(runs: dict[tuple[str, str, str], list[Run]]) -> list[str]:
    stack, stack_fp = ("qlora", "nanoquant", "dts"), ("qlora", "none", "dts")
    claims = [
        Claim(
            f"DTS on the NanoQuant-compressed QLoRA model keeps its accuracy within ±{MARGIN:g} of the uncompressed "
            "QLoRA model",
            f"test accuracy, {describe(stack)} − {describe(stack_fp)}, paired by seed",
            effect(runs, stack, stack_fp, ACCURACY),
            "within",
            margin=MARGIN,
        ),
        Claim(
            f"the whole stack keeps its accuracy within ±{MARGIN:g} of full precision",
            f"test accuracy, {describe(stack)} − {describe(('full', 'none', 'dts'))}, paired by seed",
            effect(runs, stack, ("full", "none", "dts"), ACCURACY),
            "within",
            margin=MARGIN,
        ),
        Claim(
            "DTS beats sampling on the base policy (the DTS demo's claim, uncompressed)",
            "test accuracy, DTS-Greedy − sampling on the base policy as trained, paired by seed",
            effect(runs, ("base", "none", "dts"), ("base", "none", "sample"), ACCURACY),
            "higher",
        ),
        Claim(
            "DTS still beats sampling after compression (base policy at 1 bpw)",
            "test accuracy, DTS-Greedy − sampling on the NanoQuant-compressed base policy, paired by seed",
            effect(runs, ("base", "nanoquant", "dts"), ("base", "nanoquant", "sample"), ACCURACY),
            "higher",
        ),
        Claim(
            "DTS still beats sampling after compression (QLoRA model)",
            "test accuracy, DTS-Greedy − sampling on the NanoQuant-compressed QLoRA model, paired by seed",
            effect(runs, stack, ("qlora", "nanoquant", "sample"), ACCURACY),
            "higher",
        ),
        Claim(
            f"QLoRA training matches the full fine-tune through the stack (within ±{MARGIN:g})",
            "test accuracy after NanoQuant + DTS-Greedy, QLoRA − full fine-tune, paired by seed",
            effect(runs, stack, ("full", "nanoquant", "dts"), ACCURACY),
            "within",
            margin=MARGIN,
        ),
    ]
    return verdict_section(
        claims,
        "billion-parameter models and real reasoning benchmarks: a 2-layer policy on a task with a planted fork; "
        "QLoRA's memory saving (the model here fits in memory either way) and NanoQuant's speed or memory at run "
        "time (the CPU forward unpacks the binary factors); a decoder tuned on each compressed model (the decoders "
        "keep the settings the DTS demo chose on its uncompressed base policy).",
    )


# -- tables and sentences ---------------------------------------------------------------------------------------------
def arm_table(runs: dict[tuple[str, str, str], list[Run]], labels: dict[str, str]) -> str:
    rows = []
    for train in TRAINS:
        for quant in QUANTS:
            for decoder in DECODERS:
                found = runs.get((train, quant, decoder), [])
                if not found:
                    continue
                values = [_cell(found, m) for m, _ in COLUMNS]
                seconds = fmt_stat(stat(own_seconds(r) for r in found), digits=0, ci=False)
                rows.append(
                    [labels.get(train, train), labels.get(quant, quant), labels.get(decoder, decoder), *values, seconds]
                )
    return table(["stage 1", "stage 2", "decoder", *(c for _, c in COLUMNS), "run time (s)"], rows)


def _cell(runs: list[Run], name: str) -> str:
    """Mean ± sd of a metric over the runs (the 95% CI too for accuracy; n/a where no run logged it)."""
    return fmt_stat(stat(r.last(name) for r in runs), ci=(name == ACCURACY))


def stage1_table(runs: dict[tuple[str, str, str], list[Run]], labels: dict[str, str]) -> str:
    rows = []
    for train in TRAINED:
        found = [r for c, rs in runs.items() if c[0] == train for r in rs]
        if not found:
            continue
        rows.append(
            [
                labels.get(train, train),
                fmt_stat(stat(stage1_values(found, "val/exact_match")), ci=False),
                fmt_stat(stat(stage1_values(found, "val/completion_length")), digits=1, ci=False),
                fmt_stat(stat(stage1_values(found, "train/accuracy")), ci=False),
                fmt_stat(stat(_build_seconds(found)), digits=0, ci=False),
            ]
        )
    header = [
        "stage 1",
        "validation accuracy (greedy)",
        "validation completion length",
        "last rollout accuracy",
        "build time (s)",
    ]
    return table(header, rows)


def _build_seconds(runs: Iterable[Run]) -> list[float]:
    """Build time of each distinct stage-1 artifact of ``runs``, without the base policy's build when it was built
    inside it (the first stage-1 build of a sweep whose base arm had not run yet)."""
    seen: dict[str, float] = {}
    for run in runs:
        used, base = stage1(run), artifact(run, BASE)
        if used:
            nested = build_seconds(base) if used.get("built_now") and base.get("built_now") else 0.0
            seen[str(used.get("path"))] = build_seconds(used) - nested
    return list(seen.values())


def base_sentence(runs: dict[tuple[str, str, str], list[Run]]) -> str:
    """The base policy every arm starts from: its build time and validation loss (one policy for the sweep)."""
    found = [artifact(r, BASE) for rs in runs.values() for r in rs]
    found = [u for u in found if u]
    if not found:
        return "The base policy's build record is not in the runs."
    used = found[0]
    loss = (used.get("metrics") or {}).get("val/loss", math.nan)
    paths = {str(u.get("path")) for u in found}
    return (
        f"The base SFT policy ({len(paths)} for the whole sweep): built in {build_seconds(used):.0f} s, validation "
        f"loss {loss:.3f}; every GR3 run starts from it and the base arm decodes it."
    )


def nanoquant_table(runs: dict[tuple[str, str, str], list[Run]], labels: dict[str, str]) -> str:
    rows = []
    for train in TRAINS:
        found = [r for c, rs in runs.items() if c[:2] == (train, "nanoquant") for r in rs]
        if not found:
            continue
        cols = ["quant/bits_per_weight", "quant/block_error_ratio", "quant/kl_before_distill", "quant/kl_after_distill"]
        cells_ = [fmt_stat(stat(r.last(m) for r in found), ci=False) for m in cols]
        rows.append([labels.get(train, train), *cells_])
    header = [
        "stage 1",
        "measured bits / weight",
        "block error / ADMM-only",
        "KL to the uncompressed model before KD",
        "after KD",
    ]
    return table(header, rows)


def contrasts(runs: dict[tuple[str, str, str], list[Run]]) -> list[str]:
    """Every stage's cost and the decoder's gain, each a sentence from the numbers, paired by seed."""

    def sentence(a: tuple[str, str, str], b: tuple[str, str, str], name: str, what: str, where: str) -> str:
        fn = metric(name)
        differs = [i for i in range(3) if a[i] != b[i]]
        name_a = " ".join(SHORT.get(a[i], a[i]) for i in differs)
        name_b = " ".join(SHORT.get(b[i], b[i]) for i in differs)
        return "- " + paired_contrast(
            name_a, by_seed(runs.get(a, []), fn), name_b, by_seed(runs.get(b, []), fn), f"{what} ({where})"
        )

    def at(*parts: str) -> str:
        return " → ".join(SHORT.get(p, p) for p in parts)

    lines = ["What compression costs (NanoQuant − as exported):", ""]
    lines += [
        sentence((t, "nanoquant", d), (t, "none", d), ACCURACY, "accuracy", at(t, d)) for t in TRAINS for d in DECODERS
    ]
    lines += ["", "What the decoder adds (DTS-Greedy − sampling):", ""]
    for name, what in ((ACCURACY, "accuracy"), ("test/decode/repetition_rate", "repetition rate")):
        lines += [sentence((t, q, "dts"), (t, q, "sample"), name, what, at(t, q)) for t in TRAINS for q in QUANTS]
    lines += ["", "What GR3 adds to the base policy (GR3 − base policy):", ""]
    lines += [
        sentence((t, q, d), ("base", q, d), ACCURACY, "accuracy", at(q, d))
        for t in TRAINED
        for q in QUANTS
        for d in DECODERS
    ]
    lines += ["", "What QLoRA costs against the full fine-tune (QLoRA − full fine-tune):", ""]
    lines += [
        sentence(("qlora", q, d), ("full", q, d), ACCURACY, "accuracy", at(q, d)) for q in QUANTS for d in DECODERS
    ]
    return [*lines, ""]


def reading(runs: dict[tuple[str, str, str], list[Run]]) -> list[str]:
    """What the numbers say across the stages, sentence by sentence from the means over seeds (the paired intervals
    are in the sections above and the Verdict)."""

    def m(cell: tuple[str, str, str], name: str = ACCURACY) -> float:
        return stat(r.last(name) for r in runs.get(cell, [])).mean

    def pair(train: str, name: str) -> str:
        return f"{m((train, 'none', 'dts'), name):.2f} → {m((train, 'nanoquant', 'dts'), name):.2f}"

    def resolved(train: str) -> bool:
        d = effect(runs, (train, "none", "dts"), (train, "none", "sample"), ACCURACY)
        return d.n >= 2 and (d.lo > 0 or d.hi < 0)

    after = [SHORT[t] for t in TRAINED if resolved(t)]
    gain = (
        f"DTS-Greedy − sampling is resolved on the uncompressed {' and '.join(after)} model(s)"
        if after
        else "on both uncompressed GR3 models DTS-Greedy − sampling is not shown (its interval contains 0)"
    )
    events, decoded = "test/decode/branch_events", "test/decode/decoded_tokens_per_problem"
    return [
        "## Reading",
        "",
        f"- GR3 against the base policy: sampling accuracy {m(('base', 'none', 'sample')):.3f} on the base policy, "
        f"{m(('qlora', 'none', 'sample')):.3f} after GR3 with QLoRA, {m(('full', 'none', 'sample')):.3f} after the "
        f"full fine-tune; DTS-Greedy {m(('base', 'none', 'dts')):.3f} on the base policy, "
        f"{m(('qlora', 'none', 'dts')):.3f} / {m(('full', 'none', 'dts')):.3f} on the GR3 models; {gain}.",
        f"- What compression does to DTS's search: branch events per problem as exported → compressed "
        f"{pair('base', events)} (base policy), {pair('qlora', events)} (QLoRA), {pair('full', events)} (full "
        f"fine-tune); tokens decoded per problem {pair('base', decoded)}, {pair('qlora', decoded)}, "
        f"{pair('full', decoded)}.",
        f"- Accuracy as exported → compressed, DTS-Greedy: {pair('base', ACCURACY)} (base policy), "
        f"{pair('qlora', ACCURACY)} (QLoRA), {pair('full', ACCURACY)} (full fine-tune); sampling on the compressed "
        f"models: {m(('base', 'nanoquant', 'sample')):.3f}, {m(('qlora', 'nanoquant', 'sample')):.3f}, "
        f"{m(('full', 'nanoquant', 'sample')):.3f}.",
        "",
    ]


def setup_text(sweep: Sweep, labels: dict[str, str]) -> list[str]:
    first = sweep.runs[0]
    backbone = first.get("backbone", {}) or {}
    recipe = first.get("base_policy", {}) or {}
    demo = first.get("demo", {}) or {}
    rl, nq = demo.get("rl", {}) or {}, demo.get("nq", {}) or {}
    task = first.get("task", {}) or {}
    lora = _stage1_lora(sweep)
    return [
        "**Setup (toy scale).** "
        f"A {backbone.get('num_hidden_layers')}-layer Llama (hidden {backbone.get('hidden_size')}, intermediate "
        f"{backbone.get('intermediate_size')}, character vocabulary) is first trained as the base SFT policy of "
        f"task=forked ({recipe.get('num_train')} rows x {recipe.get('max_epochs')} epochs; one policy for every seed "
        "and arm). The task plants one fork right after `<think>`: a short correct line (training share "
        f"{task.get('p_short')}), a loop of {task.get('loop_lines')} repeated lines that cannot end within the budget "
        f"({task.get('p_loop')}) and a medium wrong continuation ({task.get('p_wrong')}).",
        "",
        f"- **Stage 1 (prerequisite, per seed):** GR3 (GRPO with r / (1 + alpha len / mean len), alpha calibrated "
        f"online) with the binary exact-match reward, {rl.get('steps')} rollout steps from the base policy, exported "
        f"merged. {labels.get('qlora', 'qlora')}: `+preset=qlora` (frozen NF4 base with double quantization, LoRA "
        f"{lora} on every projection, lr 1e-3; the export merges the adapters into the 4-bit weights and loads as "
        f"that 4-bit model). {labels.get('full', 'full')}: every weight trained in fp32 at GRPO's lr 2e-4. "
        f"{labels.get('base', 'base')}: no stage 1, the base policy both runs start from (the reference).",
        f"- **Stage 2 (swept):** the export as it is, or NanoQuant at a {nq.get('bits')} bpw target (rank multiple "
        f"{nq.get('rank_multiple')}, ADMM {nq.get('admm_iters')} iterations, block reconstruction "
        f"{nq.get('block_epochs')} + {nq.get('block_epochs')} epochs, scales-only KD {nq.get('kd_epochs')} epochs, "
        f"{nq.get('calibration_samples')} training rows of the task as calibration). The 4-bit QLoRA export is "
        "dequantized first, so NanoQuant approximates the weights the 4-bit model computes with.",
        f"- **Decoders:** DTS-Greedy (tau_H {demo.get('dts', {}).get('tau_H')}, tau_V "
        f"{demo.get('dts', {}).get('tau_V')}) and sampling (T {demo.get('sample_temperature')}), the settings the "
        f"DTS demo chose on this task's validation split; {first.get('module.generation.max_new_tokens')} new "
        f"tokens per trace; {first.get('datamodule.source.num_test')} test problems per seed, {len(sweep.seeds)} "
        "seeds.",
        "",
    ]


def _stage1_lora(sweep: Sweep) -> str:
    """LoRA rank and alpha of the QLoRA stage-1 build (its resolved config in the artifact directory)."""
    for run in sweep.runs:
        used = stage1(run)
        build = build_run(used) if used else None
        if build is not None and run.get("demo.train") == "qlora" and build.config:
            lora = build.get("backbone.lora") or {}
            return f"r {lora.get('r')}, alpha {lora.get('alpha')}"
    return "(build config not found)"


def fair_test(sweep: Sweep) -> list[str]:
    return [
        "**Fair test.** Every arm of a seed decodes the same test problems (the split is drawn from the seed); one "
        "base policy serves every seed and arm; both GR3 modes start from it with the same RL seed, prompts and "
        "number of rollout steps, and differ only in what trains (LoRA adapters on a frozen 4-bit base vs every "
        "fp32 weight) and the learning rate each recipe uses; NanoQuant calibrates on training rows, never on test "
        "problems; both decoders run with a fixed setting chosen on another model (no tuning on these test "
        f"problems). Comparisons are paired by seed (n = {len(sweep.seeds)}): the 95% interval of the mean "
        "per-seed difference decides each verdict; an interval that contains 0 is reported as not shown. Bits per "
        "weight are measured by `QuantizationReport` from the stored tensors of every linear inside the decoder "
        "layers (embeddings, norms and the tied output head stay fp32 in every arm and are not counted).",
        "",
    ]


def plot(runs: dict[tuple[str, str, str], list[Run]], labels: dict[str, str], path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    groups = [(t, q) for t in TRAINS for q in QUANTS]
    width = 0.38
    for ax, (name, title) in zip(
        axes, ((ACCURACY, "test accuracy"), ("test/decode/decoded_tokens_per_problem", "tokens decoded / problem"))
    ):
        for j, decoder in enumerate(DECODERS):
            means, errs = [], []
            for t, q in groups:
                s = stat(r.last(name) for r in runs.get((t, q, decoder), []))
                means.append(s.mean)
                errs.append(0.0 if math.isnan(s.lo) else s.mean - s.lo)
            xs = [i + (j - 0.5) * width for i in range(len(groups))]
            ax.bar(xs, means, width, yerr=errs, capsize=3, label=labels.get(decoder, decoder))
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{SHORT.get(t, t)}\n{SHORT.get(q, q)}" for t, q in groups], fontsize=8)
        ax.set_title(f"{title} (mean over seeds, 95% CI)")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def build(sweep: Sweep, out: Path) -> list[Path]:
    labels = sweep.runs[0].get("demo.labels", {}) or {}
    backbone = sweep.runs[0].get("backbone", {}) or {}
    runs = cells(sweep)
    png = plot(runs, labels, out / f"{PAPER}.png")
    text = [
        "# Stack demo: GR3 with QLoRA → NanoQuant at ~1 bit per weight → DTS decoding",
        "",
        provenance(sweep, PAPER),
        "",
        *setup_text(sweep, labels),
        *fair_test(sweep),
        "## Every arm",
        "",
        "Test split; mean ± sd over seeds (accuracy with the 95% CI of the mean); branch events: DTS's branches per "
        "problem (n/a for sampling); run time = the stage-2 run (load, compress, decode; prerequisite builds left "
        "out) on the shared machine.",
        "",
        arm_table(runs, labels),
        "",
        f"![accuracy and decoding work by arm]({png.name})",
        "",
        "## What each stage costs",
        "",
        *contrasts(runs),
        "Stage 1 (the GR3 runs the arms decode; build metrics of the artifacts, one per seed):",
        "",
        stage1_table(runs, labels),
        "",
        base_sentence(runs),
        "",
        "Stage 2, NanoQuant (from its report in each compressed run; block error / ADMM-only below 1: block "
        "reconstruction fitted the calibration data better than the ADMM initialisation):",
        "",
        nanoquant_table(runs, labels),
        "",
        *reading(runs),
        "## What this toy can and cannot show",
        "",
        "- It shows that the three methods compose through configs alone (a QLoRA export feeds NanoQuant, whose "
        "binary layers feed DTS's tree decoding), and measures at this scale what each stage costs in accuracy, "
        "decoding work and stored bits.",
        f"- It cannot show the papers' numbers: the policy has {backbone.get('num_hidden_layers')} layers of width "
        f"{backbone.get('hidden_size')}, so NanoQuant's 1-bpw budget leaves each layer a small rank, and the planted "
        "fork is built so that the short continuation is the correct one, which is what DTS-Greedy returns.",
        "",
    ]
    return [write_page(out, PAPER, text, verdict(runs)), png]
