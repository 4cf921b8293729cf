"""A local OpenAI-compatible test server (in process, on 127.0.0.1): the HTTP backend is never tested on a network.

Test modules build fixtures from :func:`serve` and :func:`closed_port_url`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeOpenAIServer:
    """Answers ``POST /v1/chat/completions`` with queued replies and records every request body.

    A queued reply is ``(status, body_dict)`` or ``(status, body_dict, headers)``; when the queue is empty the server
    answers ``default``. ``delay`` seconds pass before every answer (a slow server); a request carrying a field of
    ``reject_fields`` is answered HTTP 400 naming it, as the OpenAI API does for an unknown argument.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.replies: list[tuple] = []
        self.default: tuple = (200, message_reply("ok"))
        self.delay = 0.0
        self.reject_fields: set[str] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                request = json.loads(self.rfile.read(length))
                server.requests.append(request)
                server.headers.append(dict(self.headers))
                refused = sorted(server.reject_fields & set(request))
                if refused:
                    reply: tuple = (
                        400,
                        {"error": {"message": f"Unrecognized request argument supplied: {refused[0]}"}},
                    )
                else:
                    reply = server.replies.pop(0) if server.replies else server.default
                status, body, headers = (*reply, {}) if len(reply) == 2 else reply
                time.sleep(server.delay)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (timeout tests)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @staticmethod
    def reply(content: str, tool_calls: list[dict[str, Any]] | None = None, usage: bool = True) -> dict[str, Any]:
        """A chat-completions body with one assistant message."""
        return message_reply(content, tool_calls, usage)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


def message_reply(content: str, tool_calls: list[dict[str, Any]] | None = None, usage: bool = True) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    if usage:
        body["usage"] = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    return body


@contextmanager
def serve() -> Iterator[FakeOpenAIServer]:
    """Run a :class:`FakeOpenAIServer` for the duration of the block."""
    server = FakeOpenAIServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (the port was bound, then released)."""
    probe = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()
    return f"http://127.0.0.1:{port}/v1"
