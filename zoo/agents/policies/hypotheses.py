"""The two agents built on the hypothesis solvers (:mod:`zoo.agents.policies.solvers`).

A *solver* (:class:`~zoo.agents.policies.solvers.base.Solver`, one per environment, registered in
:data:`~zoo.agents.policies.solvers.base.SOLVERS`) holds, for every unknown of an environment (a letter's effect, a
stage's rule, a trait's mode of inheritance), a :class:`~zoo.agents.policies.solvers.base.HypothesisSet` over the
environment's public commit vocabulary, updates it from tool results only, and proposes the next experiment. Two
agents drive the same solvers:

* :class:`HypothesisEliminationAgent` removes every hypothesis an observation contradicts, picks experiments
  whose outcome differs between the remaining hypotheses, and commits when one hypothesis is left per unknown
  (or, under the step budget, when the budget is spent: the first remaining hypothesis, in library order);
* :class:`EarlyCommitAgent` adopts the first hypothesis consistent with its first relevant observation and
  never revises it, and stops choosing informative experiments: an illustration of *in-context locking*.

Both write a note with the solver's state every ``note_every`` experiments. Under :class:`~zoo.agents.policies.
base.CRNR`, a context refresh drops the solver's working memory; the agent then reads its notes back
(``note_tool(check_notes)``), restores the last snapshot and re-observes the environment, so what was learned
after the last note is lost: the cost of a small window.
"""

from __future__ import annotations

import json
import random
from typing import ClassVar

from zoo.agents.policies.answers import answer_payload
from zoo.agents.policies.base import Action, Agent, EpisodeInfo, commit_call
from zoo.agents.policies.solvers import SOLVERS, Solver
from zoo.agents.types import ToolCall, ToolResult
from zoo.errors import ConfigError

NOTE_PREFIX = "solver-state:"


class SolverAgent(Agent):
    """Drives a :class:`Solver`: experiments, periodic notes, commit, and notes recall after a CRNR refresh.

    Args:
        seed: seed of the agent's random generator (experiment choice, ties).
        note_every: write a note with the solver state every this many experiments (``0``: never).

    Subclasses set the class attribute ``lock_first`` (see :class:`Solver`).
    """

    lock_first: ClassVar[bool] = False

    def __init__(self, seed: int = 0, note_every: int = 5) -> None:
        super().__init__(seed)
        if note_every < 0:
            raise ConfigError(f"agent.note_every must be >= 0, got {note_every}")
        self.note_every = note_every
        self.solver: Solver | None = None
        self.queue: list[ToolCall] = []
        self.last_note_at = 0
        self.recalling = False

    def begin(self, info: EpisodeInfo) -> None:
        super().begin(info)
        self.solver = make_solver(info, self.rng, self.lock_first)
        self.queue = []
        self.last_note_at = 0
        self.recalling = False

    def on_context_refresh(self) -> None:
        """Forget everything but the notes: a fresh solver that knows nothing of the current state, then recall."""
        self.solver = make_solver(self.info, self.rng, self.lock_first)
        self.solver.mark_unsynced()
        self.queue = [ToolCall("note_tool", {"action": "check_notes"})]
        self.recalling = True
        self.last_note_at = 0

    def observe(self, observation: ToolResult) -> None:
        if observation.name == "note_tool":
            if self.recalling and observation.ok and "notes" in (observation.content or {}):
                self._recall(observation.content["notes"])
            return
        # the result of a call made before the refresh is meaningless to the fresh solver until it has recalled
        if observation.name != "commit_final_result" and not self.recalling:
            self.solver.observe(observation)

    def _recall(self, notes: list[str]) -> None:
        self.recalling = False
        snapshots = [n for n in notes if isinstance(n, str) and n.startswith(NOTE_PREFIX)]
        if snapshots:
            self.solver.load_state_dict(json.loads(snapshots[-1][len(NOTE_PREFIX) :]))
            self.solver.mark_unsynced()
            self.last_note_at = self.solver.experiments

    def decide(self) -> Action:
        if self.queue:
            return Action(self.queue.pop(0))
        solver = self.solver
        if self.note_every and solver.experiments - self.last_note_at >= self.note_every:
            self.last_note_at = solver.experiments
            note = NOTE_PREFIX + json.dumps(solver.state_dict(), sort_keys=True)
            return Action(ToolCall("note_tool", {"action": "write_note", "note": note}))
        if solver.should_commit():
            return Action(commit_call(answer_payload(self.info, solver.commit_payload())))
        return Action(solver.next_call())


class HypothesisEliminationAgent(SolverAgent):
    """Keeps hypothesis sets, picks discriminating experiments, commits when one hypothesis remains per unknown."""

    name: ClassVar[str] = "hypothesis_elimination"
    lock_first: ClassVar[bool] = False


class EarlyCommitAgent(SolverAgent):
    """Adopts the first consistent hypothesis per unknown and stops exploring (in-context locking)."""

    name: ClassVar[str] = "early_commit"
    lock_first: ClassVar[bool] = True


def make_solver(info: EpisodeInfo, rng: random.Random, lock_first: bool) -> Solver:
    if info.env_name not in SOLVERS:
        raise ConfigError(f"no hypothesis solver for environment '{info.env_name}'; available: {sorted(SOLVERS)}")
    return SOLVERS[info.env_name](info, rng, lock_first)
