"""Behaviour cloning of a scripted agent into the LLM tool-calling agent's own chat (the ``agent_sft`` method).

A scripted agent (UltraHorizon's hypothesis elimination, Persona2Web's pre-execution agent, ...) decides from its
working memory; an LLM agent decides from the chat :class:`~zoo.agents.policies.llm.LLMToolAgent` sends its model.
To train a model to act like the scripted agent, every demonstration must be the exact request the LLM agent would
send in that state, and its target the reply whose parsed tool call is the scripted agent's action:

* :class:`Demonstrator` *is* an :class:`~zoo.agents.policies.llm.LLMToolAgent` (same system prompt, next-step
  instruction, context, CRNR refresh, message formats) whose model is a
  :class:`~zoo.agents.backends.scripted.ScriptedBackend` that asks the scripted *teacher* for its next action and
  writes it as text (:func:`reply_text`), which the backend parses with the same parser as any model reply. The
  teacher observes every tool result the LLM agent observes (none that a CRNR refresh wiped) and is refreshed with
  it, so it acts on what the chat can still reach plus its notes, as under :class:`~zoo.agents.policies.base.CRNR`.
* :func:`collect_demonstrations` runs episodes through the normal harness (:func:`~zoo.agents.evaluate.run_episodes`)
  and returns one row per model request: ``chat`` (the messages, system prompt first), ``tools`` and the reply
  ``completion``; the trajectories say how the teacher scored through the text path.
* :class:`ChatRendering` turns a row into the prompt token ids with
  :class:`~zoo.agents.backends.hf_local.HFLocalBackend`'s own ``render``/``encode`` (chat template, or the plain
  transcript with the tools listed), so training sees the evaluation's prompt token for token.

Training on these rows with the loss on the reply only is plain SFT (Pomerleau 1989's behaviour cloning; the
supervised stage of agent tuning such as FireAct, arXiv:2310.05915, and AgentTuning, arXiv:2310.12823).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any, ClassVar

from zoo.agents.backends.base import Backend, flatten_messages
from zoo.agents.backends.hf_local import HFLocalBackend, checked_overflow, plain_transcript
from zoo.agents.backends.scripted import ScriptedBackend
from zoo.agents.envs.base import Environment
from zoo.agents.errors import BackendError
from zoo.agents.evaluate import derive_seed, run_episodes
from zoo.agents.policies.base import Agent, EpisodeInfo
from zoo.agents.policies.llm import LLMToolAgent
from zoo.agents.runner import Trajectory
from zoo.agents.types import Message, ToolCall, ToolResult


def reply_text(call: ToolCall) -> str:
    """A tool call written as a model reply: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the text
    form :func:`~zoo.agents.backends.base.flatten_messages` writes calls in and :func:`~zoo.agents.parsing.
    parse_tool_calls` reads first."""
    return f"<tool_call>{json.dumps({'name': call.name, 'arguments': call.arguments})}</tool_call>"


def demonstration_text(row: dict[str, Any]) -> str:
    """A demonstration row as a model without a chat template reads it: the prompt as
    :class:`~zoo.agents.backends.hf_local.HFLocalBackend` renders the chat for such a tokenizer (its plain
    transcript), then the reply (e.g. the corpus of a tokenizer trained for the behaviour-cloned model)."""
    return plain_transcript(flatten_messages(row["chat"], row["tools"])) + row["completion"]


class Demonstrator(LLMToolAgent):
    """The LLM tool-calling agent with a scripted teacher as its model; records every request and reply.

    Args:
        teacher: the scripted agent whose actions are demonstrated (its ``decide`` is called once per request).
        seed: the LLM agent's seed (forwarded with every request, as for a model).

    Attributes:
        demonstrations: ``{"chat", "tools", "completion", "step", "request", "tool"}`` per request, in order (this
            episode's); ``request`` is ``"first"`` for the episode's first request (no earlier call of the episode in
            its chat) and ``"later"`` after it; ``tool`` names the teacher's tool (``move``, ``reset``, ...): columns
            to weigh rows by (``datamodule/sampler=weighted datamodule.sampler.domain_column=request`` or ``=tool``).
    """

    name: ClassVar[str] = "demonstrator"

    def __init__(self, teacher: Agent, seed: int = 0) -> None:
        if teacher.records_own_messages:
            raise BackendError(f"the teacher must be a scripted agent, got {type(teacher).__name__}")
        self.teacher = teacher
        self.demonstrations: list[dict[str, Any]] = []
        backend = ScriptedBackend(policy=self._reply, name=f"teacher:{teacher.name}")
        super().__init__(backend, seed=seed)

    def begin(self, info: EpisodeInfo) -> None:
        super().begin(info)
        self.teacher.begin(info)
        self.demonstrations = []

    def observe(self, observation: ToolResult) -> None:
        self.teacher.observe(observation)

    def on_context_refresh(self) -> None:
        self.teacher.on_context_refresh()

    def _reply(self, messages: list[Message], tools: list[dict[str, Any]]) -> str:
        action = self.teacher.decide()
        if action.call is None:
            raise BackendError(f"the teacher {self.teacher.name} made no tool call ({action.error})")
        text = reply_text(action.call)
        self.demonstrations.append(
            {
                "chat": copy.deepcopy(messages),
                "tools": copy.deepcopy(tools),
                "completion": text,
                "step": len(self.demonstrations),
                "request": "later" if self.demonstrations else "first",
                "tool": action.call.name,
            }
        )
        return text


def collect_demonstrations(
    make_env: Callable[..., Environment],
    make_teacher: Callable[..., Agent],
    episodes: int,
    seed: int,
    role: str = "demonstrations",
    **harness: Any,
) -> tuple[list[dict[str, Any]], list[Trajectory]]:
    """Demonstration rows of ``episodes`` episodes of the teacher acting through the LLM agent's chat.

    The episodes' worlds are those of a run with seed ``derive_seed(seed, 0, role)`` (SHA-256 based), so they are
    not the worlds an evaluation run with a small seed plays (its episode ``i`` uses ``derive_seed(seed, i, "env")``).

    Args:
        make_env: ``make_env(seed=...) -> Environment`` (a Hydra ``_partial_``).
        make_teacher: ``make_teacher(seed=...) -> Agent``, a scripted agent.
        episodes: number of episodes.
        seed: base seed; ``role`` (e.g. the split) makes the worlds of each split distinct.
        harness: :func:`~zoo.agents.evaluate.run_episodes` options (``max_steps``, ``crnr_window``, ``code_tool``),
            as the evaluation run sets them.

    Returns:
        The rows (``chat``, ``tools``, ``completion``, ``step``, ``request``, ``tool``, ``episode``, ``env``,
        ``teacher``) and the trajectories.
    """
    agents: list[Demonstrator] = []

    def make_agent(seed: int) -> Demonstrator:
        agents.append(Demonstrator(make_teacher(seed=seed), seed=seed))
        return agents[-1]

    run_seed = derive_seed(seed, 0, role)
    trajectories = run_episodes(make_env, make_agent, list(range(int(episodes))), run_seed, **harness)
    rows = []
    for agent, trajectory in zip(agents, trajectories):
        for row in agent.demonstrations:
            rows.append({**row, "episode": trajectory.episode, "env": trajectory.env, "teacher": agent.teacher.name})
    return rows, trajectories


class ChatRendering(HFLocalBackend):
    """:class:`~zoo.agents.backends.hf_local.HFLocalBackend`'s ``render``, ``encode`` and ``fit_context`` for a
    tokenizer alone: the prompt text and token ids the backend gives its model for a chat, cut to a context as the
    backend cuts it under its ``overflow`` setting (no model is loaded or called)."""

    def __init__(self, tokenizer: Any, overflow: str = "error", key: str = "overflow") -> None:
        Backend.__init__(self)
        self._tokenizer = tokenizer
        self._model = None
        self.overflow = checked_overflow(overflow, key)

    def _complete(self, request: dict[str, Any]) -> Any:
        raise BackendError("ChatRendering renders prompts only; use HFLocalBackend to generate")


__all__ = ["ChatRendering", "Demonstrator", "collect_demonstrations", "demonstration_text", "reply_text"]
