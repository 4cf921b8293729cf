"""Child-process entry that runs generated provider code on a task stream (never imported by the parent).

``python -I -c "from zoo.memory.worker import main; <sandbox prelude>; main()" SPEC OUT``: SPEC names the code file,
the store directory, the environment, the task indices, the seed and the timeout (counted from when the zoo has
loaded: a SIGALRM stops the candidate); the result of :func:`zoo.memory.memevolve.run_stream` is written to OUT as
JSON. Any error exits non-zero with the traceback on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import sys

from zoo.agents.memory_interface import MemoryProvider
from zoo.memory.memevolve import run_stream


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(f"timed out after {spec['timeout']:g} s (stopped)")

    # the candidate's time starts now, after the interpreter and the zoo have loaded
    signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, float(spec["timeout"]))
    module_spec = importlib.util.spec_from_file_location("generated_provider", spec["code"])
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    provider_cls = getattr(module, "Provider", None)
    if not (isinstance(provider_cls, type) and issubclass(provider_cls, MemoryProvider)):
        raise SystemExit("the generated code defines no class Provider(MemoryProvider)")
    provider = provider_cls(spec["store_dir"])
    if not provider.initialize():
        raise SystemExit("Provider.initialize() returned False")
    result = run_stream(provider, spec["env"], [int(i) for i in spec["episodes"]], int(spec["seed"]))
    with open(sys.argv[2], "w") as handle:
        json.dump(result, handle)
