"""The solver seam of the hypothesis agents (:mod:`zoo.agents.policies.hypotheses`): :class:`HypothesisSet`,
:class:`Solver` and the registry :data:`SOLVERS` that every environment's solver joins with :func:`register_solver`
(the package ``zoo.agents.policies.solvers`` imports them all).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from zoo.agents.policies.base import EpisodeInfo
from zoo.agents.types import ToolCall, ToolResult


class HypothesisSet:
    """Ordered candidate hypotheses for one unknown.

    Args:
        candidates: hypothesis ids in library order (the order breaks ties when a choice must be made).
        lock_first: adopt the first consistent hypothesis at the first update and ignore all later evidence.
    """

    def __init__(self, candidates: Iterable[Any], lock_first: bool = False) -> None:
        self.remaining = list(candidates)
        if not self.remaining:
            raise ValueError("a hypothesis set needs at least one candidate")
        self.lock_first = lock_first
        self.locked = False
        self.contradicted = False

    def update(self, consistent: Callable[[Any], bool]) -> None:
        """Keep the hypotheses consistent with an observation (all of them if none is: the evidence is noted)."""
        if self.locked:
            return
        keep = [h for h in self.remaining if consistent(h)]
        if not keep:
            self.contradicted = True
            return
        if self.lock_first:
            keep = keep[:1]
            self.locked = True
        self.remaining = keep

    @property
    def resolved(self) -> bool:
        return len(self.remaining) == 1

    @property
    def best(self) -> Any:
        return self.remaining[0]

    def state(self) -> dict[str, Any]:
        return {"remaining": self.remaining, "locked": self.locked}

    def load(self, state: dict[str, Any]) -> None:
        self.remaining = list(state["remaining"])
        self.locked = bool(state["locked"])


class Solver(ABC):
    """Environment-specific reasoning shared by the hypothesis agents (observations in, experiments out).

    Args:
        info: the episode's public information.
        rng: the agent's random generator (ties, random experiments).
        lock_first: early-commit behaviour (see the module docstring).
    """

    env_name: ClassVar[str] = ""

    def __init__(self, info: EpisodeInfo, rng: random.Random, lock_first: bool) -> None:
        self.info = info
        self.rng = rng
        self.lock_first = lock_first
        self.experiments = 0
        self.exhausted = False

    @abstractmethod
    def next_call(self) -> ToolCall:
        """The next experiment or query."""

    @abstractmethod
    def observe(self, result: ToolResult) -> None:
        """Update from a tool result of this environment."""

    @abstractmethod
    def commit_payload(self) -> dict[str, Any]:
        """The structured commit (best remaining hypothesis per unknown)."""

    @abstractmethod
    def resolved(self) -> bool:
        """Whether every unknown is down to one hypothesis (or locked)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """A JSON-serializable snapshot for notes."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot (beliefs and counters as they were when the note was written)."""

    @abstractmethod
    def mark_unsynced(self) -> None:
        """Forget the environment's current state (after a refresh): it is re-observed before it is relied on."""

    def should_commit(self) -> bool:
        """Commit when the budget is spent, or (``free``) as soon as everything is resolved."""
        budget_spent = self.exhausted or self.experiments >= self.info.required_steps
        return budget_spent or (self.info.free and self.resolved())


SOLVERS: dict[str, type[Solver]] = {}


def register_solver(cls: type[Solver]) -> type[Solver]:
    SOLVERS[cls.env_name] = cls
    return cls
