"""Page builder of the Cuttlefish demo (arXiv 2602.02780): ``docs/results/cuttlefish.md`` + ``cuttlefish.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=cuttlefish`` (``conf/demo/cuttlefish.yaml``: connector × seed);
page: ``python -m zoo.report demo cuttlefish``. Read from the sweep: the per-row records of the held-out evaluation
(``eval_records.jsonl``: answer, completion, correct, kind, size bin, atoms, structure tokens), ``rotation/*`` and
``encoder_probe/*`` (callbacks), ``train/loss`` and the resolved configs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from zoo.data.structures import SIZE_BIN_LABELS, normalize_answer
from zoo.report import Run, Sweep, contrast, fmt_stat, provenance, pyplot, save_figure, stat, table, write_page

PAPER = "cuttlefish"
RECORDS = "eval_records.jsonl"
LARGE_BINS = SIZE_BIN_LABELS[3:]


def records(run: Run) -> list[dict[str, Any]]:
    """The held-out evaluation's per-row records (the last evaluation of the run)."""
    if not run.file(RECORDS).is_file():
        return []
    rows = run.read_jsonl(RECORDS)
    last = max((r["step"] for r in rows), default=0)
    return [r for r in rows if r["step"] == last]


def mean(xs: Any) -> float:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy overall / by size bin / by kind, motif FPR and TPR, tokens per structure, distinct answers."""
    by_bin, by_kind, answers = defaultdict(list), defaultdict(list), defaultdict(set)
    for r in rows:
        by_bin[r["size_bins"]].append(r["correct"])
        by_kind[r["kinds"]].append(r["correct"])
        answers[r["kinds"]].add(normalize_answer(r["completion"]))
    motif = [r for r in rows if r["kinds"] in ("ring", "triad")]
    says_yes = [normalize_answer(r["completion"]) == "yes" for r in motif]
    return {
        "acc": mean(r["correct"] for r in rows),
        "by_bin": {b: mean(by_bin[b]) for b in SIZE_BIN_LABELS},
        "bin_n": {b: len(by_bin[b]) for b in SIZE_BIN_LABELS},
        "large": mean(r["correct"] for r in rows if r["size_bins"] in LARGE_BINS),
        "small": mean(r["correct"] for r in rows if r["size_bins"] == SIZE_BIN_LABELS[0]),
        "by_kind": {k: mean(v) for k, v in sorted(by_kind.items())},
        "fpr": mean(y for y, r in zip(says_yes, motif) if str(r["answer"]).lower() == "no"),
        "tpr": mean(y for y, r in zip(says_yes, motif) if str(r["answer"]).lower() == "yes"),
        "tokens": [(r["num_atoms"], r["num_tokens"]) for r in rows],
        "distinct": {k: len(v) for k, v in sorted(answers.items())},
    }


def majority(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy of answering each kind with its most frequent answer *on these rows* (an upper bound on a prior
    learned from training answers)."""
    kinds = {r["kinds"] for r in rows}
    prior = {k: Counter(str(r["answer"]).lower() for r in rows if r["kinds"] == k).most_common(1)[0][0] for k in kinds}
    answered = [
        {**r, "completion": prior[r["kinds"]], "correct": str(r["answer"]).lower() == prior[r["kinds"]]} for r in rows
    ]
    return summarize(answered)


def build(sweep: Sweep, out: Path) -> list[Path]:
    arms = sweep.arms()
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    sums = {name: [summarize(records(r)) for r in runs] for name, runs in arms.items()}
    ref_rows = records(arms[next(iter(arms))][0])
    maj = majority(ref_rows) if ref_rows else None

    def per_seed(name: str, key: str, sub: str | None = None) -> list[float]:
        return [s[key][sub] if sub else s[key] for s in sums.get(name, [])]

    def cell(name: str, key: str, sub: str | None = None, ci: bool = False) -> str:
        return fmt_stat(stat(per_seed(name, key, sub)), ci=ci)

    bins = list(SIZE_BIN_LABELS)
    n_bin = sums[next(iter(sums))][0]["bin_n"] if sums else {}
    size_rows = [["n", sum(n_bin.values()), *(n_bin.get(b, 0) for b in bins)]]
    if maj:
        size_rows.append(
            ["majority answer per kind (no structure)", f"{maj['acc']:.3f}", *(f"{maj['by_bin'][b]:.3f}" for b in bins)]
        )
    for name in arms:
        size_rows.append([labels.get(name, name), cell(name, "acc", ci=True), *(cell(name, "by_bin", b) for b in bins)])
    kinds = sorted(sums[next(iter(sums))][0]["by_kind"]) if sums else []
    kind_rows = []
    for name, runs in arms.items():
        toks = [t for s in sums[name] for _, t in s["tokens"]]
        distinct = Counter()
        for s in sums[name]:
            distinct.update(s["distinct"])
        kind_rows.append(
            [
                labels.get(name, name),
                *(cell(name, "by_kind", k) for k in kinds),
                fmt_stat(stat(r.last("rotation/accuracy") for r in runs)),
                fmt_stat(stat(r.last("rotation/agreement") for r in runs)),
                cell(name, "fpr"),
                cell(name, "tpr"),
                f"{mean(toks):.1f} ({min(toks, default=0)}-{max(toks, default=0)})",
                ", ".join(f"{k}: {v / max(len(sums[name]), 1):.1f}" for k, v in sorted(distinct.items())),
                f"{stat(float(r.info.get('wall_seconds', 'nan')) for r in runs).mean:.0f}",
            ]
        )
    png = plot(arms, sums, labels, out / f"{PAPER}.png")
    probe = {
        k: stat(r.last(f"encoder_probe/{k}") for r in sweep.runs).mean
        for k in ("ring_accuracy", "ring_majority", "triad_accuracy", "triad_majority")
    }
    seeds = len(sweep.seeds) or 1
    steps, batch = first.get("trainer.max_steps"), first.get("datamodule.batch_size")
    text = [
        "# Cuttlefish demo: scaling-aware patching vs fixed-budget connectors",
        "",
        "Paper: *Cuttlefish: Scaling-Aware Adapter for Structure-Grounded LLM Reasoning* (arXiv 2602.02780). Built "
        "through the demo path (`conf/demo/cuttlefish.yaml`, page builder `demos/cuttlefish.py`). Toy scale on a "
        "shared CPU: this page reports what was measured, not the paper's numbers.",
        "",
        provenance(sweep, PAPER),
        "",
        f"Setup: synthetic all-atom structures (6-300 atoms, 5 elements, rings and N-P-S triads; "
        f"`zoo.data.structures`), question kinds {', '.join(kinds)}; {first.get('datamodule.source.num_train')} "
        f"training questions, {first.get('datamodule.source.num_val')} held-out questions; frozen pretrained EGNN "
        f"(artifact cache), standardized atom features, tiny Llama trained with the connector "
        f"(`module.stage={first.get('module.stage')}`), {steps} steps of batch {batch}, lr "
        f"{first.get('module.optimizer.lr')}; greedy decoding, exact verifier (first word). {seeds} "
        f"seed{'s' if seeds != 1 else ''}; cells: mean ± sd over seeds (overall: with the 95% interval).",
        "",
        "## Accuracy by structure size (held-out)",
        "",
        table(["arm", "overall", *bins], size_rows),
        "## Accuracy by question kind, robustness, hallucination proxy",
        "",
        table(
            [
                "arm",
                *kinds,
                "rotated acc",
                "same answer after rotation",
                "motif FPR",
                "motif TPR",
                "tokens/structure (mean, min-max)",
                "distinct answers per kind",
                "run s",
            ],
            kind_rows,
        ),
        "Motif FPR = fraction of ring/triad questions whose true answer is *no* answered *yes*; TPR on those whose "
        "answer is *yes*. A model that always says *no* has FPR 0 and TPR 0, so read them together.",
        "",
        f"![accuracy by size and tokens per structure]({png.name})",
        "",
        "## Reading",
        "",
        *reading(arms, sums, labels, maj, probe),
        "",
    ]
    return [write_page(out, PAPER, text), png]


def reading(
    arms: dict[str, list[Run]], sums: dict[str, list[dict]], labels: dict[str, str], maj: dict | None, probe: dict
) -> list[str]:
    """Sentences filled from the numbers."""

    def lab(name: str) -> str:
        return labels.get(name, name)

    def acc(name: str) -> list[float]:
        return [s["acc"] for s in sums.get(name, [])]

    notes = [
        f"- Encoder probe (no LLM, linear probe on mean+max pooled frozen-encoder embeddings, half of the held-out "
        f"motif questions to fit, half to score): ring {probe['ring_accuracy']:.3f} (majority "
        f"{probe['ring_majority']:.3f}), triad {probe['triad_accuracy']:.3f} (majority {probe['triad_majority']:.3f})."
    ]
    if maj:
        notes.append(f"- Answering each kind with its most frequent held-out answer gives {maj['acc']:.3f}.")
    for name in arms:
        small = stat(s["small"] for s in sums[name]).mean
        large = stat(s["large"] for s in sums[name]).mean
        notes.append(f"- {lab(name)}: accuracy {small:.3f} on <=25 atoms vs {large:.3f} on >100 atoms.")
    if "cuttlefish" in arms and "query" in arms:
        notes.append(
            "- " + contrast(lab("cuttlefish"), acc("cuttlefish"), lab("query"), acc("query"), "Accuracy") + "."
        )
    if "cuttlefish" in arms and "patching" in arms:
        notes.append(
            "- " + contrast(lab("cuttlefish"), acc("cuttlefish"), lab("patching"), acc("patching"), "Accuracy") + "."
        )
    collapsed = [n for n in arms if all(all(v == 1 for v in s["distinct"].values()) for s in sums[n])]
    if collapsed:
        notes.append(
            f"- {', '.join(lab(n) for n in collapsed)}: one answer per question kind in every seed, an answer prior "
            "rather than a reading of the structure."
        )
    agree = {n: stat(r.last("rotation/agreement") for r in arms[n]).mean for n in arms}
    notes.append(
        "- Rotations: answers unchanged under a random rotation + translation for "
        + ", ".join(f"{agree[n]:.3f} ({lab(n)})" for n in arms)
        + " of the held-out questions (E(3)-invariant features; a near-tied greedy token can still flip)."
    )
    return notes


def plot(arms: dict[str, list[Run]], sums: dict[str, list[dict]], labels: dict[str, str], path: Path) -> Path:
    """Accuracy by size bin (mean, 95% CI over seeds) and structure tokens against atoms."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in arms:
        stats = [stat(s["by_bin"][b] for s in sums[name]) for b in SIZE_BIN_LABELS]
        lo = [s.mean - s.lo if s.n > 1 else 0 for s in stats]
        hi = [s.hi - s.mean if s.n > 1 else 0 for s in stats]
        axes[0].errorbar(
            SIZE_BIN_LABELS, [s.mean for s in stats], yerr=[lo, hi], marker="o", capsize=3, label=labels.get(name, name)
        )
        atoms, toks = zip(*[t for s in sums[name] for t in s["tokens"]]) if sums[name] else ((), ())
        axes[1].scatter(atoms, toks, s=6, alpha=0.5, label=labels.get(name, name))
    axes[0].set(xlabel="structure size (atoms)", ylabel="accuracy", title="Accuracy by structure size")
    axes[1].set(xlabel="atoms", ylabel="structure tokens", title="Tokens per structure", xscale="log")
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)
