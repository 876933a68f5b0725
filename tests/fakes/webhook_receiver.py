"""A webhook receiver for tests: a real HTTP server in a thread of the test process.

It keeps every request it gets (headers, body, the status it answered) and answers from a script
of status codes: the test says "500 then 200" (`script`) and then proves the retry by what
arrived. `verify` checks a request the way a Standard Webhooks receiver would, with nothing of
the server's code: the base64 key after ``whsec_``, HMAC-SHA256 over ``id.timestamp.body``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Received", "WebhookReceiver", "running_receiver", "verify"]


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def event(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value


def verify(secret: str, received: Received) -> bool:
    """Whether the request's ``webhook-signature`` is right for ``secret`` (Standard Webhooks)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    headers = received.headers
    content = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + received.body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    return any(
        part.partition(",")[0] == "v1" and hmac.compare_digest(part.partition(",")[2], expected)
        for part in headers.get("webhook-signature", "").split(" ")
    )


class WebhookReceiver:
    """The server's state: what arrived, what to answer next (200 once the script is used)."""

    def __init__(self, host: str) -> None:
        self.received: list[Received] = []
        self._script: list[int] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                status = receiver._next()
                with receiver._lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.received.append(Received(self.path, headers, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self._server.server_address[1]}"

    def _next(self) -> int:
        with self._lock:
            return self._script.pop(0) if self._script else 200

    def script(self, *statuses: int) -> None:
        """Answer the next requests with these statuses, then 200."""
        with self._lock:
            self._script = list(statuses)

    def of_type(self, event_type: str, name: str | None = None) -> list[Received]:
        with self._lock:
            found = list(self.received)
        return [
            r
            for r in found
            if r.event["type"] == event_type and (name is None or r.event["data"].get("name") == name)
        ]

    def start(self) -> None:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def running_receiver(host: str = "127.0.0.1") -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(host)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
