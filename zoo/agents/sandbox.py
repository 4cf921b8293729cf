"""An optional Python tool for agents, run in a separate, restricted process. Off unless asked for.

UltraHorizon's agent (OpenManus) carries a ``PythonExecute`` tool. Executing model-written code must be opt-in, so
the harness adds :class:`PythonSandbox` only with ``code_tool=True``. Each call runs ``python -I`` (isolated:
no user site, no ``PYTHON*`` variables) in a fresh temporary directory with an empty environment, a wall-clock
timeout, CPU-time, memory, file-size and process limits (``resource``, set inside the child), and sockets
disabled inside the child. This is a best-effort sandbox for honest mistakes of a model, not a security boundary
against hostile code: run untrusted models in a container.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from typing import Any

from zoo.agents.tools import agent_tool
from zoo.errors import ConfigError

_PRELUDE = textwrap.dedent(
    """
    import resource as _resource
    import socket as _socket

    for _limit, _value in ((_resource.RLIMIT_CPU, {cpu}), (_resource.RLIMIT_AS, {memory}),
                           (_resource.RLIMIT_FSIZE, 10 * 1024 * 1024), (_resource.RLIMIT_NPROC, 64)):
        try:
            _resource.setrlimit(_limit, (_value, _value))
        except (ValueError, OSError):
            pass

    def _no_network(*args, **kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    _socket.socket = _no_network
    _socket.create_connection = _no_network
    _socket.getaddrinfo = _no_network
    del _resource, _socket, _no_network, _limit, _value
    """
)


def sandbox_prelude(cpu_seconds: int, memory_mb: int) -> str:
    """Python source that, run first in a child process, sets its CPU-time, address-space, file-size and process
    limits and disables sockets (the prelude of :class:`PythonSandbox`, for other sandboxed children)."""
    return _PRELUDE.format(cpu=int(cpu_seconds), memory=int(memory_mb) * 1024 * 1024)


class PythonSandbox:
    """The ``python_execute`` tool.

    Args:
        timeout: wall-clock seconds per call (the process is killed after it).
        memory_mb: address-space limit of the child.
        max_output: characters of stdout/stderr returned.
    """

    def __init__(self, timeout: float = 10.0, memory_mb: int = 512, max_output: int = 4000) -> None:
        if timeout <= 0 or memory_mb <= 0:
            raise ConfigError(f"sandbox timeout ({timeout}) and memory_mb ({memory_mb}) must be > 0")
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.max_output = max_output
        self.prelude = sandbox_prelude(int(timeout) + 1, memory_mb)

    @agent_tool
    def python_execute(self, code: str) -> dict[str, Any]:
        """Run Python code in a sandboxed process and return what it printed. Only print() output is visible.

        Args:
            code: the Python source to run.
        """
        with tempfile.TemporaryDirectory(prefix="zoo_sandbox_") as workdir:
            try:
                done = subprocess.run(
                    [sys.executable, "-I", "-c", self.prelude + "\n" + code],
                    cwd=workdir,
                    env={"PATH": "/usr/bin:/bin"},
                    capture_output=True,
                    text=True,
                    timeout=self.timeout,
                )
            except subprocess.TimeoutExpired:
                return {"success": False, "message": f"the code ran longer than {self.timeout} s and was stopped"}
        output = (done.stdout + done.stderr)[-self.max_output :]
        return {"success": done.returncode == 0, "returncode": done.returncode, "output": output}
