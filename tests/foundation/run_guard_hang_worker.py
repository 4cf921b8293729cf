"""Worker of ``tests/foundation/test_run_guard_abort.py``: installs RunGuard's signal handling, then waits in a native
call that never returns to Python (a TCPStore key nobody sets, as a rank waits on a hung peer)."""

from datetime import timedelta

import torch.distributed as dist

from zoo.callbacks import RunGuard

guard = RunGuard()
guard._install()
store = dist.TCPStore("127.0.0.1", 0, 1, True)
print("waiting", flush=True)
store.wait(["never-set"], timedelta(seconds=120))
print("the wait returned", flush=True)
