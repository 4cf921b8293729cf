"""A hung collective ends as one error: ``rank R: <collective> timed out after N min (...)`` (DESIGN "Scale").

Under data parallelism a rank that crashed, stopped early or took another branch leaves the others waiting in a
collective until the process group's timeout (``trainer.strategy.timeout`` of ``conf/trainer/ddp.yaml`` /
``fsdp.yaml``); the backend then raises its own error (gloo: ``DistBackendError: ... Timed out waiting Nms for recv
operation``, with its C++ traceback). :func:`collective_timeout` turns that error into a
:class:`~zoo.errors.CollectiveTimeoutError` naming the rank, the collective and the option; ``train.py`` prints it
as one line and exits with status 2 (docs/reliability.md).
"""

from __future__ import annotations

import os
import re
import traceback

import torch

from zoo.errors import CollectiveTimeoutError

#: how the backends word a timeout (gloo "Timed out waiting 3000ms", NCCL/c10d "timeout", "Timeout(ms)=...")
TIMEOUT_PATTERN = re.compile(r"timed out|timeout", re.IGNORECASE)


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) or 0)


def _collective(err: BaseException) -> str:
    """The ``torch.distributed`` function that was waiting: the innermost frame of ``distributed_c10d``."""
    name = "a collective"
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename.replace("\\", "/").endswith("torch/distributed/distributed_c10d.py"):
            name = frame.name
    return name.lstrip("_") if name != "a collective" else name


def collective_timeout(err: BaseException, minutes: float | None) -> CollectiveTimeoutError | None:
    """The one-line error of a collective that timed out somewhere in ``err``'s chain, else ``None``.

    Args:
        err: the exception a fit raised.
        minutes: the process group's timeout (``trainer.strategy.timeout.minutes``), for the message.
    """
    seen: BaseException | None = err
    backend_error = getattr(torch.distributed, "DistBackendError", RuntimeError)
    while seen is not None:
        if isinstance(seen, (backend_error, RuntimeError)) and TIMEOUT_PATTERN.search(str(seen)):
            after = f"after {minutes:g} min " if minutes is not None else ""
            value = f"={minutes:g}" if minutes is not None else ""
            return CollectiveTimeoutError(
                f"rank {_rank()}: {_collective(seen)} timed out {after}(trainer.strategy.timeout.minutes{value}) - "
                "another rank stopped or diverged; look for the first error in the other ranks' output (a crash, "
                "an early stop, a branch that skipped this collective) and fix it; raise "
                "trainer.strategy.timeout.minutes only when one step legitimately takes longer"
            )
        seen = seen.__cause__ or seen.__context__
    return None


__all__ = ["TIMEOUT_PATTERN", "collective_timeout"]
