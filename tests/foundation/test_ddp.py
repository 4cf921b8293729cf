"""A real two-process DDP run on CPU (gloo) through train.py."""

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT


@pytest.mark.distributed
def test_two_process_ddp_on_cpu(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "train.py"),
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.max_epochs=1",
            "datamodule.source.num_train=256",
            "datamodule.source.num_val=32",
            "datamodule.batch_size=16",
            "module.generation.max_new_tokens=12",
            "run_id=ddp",
            f"paths.log_dir={tmp_path}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in output
    assert "[zoo] fit done" in output
    # 256 rows / (16 per process x 2 processes) = 8 optimizer steps per epoch
    run_dir = tmp_path / "train" / "runs" / "ddp"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    import torch

    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == 8


@pytest.mark.distributed
def test_grpo_on_two_processes_through_train_py(tmp_path):
    """The command that hung (GRPO, default token budget, ranks packing different micro-batch counts) finishes; the
    DDP preset sets a collective timeout on the process group."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "train.py"),
            "+method=grpo",
            "backbone.init_from=null",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.max_steps=4",
            "trainer.strategy.timeout.minutes=2",
            "datamodule.source.num_val=4",
            "run_id=grpo_ddp",
            f"paths.log_dir={tmp_path}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "[zoo] fit done" in output
    ckpt = tmp_path / "train" / "runs" / "grpo_ddp" / "checkpoints" / "last.ckpt"
    import torch

    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 4
