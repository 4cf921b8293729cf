"""The EvolveLab memory-provider interface (MemEvolve, arXiv 2512.18746), mirrored from the released code.

EvolveLab (``EvolveLab/base_memory.py``, ``memory_types.py`` in github.com/bingreeky/MemEvolve) gives every memory
system three calls:

* ``provide_memory(MemoryRequest(query, context, status, additional_params)) -> MemoryResponse(memories,
  memory_type, total_count)``: ``status`` is ``BEGIN`` (injection at planning time) or ``IN`` (during execution);
  each :class:`MemoryItem` has an id, content, metadata, a score and a type (``TEXT`` or ``API``: a callable tool);
* ``take_in_memory(TrajectoryData(query, trajectory, result, metadata)) -> (ok, description)``: learn from one
  finished task;
* ``initialize() -> bool``: open or create the persistent store.

Here ``trajectory`` is a list of step dicts (``tool``, ``arguments``, ``ok``, ``observation``, ``error``) as the
episode harness records them (:class:`zoo.agents.runner.StepRecord`); :func:`trajectory_data` converts a harness
trajectory.

It lives with the agents (floor 3, ``docs/architecture.md``): an agent queries a memory only through this interface,
and the memory systems (:mod:`zoo.memory`) build on the agents, never the reverse.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any


class MemoryStatus(str, enum.Enum):
    """When memory is asked for: ``BEGIN`` before the first action, ``IN`` during execution."""

    BEGIN = "begin"
    IN = "in"


class MemoryItemType(str, enum.Enum):
    """``TEXT``: context to inject; ``API``: a tool the agent may call (its spec in ``metadata``)."""

    TEXT = "text"
    API = "api"


@dataclass
class MemoryItem:
    """One retrieved memory unit; ``score`` is the provider's retrieval score (higher is better)."""

    id: str
    content: str
    metadata: dict[str, Any] = field(default_factory=dict)
    score: float = 0.0
    type: MemoryItemType = MemoryItemType.TEXT


@dataclass
class MemoryRequest:
    """What the agent asks: the task ``query``, free-form ``context`` (e.g. the last error) and the phase."""

    query: str
    context: str = ""
    status: MemoryStatus = MemoryStatus.BEGIN
    additional_params: dict[str, Any] = field(default_factory=dict)


@dataclass
class MemoryResponse:
    """At most ``top_k`` items, best first; ``total_count`` is how many items the store holds (active)."""

    memories: list[MemoryItem]
    memory_type: str
    total_count: int

    @property
    def characters(self) -> int:
        """Characters of injected content: the token proxy of the MemEvolve demo."""
        return sum(len(m.content) for m in self.memories)


@dataclass
class TrajectoryData:
    """One finished task: the task text, its steps (dicts), the result (score in [0, 1]) and metadata."""

    query: str
    trajectory: list[dict[str, Any]]
    result: float
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MemoryProvider(ABC):
    """Base of every memory system (the ``BaseMemoryProvider`` of EvolveLab)."""

    #: short name shown in reports
    memory_type: str = "memory"

    @abstractmethod
    def initialize(self) -> bool:
        """Open (or create) the persistent store; ``True`` when ready."""

    @abstractmethod
    def provide_memory(self, request: MemoryRequest) -> MemoryResponse:
        """Items for ``request``: at most ``top_k``, sorted by score (descending), deterministic."""

    @abstractmethod
    def take_in_memory(self, trajectory: TrajectoryData) -> tuple[bool, str]:
        """Ingest a finished task; ``(ok, what was stored)``."""


class NoMemory(MemoryProvider):
    """The no-memory baseline: stores nothing, provides nothing."""

    memory_type = "no_memory"

    def initialize(self) -> bool:
        return True

    def provide_memory(self, request: MemoryRequest) -> MemoryResponse:
        return MemoryResponse([], self.memory_type, 0)

    def take_in_memory(self, trajectory: TrajectoryData) -> tuple[bool, str]:
        return True, "no memory: nothing stored"


def trajectory_data(trajectory: Any, query: str = "", task: dict[str, Any] | None = None) -> TrajectoryData:
    """A :class:`TrajectoryData` from a harness :class:`~zoo.agents.runner.Trajectory` (or its dict).

    ``task`` is the environment's public task description (e.g. ProcWorld's family and input); when absent it is
    read from the commit report's ``raw`` field, where task environments record it.
    """
    data = trajectory.to_dict() if hasattr(trajectory, "to_dict") else dict(trajectory)
    report = data.get("report") or {}
    raw = report.get("raw") if isinstance(report.get("raw"), dict) else {}
    task = dict(task if task is not None else raw.get("task", {}))
    steps = [{k: s.get(k) for k in ("tool", "arguments", "ok", "observation", "error")} for s in data.get("steps", [])]
    metadata = {"env": data.get("env"), "episode": data.get("episode"), "task": task}
    return TrajectoryData(query or str(task.get("query", "")), steps, float(data.get("score", 0.0)), metadata)
