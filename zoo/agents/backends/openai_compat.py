"""Any OpenAI-compatible chat endpoint (vLLM, llama.cpp server, SGLang, TGI, Ollama, hosted APIs) over ``httpx``.

``POST {base_url}/chat/completions`` with ``model``, ``messages``, ``tools``, ``temperature``, ``max_tokens`` and
``seed``. Native ``tool_calls`` in the reply are used when present, else calls are recovered from the reply text
(servers without function calling, or ``native_tools=False``, which also flattens tool messages into plain
user/assistant text for servers that reject the ``tool`` role).

Retry policy, as the official ``openai`` Python client (``_should_retry`` / ``_calculate_retry_timeout``):
connection failures, timeouts and the statuses ``retry_statuses`` (408, 409, 429, 500, 502, 503, 504 by default)
are retried up to ``max_retries`` times; the wait before retry ``n`` is ``backoff * 2**(n-1)`` capped at
``max_backoff``, or the server's ``Retry-After`` seconds when it sends one within that cap. When every attempt fails
to connect the error names the endpoint; when every attempt runs out of ``timeout`` the error names the setting.

``seed`` is sent with every request (OpenAI's reproducibility field, honoured by vLLM, SGLang, llama.cpp). A server
that rejects the field (HTTP 400/422 whose message names ``seed``) gets the request again without it, and later
requests of this backend omit it; one warning says so (replies are then not reproducible by seed).

Requires the optional extra ``paperzoo[agents]`` (``httpx``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from zoo.agents.backends.base import Backend, ReplayCache, approx_tokens, flatten_messages
from zoo.agents.errors import BackendError, UnreachableEndpointError
from zoo.agents.types import Completion, Usage
from zoo.errors import ConfigError

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)
log = logging.getLogger(__name__)


def retry_after_seconds(value: str | None) -> float | None:
    """The ``Retry-After`` header in seconds (the delay-seconds form; an HTTP date or garbage gives ``None``)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class OpenAICompatBackend(Backend):
    """Chat completions from an OpenAI-compatible HTTP endpoint.

    Args:
        base_url: e.g. ``http://localhost:8000/v1`` (the ``/chat/completions`` path is appended).
        model: model name the server knows.
        api_key: the key; ``None`` reads the environment variable ``api_key_env`` (no key is fine for local servers).
        api_key_env: environment variable holding the key.
        native_tools: send ``tools`` and tool messages natively (``False``: describe tools in the system prompt and
            parse calls from the text).
        timeout: seconds per request (connect, read, write); a request with no reply by then is retried, and when
            every attempt times out the error names ``backend.timeout``.
        max_retries: retries after the first attempt (connection errors, timeouts, ``retry_statuses``).
        backoff: first wait in seconds, doubled after every failed attempt.
        max_backoff: the longest wait between attempts (also the longest ``Retry-After`` honoured).
        retry_statuses: HTTP statuses that are retried; any other status >= 400 is an error at once.
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
        max_backoff: float = 60.0,
        retry_statuses: list[int] | tuple[int, ...] = RETRY_STATUS,
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
        if max_retries < 0 or backoff < 0 or max_backoff < 0:
            raise ConfigError(
                f"backend.max_retries ({max_retries}), backend.backoff ({backoff}) and backend.max_backoff "
                f"({max_backoff}) must be >= 0"
            )
        if timeout is None or timeout <= 0:
            raise ConfigError(f"backend.timeout={timeout!r} must be a positive number of seconds")
        bad = [s for s in retry_statuses if not isinstance(s, int) or not 400 <= s <= 599]
        if bad:
            raise ConfigError(f"backend.retry_statuses holds {bad}: list HTTP error statuses (400-599) to retry")
        self.base_url = str(base_url).rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.native_tools = native_tools
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.retry_statuses = frozenset(retry_statuses)
        self.extra_body = dict(extra_body or {})
        self.sleep = sleep
        self.send_seed = True  # False once the server rejected the field
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
        if request["seed"] is not None and self.send_seed:
            body["seed"] = request["seed"]
        if tools and self.native_tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        return body

    def wait(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry ``attempt`` (1-based): the server's ``Retry-After`` when it sends one within
        ``max_backoff``, else ``backoff * 2**(attempt-1)`` capped at ``max_backoff``."""
        if retry_after is not None and retry_after <= self.max_backoff:
            return retry_after
        return min(self.backoff * 2 ** (attempt - 1), self.max_backoff)

    def rejects_seed(self, response: Any, body: dict[str, Any]) -> bool:
        """Whether an error reply refuses the ``seed`` field (HTTP 400/422 naming it) of a body that carried one."""
        return "seed" in body and response.status_code in (400, 422) and "seed" in response.text.lower()

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with the retry policy (see the module docstring); returns the decoded JSON reply."""
        import httpx

        url = f"{self.base_url}{path}"
        last: str = ""
        unreachable = timed_out = True  # every attempt failed to connect / ran out of time so far
        retry_after: float | None = None
        attempt = 0  # failed attempts so far
        resend = False  # the seed was refused: send again at once
        while attempt <= self.max_retries:
            if attempt and not resend:
                self.sleep(self.wait(attempt, retry_after))
            retry_after, resend = None, False
            try:
                response = self.client.post(url, json=body)
            except httpx.ConnectTimeout as err:
                attempt, last = attempt + 1, f"{type(err).__name__}: {err}"
                continue
            except httpx.ConnectError as err:
                attempt, last, timed_out = attempt + 1, f"{type(err).__name__}: {err}", False
                continue
            except httpx.TimeoutException as err:  # the server was reached but did not answer in time
                attempt, last, unreachable = attempt + 1, f"{type(err).__name__}: {err}", False
                continue
            except httpx.TransportError as err:  # dropped connections: the server was reached
                attempt, last, unreachable, timed_out = attempt + 1, f"{type(err).__name__}: {err}", False, False
                continue
            unreachable = timed_out = False
            if self.rejects_seed(response, body):  # sent again at once without the field: not a failed attempt
                log.warning(
                    "%s rejects the seed field (HTTP %d: %s); sending requests without it from now on, so replies "
                    "are not reproducible by seed",
                    url,
                    response.status_code,
                    response.text[:200],
                )
                self.send_seed = False
                body, resend = {k: v for k, v in body.items() if k != "seed"}, True
                continue
            attempt += 1
            if response.status_code in self.retry_statuses:
                last = f"HTTP {response.status_code}: {response.text[:200]}"
                retry_after = retry_after_seconds(response.headers.get("retry-after"))
                continue
            if response.status_code >= 400:
                raise BackendError(f"{url} answered HTTP {response.status_code}: {response.text[:500]}")
            try:
                return response.json()
            except json.JSONDecodeError:
                raise BackendError(f"{url} did not answer JSON: {response.text[:200]!r}") from None
        attempts = self.max_retries + 1
        if unreachable:
            raise UnreachableEndpointError(
                f"could not reach {url} after {attempts} attempts ({last}); check backend.base_url and "
                "that the server is running"
            )
        if timed_out:
            raise BackendError(
                f"{url} gave no reply within backend.timeout={self.timeout:g} s on any of {attempts} attempts "
                f"({last}); raise backend.timeout or check the server's load"
            )
        raise BackendError(f"{url} failed after {attempts} attempts ({last})")

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
