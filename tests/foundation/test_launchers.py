"""The launcher presets run a sweep for real (not only compose): ``+launcher=slurm`` through submitit's local executor
(``hydra/launcher=submitit_local``: the preset's queue settings, each job a process submitit starts and waits for) and
``+launcher=ray`` on a local Ray cluster (the preset's ``ray.init`` with no address starts one on this machine). Each
runs a 2-job sweep through ``train.py`` and must write the run directories the basic launcher writes
(``<log dir>/train/multiruns/<time>/<job number>/``, each with its run record, resolved config and Hydra files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

# a 2-job sweep of the default method (sft on the tiny backbone): one step and one validation batch each
SWEEP = [
    "-m",
    "seed=0,1",
    "debug=fdr",
    "trainer.accelerator=cpu",
    "datamodule.source.num_train=64",
    "datamodule.source.num_val=8",
]


def sweep(tmp_path: Path, *launcher: str) -> list[Path]:
    """Run the sweep with ``launcher`` overrides from ``tmp_path``; return its job directories."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ZOO_LOG_DIR": str(tmp_path / "logs")}
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "train.py"), *SWEEP, *launcher],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    sweeps = sorted((tmp_path / "logs" / "train" / "multiruns").iterdir())
    assert len(sweeps) == 1, sweeps
    assert (sweeps[0] / "multirun.yaml").is_file()
    return sorted(p for p in sweeps[0].iterdir() if p.is_dir() and not p.name.startswith("."))


def check_jobs(jobs: list[Path]) -> None:
    """Two job directories ``0`` and ``1``, each holding a finished run of its own seed, as the basic launcher's."""
    assert [p.name for p in jobs] == ["0", "1"]
    for number, job in enumerate(jobs):
        info = json.loads((job / "run_info.json").read_text())
        assert f"seed={number}" in info["overrides"]
        assert info["finished_at"] and "val/loss" in info["metrics"], info
        assert f"seed={number}" in (job / ".hydra" / "overrides.yaml").read_text()
        assert (job / "resolved_config.yaml").is_file() and (job / "train.log").is_file()


def test_slurm_preset_runs_a_two_job_sweep_through_the_submitit_local_executor(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher is not installed")
    jobs = sweep(tmp_path, "+launcher=slurm", "hydra/launcher=submitit_local")
    check_jobs(jobs)
    # submitit ran each job as its own process and kept its logs in the sweep directory
    assert len(list(jobs[0].parent.glob(".submitit/*/*_result.pkl"))) == 2


def test_ray_preset_runs_a_two_job_sweep_on_a_local_ray_cluster(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'paperzoo[ray]')")
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="hydra-ray-launcher is not installed")
    jobs = sweep(tmp_path, "+launcher=ray")
    check_jobs(jobs)
