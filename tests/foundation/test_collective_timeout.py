"""A hung collective ends as one error naming the rank and the collective (DESIGN "Scale"; docs/reliability.md).

Two gloo ranks of a real Lightning DDP fit through ``zoo.cli.train.fit`` (the worker launches rank 1 with Lightning's
own launcher); rank 1 skips an all_reduce that rank 0 makes. Rank 0 waits until the process group's timeout (3 s)
and must stop with ``error: rank 0: all_reduce timed out after ... (trainer.strategy.timeout.minutes=...) - another
rank stopped or diverged; ...`` and exit status 2, instead of gloo's C++ traceback (exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("collective_timeout_worker.py")


@pytest.mark.distributed
def test_a_collective_one_rank_skips_times_out_as_one_line_naming_rank_and_collective(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, str(WORKER), "3"], capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path
    )
    # rank 1 shares the stream: it fails later, when rank 0 has gone
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: rank 0")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(
        "error: rank 0: all_reduce timed out after 0.05 min (trainer.strategy.timeout.minutes=0.05) - another rank "
        "stopped or diverged;"
    ), errors[0]
