"""Any OpenAI-compatible chat endpoint (vLLM, llama.cpp server, SGLang, TGI, Ollama, hosted APIs) over ``httpx``.

``POST {base_url}/chat/completions`` with ``model``, ``messages``, ``tools``, ``temperature``, ``max_tokens`` and
``seed``. Native ``tool_calls`` in the reply are used when present, else calls are recovered from the reply text
(servers without function calling, or ``native_tools=False``, which also flattens tool messages into plain
user/assistant text for servers that reject the ``tool`` role). Connection failures, timeouts, HTTP 429 and 5xx
are retried with exponential backoff; when every attempt fails to connect the error names the endpoint.

Requires the optional extra ``paperzoo[agents]`` (``httpx``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from zoo.agents.backends.base import Backend, ReplayCache, approx_tokens, flatten_messages
from zoo.agents.errors import BackendError, UnreachableEndpointError
from zoo.agents.types import Completion, Usage
from zoo.errors import ConfigError

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAICompatBackend(Backend):
    """Chat completions from an OpenAI-compatible HTTP endpoint.

    Args:
        base_url: e.g. ``http://localhost:8000/v1`` (the ``/chat/completions`` path is appended).
        model: model name the server knows.
        api_key: the key; ``None`` reads the environment variable ``api_key_env`` (no key is fine for local servers).
        api_key_env: environment variable holding the key.
        native_tools: send ``tools`` and tool messages natively (``False``: describe tools in the system prompt and
            parse calls from the text).
        timeout: seconds per request.
        max_retries: retries after the first attempt (connection errors, timeouts, 408/409/429/5xx).
        backoff: first wait in seconds, doubled after every failed attempt.
        extra_body: more request fields (e.g. ``{"top_p": 0.95}``).
        sleep: the wait function (tests pass a no-op).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        native_tools: bool = True,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        extra_body: dict[str, Any] | None = None,
        temperature: float = 0.0,
        max_tokens: int = 512,
        cache: ReplayCache | dict[str, Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(temperature, max_tokens, cache)
        if not base_url or not str(base_url).startswith(("http://", "https://")):
            raise ConfigError(f"backend.base_url={base_url!r} must be an http(s) URL such as http://localhost:8000/v1")
        if not model:
            raise ConfigError("backend.model is required (the model name the endpoint serves)")
        if max_retries < 0 or backoff < 0:
            raise ConfigError(f"backend.max_retries ({max_retries}) and backend.backoff ({backoff}) must be >= 0")
        self.base_url = str(base_url).rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.native_tools = native_tools
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.extra_body = dict(extra_body or {})
        self.sleep = sleep
        self._client = None

    def identity(self) -> dict[str, Any]:
        return {"kind": "openai_compat", "base_url": self.base_url, "model": self.model, "native": self.native_tools}

    @property
    def client(self):
        if self._client is None:
            try:
                import httpx
            except ImportError:
                raise ConfigError("the OpenAI-compatible backend needs httpx: pip install 'paperzoo[agents]'") from None
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.Client(timeout=self.timeout, headers=headers)
        return self._client

    def body(self, request: dict[str, Any]) -> dict[str, Any]:
        """The JSON body sent for a canonical request."""
        tools = request["tools"]
        messages = request["messages"] if self.native_tools else flatten_messages(request["messages"], tools)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": request["temperature"],
            "max_tokens": request["max_tokens"],
            **self.extra_body,
        }
        if request["seed"] is not None:
            body["seed"] = request["seed"]
        if tools and self.native_tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        return body

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries and backoff; returns the decoded JSON reply."""
        import httpx

        url = f"{self.base_url}{path}"
        last: str = ""
        unreachable = True
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self.client.post(url, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as err:
                last = f"{type(err).__name__}: {err}"
                continue
            except httpx.TransportError as err:  # read timeouts, dropped connections: the server was reached
                unreachable, last = False, f"{type(err).__name__}: {err}"
                continue
            unreachable = False
            if response.status_code in RETRY_STATUS:
                last = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise BackendError(f"{url} answered HTTP {response.status_code}: {response.text[:500]}")
            try:
                return response.json()
            except json.JSONDecodeError:
                raise BackendError(f"{url} did not answer JSON: {response.text[:200]!r}") from None
        if unreachable:
            raise UnreachableEndpointError(
                f"could not reach {url} after {self.max_retries + 1} attempts ({last}); check backend.base_url and "
                "that the server is running"
            )
        raise BackendError(f"{url} failed after {self.max_retries + 1} attempts ({last})")

    def _complete(self, request: dict[str, Any]) -> Completion:
        data = self.post("/chat/completions", self.body(request))
        try:
            finish_reason = data["choices"][0].get("finish_reason")
            message = data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.base_url}: reply without choices[0].message: {str(data)[:300]}") from None
        content = message.get("content") or ""
        native = message.get("tool_calls") if self.native_tools else None
        parsed = self.parse_reply(content, native, request["tools"])
        usage = data.get("usage") or {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        if prompt_tokens is None:  # servers that do not report usage: estimate
            prompt_tokens = approx_tokens(json.dumps(request["messages"]))
            completion_tokens = approx_tokens(content + json.dumps(native or []))
        usage = Usage(int(prompt_tokens), int(completion_tokens), 1)
        return Completion(content, parsed.calls, parsed.errors, usage, finish_reason)
