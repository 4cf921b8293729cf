"""Page builder of the GR3 demo (arXiv 2603.10535): ``docs/results/gr3.md`` + ``gr3.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=gr3`` (``conf/demo/gr3.yaml``: setting × shaper × seed); page:
``python -m zoo.report demo gr3``. Read from the sweep: the GRPO module's logged ``train/completion_length``,
``train/accuracy``, ``train/reward``, ``train/gr3_alpha`` and ``val/exact_match`` series and the resolved configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.report import (
    Run,
    Sweep,
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
    fmt_stat,
    stat,
)

PAPER = "gr3"
LENGTH = "train/completion_length"
CURVES = (LENGTH, "train/accuracy", "val/exact_match")
ARMS = ("grpo", "additive", "additive_strong", "gr3")


def early_length(run: Run, first: int = 5, last: int = 25) -> float:
    """Mean completion length over the logged steps ``first``..``last`` (the start of training)."""
    points = [v for s, v in run.series(LENGTH) if first <= s <= last]
    return sum(points) / len(points) if points else float("nan")


def build(sweep: Sweep, out: Path) -> list[Path]:
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    setting_key = next((k for k in sweep.swept if k.endswith("setting")), None)
    arm_key = next((k for k in sweep.swept if k.endswith("/arm")), None)

    def runs_of(setting: str | None, arm: str) -> list[Run]:
        return [
            r
            for r in sweep.runs
            if (setting_key is None or r.arm.get(setting_key) == setting) and r.arm.get(arm_key) == arm
        ]

    settings = list(dict.fromkeys(r.arm.get(setting_key) for r in sweep.runs)) if setting_key else [None]
    shapers = [s for s in ARMS if any(r.arm.get(arm_key) == s for r in sweep.runs)]
    png = plot(settings, shapers, runs_of, labels, out / f"{PAPER}.png")
    seeds = len(sweep.seeds) or 1
    task = str(first.get("task._target_", "")).rsplit(".", 1)[-1]
    text = [
        "# GR3 demo: GRPO vs additive length penalty vs GR3 (toy scale)",
        "",
        "Paper: *GR3* (arXiv:2603.10535). Built through the demo path (`conf/demo/gr3.yaml`, page builder "
        "`demos/gr3.py`).",
        "",
        provenance(sweep, PAPER),
        "",
        f"Setup: tiny Llama from the cached base SFT policy of the task ({task}); GRPO with "
        f"G={first.get('module.group_size')}, {first.get('datamodule.batch_size')} prompts per step, "
        f"max {first.get('module.generation.max_new_tokens')} new tokens, lr {first.get('module.optimizer.lr')}, "
        f"{first.get('trainer.max_steps')} steps per run, {seeds} seed{'s' if seeds != 1 else ''}. Cells: mean ± sd "
        "over seeds [95% confidence interval, Student t]; lengths are generated tokens (EOS included).",
        "",
    ]
    for setting in settings:
        rows = []
        for shaper in shapers:
            runs = runs_of(setting, shaper)
            rows.append(
                [
                    labels.get(shaper, shaper),
                    fmt_stat(stat(early_length(r) for r in runs), 1, ci=False),
                    fmt_stat(stat(r.last(LENGTH) for r in runs), 1),
                    fmt_stat(stat(r.last("train/accuracy") for r in runs)),
                    fmt_stat(stat(r.last("train/reward") for r in runs)),
                    fmt_stat(stat(r.last("val/exact_match") for r in runs)),
                    fmt_stat(stat(r.last("train/gr3_alpha") for r in runs), 2, ci=False) if shaper == "gr3" else "",
                ]
            )
        text += [
            f"## {labels.get(setting, setting) if setting else 'All runs'}",
            "",
            table(
                [
                    "arm",
                    "length (logged steps 5-25)",
                    "length (last step)",
                    "train accuracy (last)",
                    "reward (last)",
                    "val exact match (last)",
                    "GR3 alpha (last, calibrated)",
                ],
                rows,
            ),
            *reading(setting, runs_of, labels),
            "",
        ]
    text += [
        f"![curves]({png.name})",
        "",
    ]
    return [write_page(out, PAPER, text), png]


def reading(setting: str | None, runs_of: Any, labels: dict[str, str]) -> list[str]:
    """Templated contrasts for one setting (Welch 95% intervals over seeds; "not shown" when they contain 0)."""

    def last(arm: str, metric: str) -> list[float]:
        return [r.last(metric) for r in runs_of(setting, arm)]

    def line(a: str, b: str, metric: str, what: str) -> str:
        if not last(a, metric) or not last(b, metric):
            return ""
        return "- " + contrast(labels.get(a, a), last(a, metric), labels.get(b, b), last(b, metric), what) + "."

    lines = [
        line("gr3", "grpo", LENGTH, "Final completion length"),
        line("additive", "grpo", LENGTH, "Final completion length"),
        line("gr3", "additive", "val/exact_match", "Final validation exact match"),
        line("gr3", "additive_strong", "val/exact_match", "Final validation exact match"),
        line("gr3", "grpo", "val/exact_match", "Final validation exact match"),
    ]
    return [x for x in lines if x]


def plot(settings: list[Any], shapers: list[str], runs_of: Any, labels: dict[str, str], path: Path) -> Path:
    """One row per setting, one panel per metric: mean curve over seeds with its 95% band."""
    plt = pyplot()
    fig, axes = plt.subplots(
        len(settings), len(CURVES), figsize=(4.6 * len(CURVES), 3.3 * len(settings)), squeeze=False
    )
    for row, setting in zip(axes, settings):
        for ax, metric in zip(row, CURVES):
            plot_curves(ax, {labels.get(s, s): curve(runs_of(setting, s), metric) for s in shapers})
            ax.set_title(f"{labels.get(setting, setting) if setting else ''}\n{metric}", fontsize=8)
            ax.set_xlabel("step")
        legend(row[0], fontsize=7)
    return save_figure(fig, path)
