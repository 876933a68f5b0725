"""The Messages endpoint inside the sandbox: the official SDK's calls become journaled model steps.

The bootstrap points ``ANTHROPIC_BASE_URL`` at this server (127.0.0.1, a free port). Each
``POST /v1/messages`` is one `ModelCall` over the runtime socket; the run actor routes, prices,
caps, sends and journals it (or replays it) and answers with the Messages API response, which
goes back to the SDK as JSON, or as the server-sent events a streaming request reads. The key
the SDK sends is the per-run placeholder (``ANTHROPIC_API_KEY``): the real key never enters the
sandbox, and a process of the sandbox that does not know the placeholder is refused.

Errors the actor records travel with their Messages API status and ``x-should-retry: false``:
the actor has already retried what is worth retrying, and a retry by the SDK would be a new step.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .protocol import ModelCall, Reply, Request

__all__ = ["ModelRelay", "sse_events", "ERROR_STATUS"]

ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_TOOL_INPUT_BLOCKS = ("tool_use", "server_tool_use")
_MAX_BODY = 32 << 20


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def sse_events(message: dict[str, Any]) -> bytes:
    """A whole Messages API response as the stream of events the SDK's stream reader parses."""
    usage = dict(message.get("usage") or {})
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": min(1, int(usage.get("output_tokens") or 0))}
    out = [_event("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            first = {**block, "text": ""}
            first.pop("citations", None)
            deltas.append({"type": "text_delta", "text": block.get("text", "")})
            deltas += [{"type": "citations_delta", "citation": c} for c in block.get("citations") or []]
        elif kind in _TOOL_INPUT_BLOCKS:
            first = {**block, "input": {}}
            deltas.append({"type": "input_json_delta", "partial_json": json.dumps(block.get("input", {}))})
        elif kind == "thinking":
            first = {**block, "thinking": "", "signature": ""}
            deltas.append({"type": "thinking_delta", "thinking": block.get("thinking", "")})
            deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
        else:  # redacted thinking, tool results, ...: whole in the start event
            first = block
        out.append(
            _event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": first}
            )
        )
        for delta in deltas:
            out.append(
                _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        out.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")}
    if message.get("stop_details") is not None:
        delta["stop_details"] = message["stop_details"]
    out.append(_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    out.append(_event("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def _rough_tokens(body: dict[str, Any]) -> int:
    """About four characters a token: enough for a program budgeting its context."""
    parts = [body.get("system"), body.get("messages"), body.get("tools")]
    return max(1, len(json.dumps([p for p in parts if p is not None])) // 4)


class ModelRelay:
    """``http://127.0.0.1:<port>``: the Messages API for the program's SDK, over ``call``."""

    def __init__(self, call: Callable[[Request], Reply], api_key: str) -> None:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # the program's stderr is a log
                return

            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                relay._post(self)

            def do_GET(self) -> None:  # noqa: N802
                relay._error(self, 404, "not_found_error", f"no such endpoint: GET {self.path}")

        self._call = call
        self._key = api_key
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="nodus-model-relay", daemon=True
        )

    def start(self) -> ModelRelay:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- one request ----------------------------------------------------------------------------

    def _send(self, handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
        handler.send_response(status)
        handler.send_header("content-type", content_type)
        handler.send_header("content-length", str(len(body)))
        handler.send_header("request-id", "req_nodus_relay")
        if status >= 400:
            handler.send_header("x-should-retry", "false")
        handler.end_headers()
        handler.wfile.write(body)

    def _error(self, handler: BaseHTTPRequestHandler, status: int, kind: str, message: str) -> None:
        body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
        self._send(handler, status, body, "application/json")

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        if length > _MAX_BODY:
            handler.close_connection = True
            self._error(handler, 413, "request_too_large", f"a request body is at most {_MAX_BODY} bytes")
            return
        raw = handler.rfile.read(length) if length else b""
        path = handler.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/messages", "/v1/messages/count_tokens"):
            self._error(handler, 404, "not_found_error", f"no such endpoint: POST {handler.path}")
            return
        bearer = (handler.headers.get("authorization") or "").removeprefix("Bearer ").strip()
        if not self._key or self._key not in (handler.headers.get("x-api-key"), bearer):
            self._error(handler, 401, "authentication_error", "invalid x-api-key")
            return
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        if not isinstance(body, dict):
            self._error(handler, 400, "invalid_request_error", "the request body must be a JSON object")
            return
        if path.endswith("/count_tokens"):
            self._send(
                handler, 200, json.dumps({"input_tokens": _rough_tokens(body)}).encode(), "application/json"
            )
            return
        stream = bool(body.pop("stream", False))
        reply = self._call(ModelCall(body=body))
        if reply.error is not None:
            kind = reply.error.type
            self._error(
                handler,
                ERROR_STATUS.get(kind, 500),
                kind if kind in ERROR_STATUS else "api_error",
                reply.error.message,
            )
            return
        if not isinstance(reply.value, dict):
            self._error(handler, 500, "api_error", "the run actor answered without a message")
            return
        if stream:
            self._send(handler, 200, sse_events(reply.value), "text/event-stream; charset=utf-8")
        else:
            self._send(handler, 200, json.dumps(reply.value).encode(), "application/json")
