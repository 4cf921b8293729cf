"""A second SIGTERM/SIGINT ends a run at once, also while it waits in a native call that never returns to Python
(a collective of a hung DDP peer), where Python-level signal handlers never run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("run_guard_hang_worker.py")


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_aborts_a_process_blocked_in_native_code(number):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "waiting"
        proc.send_signal(number)
        time.sleep(0.5)
        assert proc.poll() is None  # the first signal asks for a graceful stop at the end of the step
        proc.send_signal(number)
        assert proc.wait(timeout=30) == 128 + number
        assert f"second {signal.Signals(number).name}" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
