"""Side-by-side timing of the default job (``python train.py``) of two checkouts, interleaved A B A B ...

    python benchmarks/default_job.py OLD_CHECKOUT NEW_CHECKOUT [--repeats 3] [--threads 1] [--out results.json]

Each checkout runs with its own ``.venv/bin/python`` (falling back to this interpreter with ``PYTHONPATH`` set to
the checkout) from its own root, so each imports its own ``zoo``. Runs alternate between the two checkouts, so that
background load on a shared machine affects both sides alike. Per run it records the wall time of the process and the
training time: from the ``training: N optimizer steps planned`` log line to the last ``validation at step`` line of
``train.log`` (the fit loop including its validations, without start-up, sanity check and export). Logs go to a
throw-away ``paths.log_dir`` under the temporary directory. Extra ``key=value`` overrides after ``--`` are passed to
both.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAMP = "%Y-%m-%d %H:%M:%S,%f"


def python_of(checkout: Path) -> str:
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


def log_time(line: str) -> datetime.datetime:
    return datetime.datetime.strptime(line[1 : line.index("]")], STAMP)


def fit_seconds(train_log: Path) -> float:
    """Seconds from the start of training to the last validation, read from the run's ``train.log``."""
    lines = train_log.read_text().splitlines()
    start = next(line for line in lines if "optimizer steps planned" in line)
    end = [line for line in lines if "validation at step" in line][-1]
    return (log_time(end) - log_time(start)).total_seconds()


def run_once(checkout: Path, label: str, index: int, log_dir: Path, threads: str | None, overrides: list[str]) -> dict:
    run_id = f"{label}-{index}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = threads
    if not (checkout / ".venv" / "bin" / "python").is_file():
        env["PYTHONPATH"] = str(checkout)
    cmd = [python_of(checkout), "train.py", f"paths.log_dir={log_dir}", f"run_id={run_id}", *overrides]
    load = os.getloadavg()[0]
    start = time.monotonic()
    subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - start
    train_log = log_dir / "train" / "runs" / run_id / "train.log"
    result = {"label": label, "index": index, "wall_s": round(wall, 1), "fit_s": round(fit_seconds(train_log), 1)}
    result["load_1min_at_start"] = round(load, 2)
    print(json.dumps(result), flush=True)
    return result


def summary(results: list[dict], label: str) -> dict:
    out = {}
    for key in ("fit_s", "wall_s"):
        values = [r[key] for r in results if r["label"] == label]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS for both sides ('' keeps the default)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="default_job_"))
    results = []
    for index in range(args.repeats):
        for label, checkout in (("old", args.old), ("new", args.new)):
            results.append(run_once(checkout.resolve(), label, index, log_dir, args.threads, args.overrides))
    report = {
        "threads": args.threads or "default",
        "cpus": os.cpu_count(),
        "old": str(args.old),
        "new": str(args.new),
        "runs": results,
        "summary": {label: summary(results, label) for label in ("old", "new")},
    }
    print(json.dumps(report["summary"], indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
