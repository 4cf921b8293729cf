"""Sweep directories written file by file as ``python train.py -m +demo=<paper>`` writes them (``multirun.yaml``, per
run ``.hydra/overrides.yaml``, ``resolved_config.yaml``, ``run_info.json``, ``csv/metrics.csv`` and the demo's own
files), so a page builder can be run through :class:`zoo.report.Sweep` on outcomes chosen by the test."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import yaml


def write_sweep(root: Path, params: dict[str, str]) -> Path:
    """The sweep directory with its ``multirun.yaml`` (``hydra.sweeper.params``)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"sweeper": {"params": params}}}))
    return root


def write_run(
    sweep: Path,
    subdir: str,
    overrides: dict[str, Any],
    config: dict[str, Any],
    number: int,
    metrics: dict[str, float] | None = None,
    info: dict[str, Any] | None = None,
    files: dict[str, list[dict[str, Any]]] | None = None,
) -> Path:
    """One finished run: its overrides, resolved config, one row of test metrics, ``run_info.json`` and JSONL files."""
    run = sweep / subdir
    (run / ".hydra").mkdir(parents=True, exist_ok=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{k}={v}" for k, v in overrides.items()]))
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": number}}}))
    (run / "resolved_config.yaml").write_text(yaml.safe_dump(config))
    started = f"2026-01-01T00:{number // 60:02d}:{number % 60:02d}+00:00"
    (run / "run_info.json").write_text(
        json.dumps({"argv": ["train.py", "-m"], "started_at": started, "finished_at": started, **(info or {})})
    )
    if metrics:
        write_metrics(run, [{"step": 0, **metrics}])
    for name, rows in (files or {}).items():
        (run / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run


def write_metrics(run: Path, rows: list[dict[str, float]]) -> None:
    """``<run>/csv/metrics.csv`` (the CSV logger's format) with ``rows``."""
    (run / "csv").mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with (run / "csv" / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
