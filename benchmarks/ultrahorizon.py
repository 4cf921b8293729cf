"""UltraHorizon throughput (arXiv 2509.21766): environment steps/s and episodes/s per environment.

``python benchmarks/ultrahorizon.py [--episodes 8] [--repeats 3] [--seeds 4] [--write]``

Two measurements, so that the official recommendation of 32 repeats per setting can be priced:

* **single process**: :func:`zoo.agents.evaluate` in this process, per environment (hard difficulty, the official
  ``required_steps=50``) and scripted agent (``random``: the environment and harness alone, nearly; ``hypothesis_
  elimination``: plus the solver), repeated ``--repeats`` times interleaved (env A, B, C, A, B, C, ...); median and
  range of steps/s and episodes/s. A step is one tool call (failed ones included).
* **Hydra multirun**: ``python train.py -m +method=ultrahorizon env=<env> agent=random seed=0..S-1
  datamodule.episodes=E`` as a subprocess, with the basic launcher (jobs one after another in one process) and with
  ``+launcher=joblib`` (2 worker processes), interleaved; wall clock from launch to exit (Python and Hydra start-up
  included), steps counted from the runs' ``trajectories.jsonl``.

Wall-clock numbers on a shared, loaded CPU: compare the ratios within one run, not absolute values across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zoo.agents import evaluate

ROOT = Path(__file__).resolve().parents[1]
ENVS = ("ultrahorizon/grid", "ultrahorizon/sequence", "ultrahorizon/bio")
AGENTS = ("random", "hypothesis_elimination")
LAUNCHERS = {"basic": [], "joblib (2 workers)": ["+launcher=joblib"]}


def single_process(episodes: int, repeats: int) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """``{(env, agent): [(steps/s, episodes/s) per repeat]}``, interleaved over envs and agents."""
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for repeat in range(repeats):
        for agent in AGENTS:
            for env in ENVS:
                start = time.perf_counter()
                out = evaluate(env, agent, episodes=episodes, seed=repeat, difficulty="hard")
                seconds = time.perf_counter() - start
                steps = out["tool_calls"] * episodes
                results.setdefault((env, agent), []).append((steps / seconds, episodes / seconds))
                print(
                    f"{env:24s} {agent:24s} {steps / seconds:9.0f} steps/s {episodes / seconds:7.2f} ep/s", flush=True
                )
    return results


def multirun(env: str, launcher: list[str], seeds: int, episodes: int, log_dir: Path) -> tuple[float, int, int]:
    """``(wall seconds, episodes, steps)`` of one Hydra multirun over ``seeds`` seeds."""
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "+method=ultrahorizon",
        f"env={env}",
        "agent=random",
        f"seed={','.join(str(s) for s in range(seeds))}",
        f"datamodule.episodes={episodes}",
        f"paths.log_dir={log_dir}",
        *launcher,
    ]
    env_vars = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env_vars, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    lines = [json.loads(line) for path in log_dir.rglob("trajectories.jsonl") for line in path.read_text().splitlines()]
    return seconds, len(lines), sum(len(t["steps"]) for t in lines)


def hydra_multiruns(seeds: int, episodes: int, repeats: int) -> dict[tuple[str, str], list[tuple[float, float]]]:
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for env in ENVS:
                for name, launcher in LAUNCHERS.items():
                    log_dir = Path(tmp) / f"{repeat}-{env.replace('/', '_')}-{len(launcher)}"
                    seconds, done, steps = multirun(env, launcher, seeds, episodes, log_dir)
                    results.setdefault((env, name), []).append((steps / seconds, done / seconds))
                    print(f"{env:24s} {name:20s} {seconds:6.1f} s {done} episodes {steps} steps", flush=True)
    return results


def cell(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def table(results: dict[tuple[str, str], list[tuple[float, float]]], what: str) -> list[str]:
    lines = [f"| env | {what} | env steps/s | episodes/s |", "|---|---|---|---|"]
    for (env, name), values in results.items():
        steps, eps = [v[0] for v in values], [v[1] for v in values]
        lines.append(f"| {env} | {name} | {cell(steps, 0)} | {cell(eps, 2)} |")
    return lines


def ratio(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Median episodes/s of ``a`` over that of ``b``."""
    return statistics.median(v[1] for v in a) / statistics.median(v[1] for v in b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=8, help="episodes per evaluate() call / per multirun job")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=4, help="jobs per Hydra multirun")
    parser.add_argument(
        "--multirun-repeats", type=int, default=None, help="repeats of the multiruns (default: --repeats)"
    )
    parser.add_argument(
        "--write", action="store_true", help="replace the '## UltraHorizon' section of docs/benchmarks.md"
    )
    args = parser.parse_args()
    single = single_process(args.episodes, args.repeats)
    multirun_repeats = args.multirun_repeats or args.repeats
    multi = hydra_multiruns(args.seeds, args.episodes, multirun_repeats)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    body = [
        f"`python benchmarks/ultrahorizon.py --episodes {args.episodes} --repeats {args.repeats} --seeds {args.seeds}"
        f" --multirun-repeats {multirun_repeats}` ({os.cpu_count()} cores, load average {load:.1f} at the end: a "
        "shared machine, so compare ratios). Median (min-max) over the interleaved repeats (single process: "
        f"{args.repeats}, multiruns: {multirun_repeats}); hard difficulty, official required steps.",
        "",
        f"**Single process** (`zoo.agents.evaluate`, {args.episodes} episodes per call):",
        "",
        *table(single, "agent"),
        "",
        f"**Hydra multirun** (`python train.py -m +method=ultrahorizon agent=random`, {args.seeds} jobs × "
        f"{args.episodes} episodes; wall clock from launch, start-up included):",
        "",
        *table(multi, "launcher"),
        "",
        "Episodes/s of the basic multirun over the single process (random agent; the gap is the app's start-up "
        "and one Trainer per job, so put many episodes in a job): "
        + ", ".join(
            f"{env.split('/')[-1]} {ratio(multi[(env, 'basic')], single[(env, 'random')]):.2f}x" for env in ENVS
        )
        + "; joblib over basic: "
        + ", ".join(
            f"{env.split('/')[-1]} {ratio(multi[(env, 'joblib (2 workers)')], multi[(env, 'basic')]):.2f}x"
            for env in ENVS
        )
        + ".",
    ]
    print("\n".join(body))
    if args.write:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _results import write_section

        write_section("UltraHorizon", "\n".join(body))
        print("wrote the UltraHorizon section of docs/benchmarks.md")


if __name__ == "__main__":
    main()
