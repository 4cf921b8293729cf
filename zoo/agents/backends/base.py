"""The backend protocol and the record/replay cache every backend goes through.

A backend turns a chat (OpenAI-style message dicts) plus tool declarations into a :class:`Completion`: the reply
text, the tool calls (native or recovered from the text by :mod:`zoo.agents.parsing`) and token usage. Every
request goes through :meth:`Backend.complete`, which

* forwards ``seed`` (variance between runs is the rule in agent benchmarks when seeds are dropped),
* looks the request up in a :class:`ReplayCache` keyed by the SHA-256 of the canonical request JSON
  (backend identity, messages, tools, seed, temperature, max tokens), and
* accumulates token usage in :attr:`Backend.usage` (replayed replies count the tokens they were recorded with, so
  a replayed run reports what the recorded run did).
"""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from zoo.agents.errors import ReplayMissError
from zoo.agents.parsing import parse_native_tool_calls, parse_tool_calls
from zoo.agents.types import Completion, Message, Usage
from zoo.errors import ConfigError

CACHE_MODES = ("off", "record", "replay", "auto")


def approx_tokens(text: str) -> int:
    """A deterministic token estimate (4 characters per token) for backends without a tokenizer."""
    return math.ceil(len(text) / 4) if text else 0


def request_key(request: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a request."""
    blob = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def flatten_messages(messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
    """Messages with tool calls and tool results written as text, and the tools listed in the system prompt."""
    out: list[Message] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            out.append({"role": "user", "content": f"[tool {message.get('name')} returned]\n{message['content']}"})
        elif role == "assistant" and message.get("tool_calls"):
            calls = [
                {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"] or "{}")}
                for c in message["tool_calls"]
            ]
            text = (message.get("content") or "").strip()
            body = "\n".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)
            out.append({"role": "assistant", "content": f"{text}\n{body}".strip()})
        else:
            out.append({"role": role, "content": message.get("content") or ""})
    if tools:
        listing = "\n".join(json.dumps(t["function"]) for t in tools)
        howto = (
            "You can call these tools. To call one, reply with "
            '<tool_call>{"name": <tool name>, "arguments": {<arguments>}}</tool_call>.\n' + listing
        )
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{howto}"}
        else:
            out.insert(0, {"role": "system", "content": howto})
    return out


class ReplayCache:
    """Recorded replies keyed by request, in a JSONL file (one ``{"key", "request", "response"}`` per line).

    Args:
        path: the JSONL file (created on first write). ``None`` keeps the cache in memory only.
        mode: ``off`` (no caching), ``record`` (always call the model and store the reply), ``replay`` (only
            recorded replies; a request never seen is an error), ``auto`` (replay when recorded, else call and store).
    """

    def __init__(self, path: str | Path | None = None, mode: str = "auto") -> None:
        if mode not in CACHE_MODES:
            raise ConfigError(f"backend cache mode={mode!r}; use one of {CACHE_MODES}")
        if mode == "replay" and path is not None and not Path(path).is_file():
            raise ConfigError(f"backend cache mode=replay but the recording {Path(path).resolve()} does not exist")
        self.path = Path(path) if path is not None else None
        self.mode = mode
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.is_file():
            for number, line in enumerate(self.path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.entries[row["key"]] = row["response"]
                except (json.JSONDecodeError, KeyError) as err:
                    raise ConfigError(f"{self.path}:{number}: not a cache record ({err})") from None

    def lookup(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key) if self.mode in ("replay", "auto") else None

    def store(self, key: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        if self.mode not in ("record", "auto"):
            return
        self.entries[key] = response
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as handle:
                handle.write(json.dumps({"key": key, "request": request, "response": response}, default=str) + "\n")


class Backend(ABC):
    """A chat model that can call tools.

    Args:
        temperature: default sampling temperature (0 = greedy where the backend supports it).
        max_tokens: default reply budget.
        cache: a :class:`ReplayCache`, or a dict of its arguments (``{"path": ..., "mode": ...}``), or ``None``.
    """

    def __init__(
        self, temperature: float = 0.0, max_tokens: int = 512, cache: ReplayCache | dict[str, Any] | None = None
    ) -> None:
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.cache = ReplayCache(**cache) if isinstance(cache, dict) else (cache or ReplayCache(mode="off"))
        self.usage = Usage()

    def reset_episode(self) -> None:  # noqa: B027 (an optional hook)
        """Called at the start of every episode (stateless backends: nothing to do)."""

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """What distinguishes this backend's replies (model name, endpoint): part of the cache key."""

    @abstractmethod
    def _complete(self, request: dict[str, Any]) -> Completion:
        """Call the model for a canonical request (see :meth:`complete`)."""

    def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        seed: int | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> Completion:
        """Reply to ``messages`` (OpenAI format) with the declared ``tools`` available."""
        request = {
            "backend": self.identity(),
            "messages": messages,
            "tools": tools or [],
            "seed": seed,
            "temperature": self.temperature if temperature is None else temperature,
            "max_tokens": self.max_tokens if max_tokens is None else max_tokens,
        }
        key = request_key(request)
        recorded = self.cache.lookup(key)
        if recorded is not None:
            completion = Completion.from_dict(recorded)
        elif self.cache.mode == "replay":
            where = self.cache.path or "the in-memory cache"
            raise ReplayMissError(
                f"no recorded reply for request {key[:16]} in {where} (mode=replay); record it first with "
                "cache mode=record or auto, or check that the prompt, tools, seed and model are unchanged"
            )
        else:
            completion = self._complete(request)
            self.cache.store(key, request, completion.to_dict())
        self.usage.add(completion.usage)
        return completion

    @staticmethod
    def parse_reply(content: str, native_calls: list[dict[str, Any]] | None, tools: list[dict[str, Any]]):
        """Native tool calls when present, else calls recovered from the text."""
        if native_calls:
            return parse_native_tool_calls(native_calls)
        names = [t["function"]["name"] for t in tools]
        positional = {t["function"]["name"]: list(t["function"]["parameters"].get("properties", {})) for t in tools}
        return parse_tool_calls(content, known_tools=names, tool_params=positional)
