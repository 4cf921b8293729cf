"""The default job (``python train.py``) with denormal floats flushed to zero and without, side by side.

    python benchmarks/denormals.py [--repeats 2] [--threads 1] [-- key=value ...]

Runs the job of this checkout alternately with ``flush_denormal=false`` and ``flush_denormal=true`` (off on off on
...), so that background load on a shared machine falls on both alike, and reads per run the training time (from
``train.log``, as ``benchmarks/default_job.py``: the fit loop with its validations) and the final metrics
(``run_info.json``): the speed-up is the point, equal metrics say the flush did not change what was learnt.
Writes the ``## Denormal floats`` section of docs/benchmarks.md. Extra overrides after ``--`` go to both sides.
``--compare-logs OFF_LOG ON_LOG`` adds two runs of one longer job, without and with the flush (their ``train.log``):
seconds per step over the steps both logged, from their ``step N/M ... (Ts)`` progress lines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
from pathlib import Path

from _results import write_section
from default_job import run_once

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"off": "flush_denormal=false", "on": "flush_denormal=true"}
REPORTED = ("train/loss", "val/loss", "val/exact_match")
#: the denormals appear once the model has grown confident: the longer job's steps are read before and after this
EARLY_STEPS = 600
PROGRESS = re.compile(r"step (\d+)/(\d+) epoch \d+ \((\d+)s\)")


def seconds_per_step(train_log: Path) -> dict[int, float]:
    """Seconds per optimizer step between consecutive progress lines of a ``train.log``, keyed by the later step
    (validation time included where a validation fell in between)."""
    points = [(int(m[1]), int(m[3])) for m in PROGRESS.finditer(train_log.read_text())]
    return {b: (tb - ta) / (b - a) for (a, ta), (b, tb) in zip(points, points[1:]) if b > a}


def compare_logs(off_log: Path, on_log: Path) -> str:
    """Both runs' median seconds per step over the steps both logged, up to :data:`EARLY_STEPS` and after."""
    off, on = seconds_per_step(off_log), seconds_per_step(on_log)
    common = sorted(off.keys() & on.keys())
    if not common:
        return f"`{off_log}` and `{on_log}` logged no common steps."
    parts = []
    early, late = [s for s in common if s <= EARLY_STEPS], [s for s in common if s > EARLY_STEPS]
    for name, steps in ((f"its first {EARLY_STEPS} steps", early), (f"steps {EARLY_STEPS + 1}-{common[-1]}", late)):
        if steps:
            a, b = statistics.median(off[s] for s in steps), statistics.median(on[s] for s in steps)
            parts.append(f"{name}: {a:.2f} s without, {b:.2f} s with ({a / b:.2f}x)")
    overrides = off_log.parent / ".hydra" / "overrides.yaml"
    job = (
        " ".join(line.removeprefix("- ") for line in overrides.read_text().splitlines()) if overrides.is_file() else ""
    )
    return (
        "A longer job"
        + (f" (`python train.py {job}`)" if job else "")
        + f" run twice, without the flush (`{off_log}`) and with it (`{on_log}`), at different times (not "
        "interleaved: their background load may differ); median seconds per step from their progress lines, "
        "validations included: " + "; ".join(parts) + "."
    )


def final_metrics(log_dir: Path, run_id: str) -> dict[str, float]:
    info = json.loads((log_dir / "train" / "runs" / run_id / "run_info.json").read_text())
    return {key: value for key, value in (info.get("metrics") or {}).items() if key in REPORTED}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS for both sides ('' keeps the default)")
    parser.add_argument("--compare-logs", nargs=2, type=Path, metavar=("OFF_LOG", "ON_LOG"), default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="denormals_"))
    runs = []
    for index in range(args.repeats):
        for label, setting in SIDES.items():
            result = run_once(ROOT, label, index, log_dir, args.threads, [setting, *args.overrides])
            result["metrics"] = final_metrics(log_dir, f"{label}-{index}")
            runs.append(result)
    fit = {label: [r["fit_s"] for r in runs if r["label"] == label] for label in SIDES}
    ratios = [off / on for off, on in zip(fit["off"], fit["on"])]
    rows = [
        f"| {label} (`{setting}`) | {statistics.median(fit[label]):.1f} s "
        f"[{min(fit[label]):.1f}-{max(fit[label]):.1f}] | "
        + "; ".join(
            ", ".join(f"{k} {v:.6g}" for k, v in sorted(r["metrics"].items())) for r in runs if r["label"] == label
        )
        + " |"
        for label, setting in SIDES.items()
    ]
    loads = [r["load_1min_at_start"] for r in runs]
    body = "\n".join(
        [
            "A model that has grown confident can compute many values below the smallest normal float (1.2e-38) -- "
            "e.g. attention and output probabilities it rules out, and their gradients -- and x86 CPUs compute on "
            "such denormal floats many times slower. `flush_denormal: true` (conf/train.yaml, the default since "
            "2026-12-07; `zoo.cli.train.float_mode`) flushes them to zero for the job. Reproduce with "
            f"`python benchmarks/denormals.py --repeats {args.repeats} --threads {args.threads or 'default'}"
            + (" -- " + " ".join(args.overrides) if args.overrides else "")
            + "`: the default job (`python train.py`"
            + (" " + " ".join(args.overrides) if args.overrides else "")
            + ") run alternately without and with the flush, "
            f"{args.repeats} repeats per side, OMP_NUM_THREADS={args.threads or 'default'}, {os.cpu_count()} CPUs, "
            f"1-minute load average {min(loads):.1f}-{max(loads):.1f} at the starts.",
            "",
            "| flush | training (fit loop with its validations), median [min-max] | final metrics per run |",
            "|---|---|---|",
            *rows,
            "",
            "Training time without / with the flush, paired by repeat: "
            + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
            + f" (median {statistics.median(ratios):.2f}x).",
            *(["", compare_logs(*args.compare_logs)] if args.compare_logs else []),
        ]
    )
    write_section("Denormal floats", body)
    print(body)


if __name__ == "__main__":
    main()
