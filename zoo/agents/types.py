"""Plain data types shared by backends, tools, environments and agents.

Messages are OpenAI-style chat dicts (``{"role": ..., "content": ..., "tool_calls": [...], "tool_call_id": ...}``)
so that they serialize to JSON unchanged (trajectories, the record/replay cache) and go to any
OpenAI-compatible endpoint as they are.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

Message = dict[str, Any]


@dataclass
class Usage:
    """Token accounting of one or more model calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.calls += other.calls

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total_tokens": self.total_tokens}


@dataclass
class ToolCall:
    """One call of a tool by name with keyword arguments.

    Attributes:
        name: tool name.
        arguments: keyword arguments (already parsed from JSON).
        id: call id (echoed in the tool message that carries the result).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = "call_0"

    def to_message_dict(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry of an assistant message."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, sort_keys=True)},
        }


@dataclass
class ToolResult:
    """What a tool call returned.

    Attributes:
        name: the tool that was called (``None`` when no call could be made, e.g. an unparsable reply).
        arguments: the arguments it was called with.
        ok: ``False`` when the harness refused the call (unknown tool, bad arguments) or the environment
            reported a failure (``{"success": False, ...}`` or ``{"error": ...}``).
        content: the tool's return value (a JSON-serializable dict, list or string).
        error: the harness's error message when the call could not run at all.
        call_id: id of the call this answers.
    """

    name: str | None
    arguments: dict[str, Any]
    ok: bool
    content: Any = None
    error: str | None = None
    call_id: str = "call_0"

    def as_text(self) -> str:
        """The observation as the text a model reads."""
        if self.error is not None:
            return f"Error: {self.error}"
        if isinstance(self.content, str):
            return self.content
        return json.dumps(self.content, sort_keys=True)


@dataclass
class Completion:
    """One reply of a backend.

    Attributes:
        content: the reply text (reasoning tags kept).
        tool_calls: parsed tool calls (native, or recovered from the text).
        parse_errors: why a tool call in the reply could not be parsed (the step is recorded as failed).
        usage: tokens of this call.
        finish_reason: why generation stopped, as OpenAI reports it (``stop``, ``tool_calls``, ``length`` when the
            ``max_tokens`` budget cut the reply off, ...); ``None`` when the backend does not say.
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None

    @property
    def truncated(self) -> bool:
        """Whether the reply was cut off by the token budget (its tool calls must not be run)."""
        return self.finish_reason == "length"

    def to_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "tool_calls": [asdict(c) for c in self.tool_calls],
            "parse_errors": list(self.parse_errors),
            "usage": asdict(self.usage),
            "finish_reason": self.finish_reason,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Completion:
        return cls(
            content=data.get("content", ""),
            tool_calls=[ToolCall(**c) for c in data.get("tool_calls", [])],
            parse_errors=list(data.get("parse_errors", [])),
            usage=Usage(**data.get("usage", {})),
            finish_reason=data.get("finish_reason"),
        )
