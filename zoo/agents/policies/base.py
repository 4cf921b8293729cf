"""The agent protocol: an agent sees the task, then alternates ``act(observation) -> Action``.

Every agent keeps its conversation in a :class:`~zoo.agents.context.Context` (the tool calls it made and what
they returned, as chat messages), so a context policy such as CRNR acts on scripted and LLM agents alike.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from zoo.agents.context import Context
from zoo.agents.types import ToolCall, ToolResult, Usage
from zoo.errors import ConfigError


@dataclass
class EpisodeInfo:
    """What an agent is told at the start of an episode (all of it public: no hidden rules).

    Attributes:
        env_name: registry name of the environment (``ultrahorizon/grid``, ...).
        prompt: the task description (system prompt).
        tools: OpenAI tool declarations (the environment's tools, the note tool, optional code tool).
        difficulty, required_steps, free: the environment's public settings.
        library: the environment's commit vocabulary (hypothesis ids and descriptions).
        max_steps: the step cap of the episode.
    """

    env_name: str
    prompt: str
    tools: list[dict[str, Any]]
    difficulty: str = "hard"
    required_steps: int = 50
    free: bool = False
    library: dict[str, Any] = field(default_factory=dict)
    max_steps: int = 200


@dataclass
class Action:
    """One agent step: a tool call, or ``call=None`` with the reason (an unparsable reply, no tool call)."""

    call: ToolCall | None
    error: str | None = None
    text: str = ""
    usage: Usage = field(default_factory=Usage)


def tool_message(result: ToolResult) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": result.call_id, "name": result.name or "", "content": result.as_text()}


def call_message(call: ToolCall, text: str = "") -> dict[str, Any]:
    return {"role": "assistant", "content": text, "tool_calls": [call.to_message_dict()]}


class Agent(ABC):
    """Base of all agents.

    Args:
        seed: seed of the agent's own ``random.Random`` (and of a model backend's sampling).

    Attributes:
        context_window: ``None`` or the CRNR window applied to :attr:`context` (set by :class:`CRNR`).
    """

    name: ClassVar[str] = ""
    #: agents that write their own assistant messages into the context (the LLM agent) set this
    records_own_messages: ClassVar[bool] = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.context_window: int | None = None
        self.context = Context()
        self.info: EpisodeInfo | None = None

    def begin(self, info: EpisodeInfo) -> None:
        """Start an episode (a fresh context; CRNR applies when :attr:`context_window` is set)."""
        self.info = info
        self.context = Context(self.context_window, self.on_context_refresh)

    def on_context_refresh(self) -> None:  # noqa: B027 (an optional hook)
        """Called when CRNR replaced the context: drop working memory derived from it (default: nothing)."""

    def act(self, observation: ToolResult | None) -> Action:
        """Record the last observation in the context, then decide the next step.

        An observation whose arrival overflows a CRNR window is wiped with the rest of the context (as in the
        official harness), so the agent never processes it.
        """
        if observation is not None:
            refreshes = self.context.refreshes
            message = tool_message(observation)
            if self.context.refreshed:  # the call that produced it was wiped: a tool message would be orphaned
                message = {"role": "user", "content": f"[{observation.name} returned]\n{observation.as_text()}"}
            self.context.add(message)
            if self.context.refreshes == refreshes:
                self.observe(observation)
        action = self.decide()
        if action.call is not None and not self.records_own_messages:
            self.context.add(call_message(action.call, action.text))
        return action

    def observe(self, observation: ToolResult) -> None:  # noqa: B027 (an optional hook)
        """Update working memory from an observation (default: nothing beyond the context)."""

    @abstractmethod
    def decide(self) -> Action:
        """The next action."""


def commit_call(payload: dict[str, Any]) -> ToolCall:
    """The commit tool call carrying a structured payload."""
    return ToolCall("commit_final_result", {"content": json.dumps(payload, sort_keys=True)})


class CRNR(Agent):
    """Context refresh with notes recall: wrap any agent so that its context is wiped to one message past ``window``.

    The wrapped agent keeps its notes (the note tool lives outside the context) and is told through
    :meth:`Agent.on_context_refresh`; scripted agents then recall their notes, LLM agents read the refresh message.

    Args:
        agent: the agent to wrap.
        window: the largest number of context messages before a refresh (UltraHorizon default: 200).
    """

    def __init__(self, agent: Agent, window: int = 200) -> None:
        super().__init__(agent.seed)
        if window < 1:
            raise ConfigError(f"the CRNR window (module.crnr_window) must be >= 1 message, got {window}")
        self.agent = agent
        self.window = window
        self.agent.context_window = window
        self.name = f"{agent.name}+crnr"

    @property
    def context(self) -> Context:  # type: ignore[override]
        return self.agent.context

    @context.setter
    def context(self, value: Context) -> None:  # the base constructor assigns one; the inner agent owns it
        pass

    def begin(self, info: EpisodeInfo) -> None:
        self.info = info
        self.agent.begin(info)

    def act(self, observation: ToolResult | None) -> Action:
        return self.agent.act(observation)

    def decide(self) -> Action:  # pragma: no cover - act() delegates
        return self.agent.decide()
