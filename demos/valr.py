"""Page builder of the VaLR demo (arXiv 2602.04476): ``docs/results/valr.md`` + ``valr.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=valr`` (``conf/demo/valr.yaml``: arm × seed); page:
``python -m zoo.report demo valr``. Read from the sweep: the held-out evaluation's per-row records
(``eval_records.jsonl``: correct, number of reasoning steps), ``probe/*`` (StepStateProbe), the training curves
(``train/lm_loss``, ``train/align_cos``), ``run_info.json`` (the stage-1 model and the teacher each run used, with
their build metrics) and the resolved configs.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    contrast,
    curve,
    fmt_stat,
    plot_curves,
    provenance,
    pyplot,
    save_figure,
    stat,
    table,
    write_page,
)

PAPER = "valr"
RECORDS = "eval_records.jsonl"
STAGE2 = ("cot", "latent", "valr")


def accuracy_by_steps(run: Run) -> tuple[float, dict[int, float]]:
    """Overall accuracy and accuracy by number of reasoning steps of the run's last held-out evaluation."""
    if not run.file(RECORDS).is_file():
        return float("nan"), {}
    rows = run.read_jsonl(RECORDS)
    last = max((r["step"] for r in rows), default=0)
    rows = [r for r in rows if r["step"] == last]
    by: dict[int, list[bool]] = defaultdict(list)
    for r in rows:
        by[int(r["num_steps"])].append(bool(r["correct"]))
    overall = sum(bool(r["correct"]) for r in rows) / len(rows) if rows else float("nan")
    return overall, {n: sum(v) / len(v) for n, v in sorted(by.items())}


def build(sweep: Sweep, out: Path) -> list[Path]:
    arms = sweep.arms()
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    acc = {name: [accuracy_by_steps(r) for r in runs] for name, runs in arms.items()}
    steps = sorted({n for results in acc.values() for _, by in results for n in by})

    def cell(name: str, n: int) -> str:
        return fmt_stat(stat(by.get(n, float("nan")) for _, by in acc[name]), ci=False)

    rows = []
    for name, runs in arms.items():
        cos = stat(r.last("train/align_cos") for r in runs)
        rows.append(
            [
                labels.get(name, name),
                fmt_stat(stat(a for a, _ in acc[name])),
                *(cell(name, n) for n in steps),
                fmt_stat(stat(r.last("probe/step_accuracy") for r in runs), ci=False),
                fmt_stat(stat(r.last("probe/step_majority") for r in runs), ci=False),
                "n/a" if cos.n == 0 else fmt_stat(cos, ci=False),
                f"{stat(float(r.info.get('wall_seconds', 'nan')) for r in runs).mean:.0f}",
            ]
        )
    png = plot(arms, acc, steps, labels, out / f"{PAPER}.png")
    stage1 = first.get("demo.stage1", {}) or {}
    teacher = artifact_values(sweep.runs, "valr_teacher", "val/cell_accuracy")
    seeds = len(sweep.seeds) or 1
    text = [
        "# VaLR demo: CoT SFT vs latents vs vision-aligned latents",
        "",
        "Paper: *Vision-aligned Latent Reasoning* (arXiv 2602.04476). Built through the demo path "
        "(`conf/demo/valr.yaml`, page builder `demos/valr.py`). Toy reproduction of the mechanism on CPU; it does "
        "not claim the paper's numbers.",
        "",
        provenance(sweep, PAPER),
        "",
        f"Setup, per seed ({seeds} seed{'s' if seeds != 1 else ''}): tiny LLaVA on shape grids, questions summing "
        f"the count of one colour over 1-4 rows, one reasoning step per row. Stage 1 = plain CoT SFT "
        f"(`+method=valr_cot`, {stage1.get('steps')} steps, lr {stage1.get('lr')}; artifact cache); each stage-2 arm "
        f"continues from it for {first.get('trainer.max_steps')} steps (batch {first.get('datamodule.batch_size')}, "
        f"lr {first.get('module.optimizer.lr')}, K={first.get('module.num_latents')}). The VaLR teacher is the "
        f"synthetic patch encoder (`+method=valr_teacher`, artifact cache; held-out cell accuracy "
        f"{fmt_stat(stat(teacher), ci=False)}). Evaluation: {first.get('datamodule.source.num_val')} held-out "
        "images, greedy generation; accuracy = exact answer after `</think>`. Probe: logistic regression on the "
        "alignment-layer states just before each step (latent arms: mean of the K latent states; CoT: the position "
        "before the step's first token), fitted on half of the steps, scored on the other half, predicting the "
        "count of the queried colour in the row that step looks up.",
        "",
        "Cells: mean ± sd over seeds (accuracy with the 95% interval).",
        "",
        table(
            [
                "arm",
                "accuracy",
                *(f"{n} step{'s' if n > 1 else ''}" for n in steps),
                "probe (row count)",
                "probe majority",
                "final align cos (train)",
                "run s",
            ],
            rows,
        ),
        f"![VaLR demo]({png.name})",
        "",
        "## Reading",
        "",
        *reading(acc, labels),
        "",
    ]
    return [write_page(out, PAPER, text), png]


def reading(acc: dict[str, list[tuple[float, dict[int, float]]]], labels: dict[str, str]) -> list[str]:
    """Templated contrasts of the arms' held-out accuracy."""

    def lab(name: str) -> str:
        return labels.get(name, name)

    def overall(name: str) -> list[float]:
        return [a for a, _ in acc.get(name, [])]

    pairs = [("valr", "latent"), ("valr", "cot"), ("latent", "cot"), ("cot", "stage1")]
    return [
        "- " + contrast(lab(a), overall(a), lab(b), overall(b), "Held-out accuracy") + "."
        for a, b in pairs
        if a in acc and b in acc
    ]


def plot(arms: dict[str, list[Run]], acc: dict[str, Any], steps: list[int], labels: dict[str, str], path: Path) -> Path:
    """Accuracy by number of steps (mean, 95% CI), stage-2 language loss and VaLR's alignment cosine (bands)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for name in arms:
        stats = [stat(by.get(n, float("nan")) for _, by in acc[name]) for n in steps]
        lo = [s.mean - s.lo if s.n > 1 else 0 for s in stats]
        hi = [s.hi - s.mean if s.n > 1 else 0 for s in stats]
        axes[0].errorbar(
            steps, [s.mean for s in stats], yerr=[lo, hi], marker="o", capsize=3, label=labels.get(name, name)
        )
    stage2 = {labels.get(n, n): curve(arms[n], "train/lm_loss") for n in STAGE2 if n in arms}
    plot_curves(axes[1], stage2)
    if "valr" in arms:
        plot_curves(axes[2], {labels.get("valr", "valr"): curve(arms["valr"], "train/align_cos")})
    axes[0].set(xlabel="reasoning steps (rows looked up)", ylabel="accuracy", title="accuracy vs steps")
    axes[1].set(xlabel="stage-2 step", ylabel="language loss", title="stage 2 training")
    axes[2].set(xlabel="stage-2 step", ylabel="cosine", title="VaLR alignment cosine (train)")
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)
