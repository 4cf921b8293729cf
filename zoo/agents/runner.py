"""The episode harness: one environment, one agent, the tool registry, a step cap, a recorded trajectory.

The registry holds the environment's tools, the note tool and (only with ``code_tool=True``) the sandboxed
Python tool. Each step the agent acts on the last observation; a step without a usable tool call (an unparsable
reply, no call) is recorded as a failed step, never raised; a call is run through the registry, where an unknown
tool or bad arguments come back as a failed observation. The episode ends when the environment accepts the
commit or at ``max_steps`` (default: the environment's ``required_steps x 4``, ``x 8`` for bio, as UltraHorizon).
A model error during an episode (any :class:`~zoo.agents.errors.BackendError`, such as a context-length 400 from a
server) ends that episode only: it is recorded with its ``error`` and the steps made so far, scores 0, and the run
goes on. A missing replay recording or an unreachable endpoint is the run's configuration and stops the run.
``max_unusable_replies=N`` (off by default: the released UltraHorizon harness has no such stop) ends an episode
after N consecutive replies that are not executable tool calls (malformed, no call, or cut at the reply budget): it
is recorded as failed with that reason, so a model that cannot act costs N steps, not the whole step cap.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from zoo.agents.context import NoteBook
from zoo.agents.envs.base import Environment
from zoo.agents.errors import BackendError, ReplayMissError, UnreachableEndpointError
from zoo.agents.metrics import error_tags, windowed_entropy
from zoo.agents.policies.base import Agent, EpisodeInfo
from zoo.agents.sandbox import PythonSandbox
from zoo.agents.tools import ToolRegistry
from zoo.agents.types import ToolResult, Usage

log = logging.getLogger(__name__)

#: the error tag of an episode that ``max_unusable_replies`` ended
UNUSABLE_TAG = "unusable_replies"


@dataclass
class StepRecord:
    """One agent step. ``tool`` is ``None`` when the agent produced no usable call (``error`` says why)."""

    index: int
    tool: str | None
    arguments: dict[str, Any]
    ok: bool
    observation: Any = None
    error: str | None = None
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    context_messages: int = 0


@dataclass
class Trajectory:
    """An episode: settings, steps, the commit and its grade, and summary numbers."""

    env: str
    agent: str
    episode: int
    seed: int
    difficulty: str
    required_steps: int
    steps: list[StepRecord] = field(default_factory=list)
    committed: bool = False
    commit: str | None = None
    report: dict[str, Any] | None = None
    usage: Usage = field(default_factory=Usage)
    refreshes: int = 0
    entropy: list[float] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    #: why the episode stopped early: a model error or ``max_unusable_replies`` unusable replies in a row
    #: (``None``: it ran to its commit or step cap)
    error: str | None = None

    @property
    def failed(self) -> bool:
        """Whether the episode stopped early (a model error, or too many unusable replies in a row): it scores 0
        and is counted in ``failed_episodes``."""
        return self.error is not None

    @property
    def score(self) -> float:
        """The commit's score in ``[0, 1]`` (0 without a commit)."""
        return float(self.report["score"]) if self.report else 0.0

    @property
    def tool_calls(self) -> int:
        return sum(step.tool is not None for step in self.steps)

    @property
    def failed_steps(self) -> int:
        return sum(not step.ok for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            score=self.score,
            tool_calls=self.tool_calls,
            failed_steps=self.failed_steps,
            failed=self.failed,
            tokens=self.usage.total_tokens,
            usage=self.usage.to_dict(),
        )
        return data


def build_registry(env: Environment, notes: NoteBook, code_tool: bool = False) -> ToolRegistry:
    registry = env.tools().extend(ToolRegistry.from_object(notes))
    if code_tool:
        registry.extend(ToolRegistry.from_object(PythonSandbox()))
    return registry


def run_episode(
    env: Environment,
    agent: Agent,
    *,
    max_steps: int | None = None,
    code_tool: bool = False,
    episode: int = 0,
    seed: int = 0,
    entropy_window: int = 10,
    max_unusable_replies: int | None = None,
) -> Trajectory:
    """Run one episode and return its trajectory (the environment and agent are used up).

    ``max_unusable_replies``: end the episode, recorded as failed, after this many consecutive steps without an
    executable tool call (``None``: never; the official harness runs to the step cap).
    """
    notes = NoteBook()
    registry = build_registry(env, notes, code_tool)
    limit = int(max_steps or env.max_agent_steps)
    info = EpisodeInfo(
        env_name=env.name,
        prompt=env.prompt,
        tools=registry.specs(),
        difficulty=env.difficulty,
        required_steps=env.required_steps,
        free=env.free,
        library=env.library(),
        max_steps=limit,
    )
    agent.begin(info)
    trajectory = Trajectory(env.name, agent.name, episode, seed, env.difficulty, env.required_steps)
    observation: ToolResult | None = None
    unusable = 0  # consecutive replies without an executable tool call
    for index in range(limit):
        try:
            action = agent.act(observation)
        except (ReplayMissError, UnreachableEndpointError):
            raise  # a missing recording or a wrong endpoint: the run's configuration, every episode would fail
        except BackendError as err:  # e.g. a context-length 400 from a server: this episode fails, the run goes on
            trajectory.error = f"{type(err).__name__}: {err}"
            log.warning("episode %s failed at step %s: %s", episode, index, trajectory.error)
            break
        trajectory.usage.add(action.usage)
        usage = action.usage
        if action.call is None:
            observation = None
            record = StepRecord(index, None, {}, False, error=action.error or "no tool call", text=action.text)
        else:
            observation = registry.call(action.call.name, action.call.arguments, action.call.id)
            record = StepRecord(
                index,
                observation.name,
                observation.arguments,
                observation.ok,
                observation.content,
                observation.error,
                action.text,
            )
        record.prompt_tokens, record.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        record.context_messages = len(agent.context)
        trajectory.steps.append(record)
        if env.committed:
            break
        unusable = unusable + 1 if action.call is None else 0
        if max_unusable_replies is not None and unusable >= int(max_unusable_replies):
            trajectory.error = f"{unusable} consecutive replies without an executable tool call (last: {record.error})"
            log.warning("episode %s stopped at step %s: %s", episode, index, trajectory.error)
            break
    trajectory.committed = env.committed
    trajectory.commit = env.commit_content
    trajectory.report = env.report.to_dict() if env.report is not None else None
    trajectory.refreshes = agent.context.refreshes
    trajectory.entropy = windowed_entropy(trajectory.steps, entropy_window)
    trajectory.tags = error_tags(trajectory)
    if max_unusable_replies is not None and unusable >= int(max_unusable_replies):
        trajectory.tags.append(UNUSABLE_TAG)
    return trajectory
