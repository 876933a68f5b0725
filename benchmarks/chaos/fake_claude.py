"""A tiny stand-in for the Anthropic Messages API, so the campaign's BYOK runs call "Claude".

The integration suite has a full fake (``tests/fakes/anthropic_api.py``), but benchmarks do not
import tests, and a BYOK run in the campaign needs only one thing: ``POST /v1/messages`` with
``"stream": true`` answered by a short text reply as Server-Sent Events, with usage (so the run
costs something on the user's key). Every request is counted, so the report can say how many
calls the BYOK runs made (a repeated call after a fault shows as more calls than runs).
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeClaude"]

_USAGE = {
    "input_tokens": 40,
    "output_tokens": 8,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


def _stream(model: str, text: str, message_id: str) -> bytes:
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**_USAGE, "output_tokens": 1},
    }
    return b"".join(
        [
            _event("message_start", {"type": "message_start", "message": start}),
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
            ),
            _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": dict(_USAGE),
                },
            ),
            _event("message_stop", {"type": "message_stop"}),
        ]
    )


class FakeClaude:
    """``POST /v1/messages`` on 127.0.0.1 (a free port), answered "The answer is 4." as a stream."""

    def __init__(self) -> None:
        self.calls = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
                return

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.startswith("/v1/messages") or self.path.startswith("/v1/messages/count"):
                    data = json.dumps({"input_tokens": 40}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                with fake._lock:
                    fake.calls += 1
                    number = next(fake._ids)
                data = _stream(str(body.get("model") or "claude"), "The answer is 4.", f"msg_chaos_{number}")
                if not body.get("stream"):
                    message = {
                        "id": f"msg_chaos_{number}",
                        "type": "message",
                        "role": "assistant",
                        "model": body.get("model"),
                        "content": [{"type": "text", "text": "The answer is 4."}],
                        "stop_reason": "end_turn",
                        "stop_sequence": None,
                        "usage": dict(_USAGE),
                    }
                    data = json.dumps(message).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.send_header("request-id", f"req_chaos_{number}")
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.send_header("request-id", f"req_chaos_{number}")
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-claude", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeClaude:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
