"""A deterministic scripted backend: replies from a list or a policy function (tests, demos of the harness).

It is a stand-in for a model, not a model: it lets the LLM agent path (prompting, tool-call parsing, failed
steps, CRNR, token accounting, the record/replay cache) run end to end on a CPU with no weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from zoo.agents.backends.base import Backend, ReplayCache, approx_tokens
from zoo.agents.errors import BackendError
from zoo.agents.parsing import ParsedCalls, parse_native_tool_calls
from zoo.agents.types import Completion, Message, ToolCall, Usage

Reply = str | dict[str, Any]
Policy = Callable[[list[Message], list[dict[str, Any]]], Reply]


class ScriptedBackend(Backend):
    """Replies taken in order from ``responses`` (or computed by ``policy``), from the first one in every episode.

    A reply is a string (the reply text, from which tool calls are parsed like any model's text) or a dict
    ``{"content": str, "tool_calls": [{"name": ..., "arguments": {...}} | OpenAI tool_call dict, ...],
    "finish_reason": "stop" | "length" | ...}`` (native
    calls). Tokens are counted with :func:`~zoo.agents.backends.base.approx_tokens`.

    Args:
        responses: the replies, in order.
        policy: ``(messages, tools) -> reply``, used instead of ``responses`` when given.
        cycle: start again from the first reply when the list is used up (else an error).
        name: identity of the script in the cache key.
    """

    def __init__(
        self,
        responses: Sequence[Reply] = (),
        policy: Policy | None = None,
        cycle: bool = False,
        name: str = "scripted",
        temperature: float = 0.0,
        max_tokens: int = 512,
        cache: ReplayCache | dict[str, Any] | None = None,
    ) -> None:
        super().__init__(temperature, max_tokens, cache)
        if policy is None and not responses:
            raise BackendError("ScriptedBackend needs responses (a list of replies) or a policy function")
        self.responses = list(responses)
        self.policy = policy
        self.cycle = cycle
        self.name = name
        self.position = 0

    def identity(self) -> dict[str, Any]:
        return {"kind": "scripted", "name": self.name}

    def reset_episode(self) -> None:
        """Every episode replays the script from its first reply (episodes do not depend on each other)."""
        self.position = 0

    def _next_reply(self, request: dict[str, Any]) -> Reply:
        if self.policy is not None:
            return self.policy(request["messages"], request["tools"])
        if self.position >= len(self.responses):
            if not self.cycle:
                raise BackendError(f"scripted backend ran out of replies after {len(self.responses)} calls")
            self.position = 0
        reply = self.responses[self.position]
        self.position += 1
        return reply

    def _complete(self, request: dict[str, Any]) -> Completion:
        reply = self._next_reply(request)
        if isinstance(reply, str):
            content, native, finish = reply, None, "stop"
        else:
            content, native = str(reply.get("content") or ""), reply.get("tool_calls")
            finish = reply.get("finish_reason", "stop")
        if native:
            parsed = _scripted_calls(native)
        else:
            parsed = self.parse_reply(content, None, request["tools"])
        prompt_text = json.dumps(request["messages"]) + json.dumps(request["tools"])
        completion_text = content + json.dumps(native or [])
        usage = Usage(approx_tokens(prompt_text), approx_tokens(completion_text), 1)
        return Completion(content, parsed.calls, parsed.errors, usage, finish)


def _scripted_calls(native: list[dict[str, Any]]) -> ParsedCalls:
    if all(isinstance(c, dict) and "function" in c for c in native):
        return parse_native_tool_calls(native)
    return ParsedCalls([ToolCall(c["name"], dict(c.get("arguments") or {}), f"call_{i}") for i, c in enumerate(native)])
