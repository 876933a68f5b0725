"""A local HTTP server that speaks the Anthropic Messages API, for unit and integration tests.

Why a server and not a mock: the Anthropic provider is only trustworthy if it is exercised
through the real ``anthropic`` SDK, with the SDK's own headers, retry loop, back-off and SSE
parser. Integration tests also need something Ray workers can reach, which they do through
``ANTHROPIC_BASE_URL``. So this is a real HTTP/1.1 server on ``127.0.0.1`` (a free port), run by
the stdlib ``ThreadingHTTPServer`` in a background thread of the test process.

What it does:

* ``POST /v1/messages`` answers with the next scripted reply (:meth:`FakeMessagesAPI.script`),
  or, when the script is empty, with what the responder computes from the request body
  (:meth:`FakeMessagesAPI.set_responder`; by default :func:`echo_responder`, a deterministic
  ``end_turn`` text reply echoing the last user text). ``"stream": true`` requests get Server-Sent
  Events exactly as the API sends them (``message_start``, ``ping``, ``content_block_start`` /
  ``_delta`` / ``_stop`` with ``text_delta``, ``input_json_delta``, ``thinking_delta`` and
  ``signature_delta``, ``message_delta`` with the stop reason and usage, ``message_stop``), over
  chunked transfer encoding; other requests get one JSON message.
* Error replies use the API's body shape ``{"type": "error", "error": {"type", "message"}}`` and
  may carry headers (``retry-after``, ``retry-after-ms``, ``x-should-retry``). Note that the SDK
  only honours ``retry-after`` when it is above 0; ``retry-after: 0`` falls back to its
  exponential back-off (0.5 s, 1 s, ...). Tests that want fast retries send
  ``retry-after-ms`` (e.g. ``{"retry-after-ms": "1"}``).
* :func:`cut_stream_reply` stops a stream after some ``content_block_delta`` events, without
  ``message_delta``/``message_stop``: by default by closing the connection in the middle of the
  chunked body (what a dropped connection looks like), or with ``clean_eof=True`` by ending the
  body properly (what a proxy that gives up looks like). :func:`stream_error_reply` sends an
  ``error`` event in the middle of a stream (the API does this for ``overloaded_error``).
* ``POST /v1/messages/count_tokens`` answers a rough count (characters / 4).
* A request without a key (``x-api-key``, or ``authorization: Bearer``, which is how SDK 2.x
  sends ``api_key=``) gets 401; with :meth:`FakeMessagesAPI.accept_keys` set, so does any other
  key. Those 401s do not consume the
  script. Requests the real API would refuse for their shape (no model, no messages, empty text
  blocks, more than 4 ``cache_control`` breakpoints) get 400 ``invalid_request_error`` and do
  not consume the script either.
* Every request is recorded, in order, in :attr:`FakeMessagesAPI.requests`.
* :meth:`FakeMessagesAPI.rate_limit` enforces per-key limits (`tests.fakes.rate_limits`): a
  call over them gets 429 with ``retry-after`` and does not consume the script;
  :meth:`FakeMessagesAPI.overload` answers the next calls 529 ``overloaded_error``. The times of
  the calls let through are in :attr:`FakeMessagesAPI.admitted`, the refusals are counted.

Everything is deterministic: message ids ``msg_fake_<n>``, request ids ``req_fake_<n>``, tool ids
``toolu_fake_<n>`` (when a reply does not name one), usage 100 in / 20 out unless given, and the
reply's model defaults to the request's model.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.rate_limits import FakeRateLimit

__all__ = [
    "FakeMessagesAPI",
    "RecordedRequest",
    "Reply",
    "MessageReply",
    "ErrorReply",
    "CutStreamReply",
    "StreamErrorReply",
    "DEFAULT_USAGE",
    "text_reply",
    "tool_use_reply",
    "reply",
    "error_reply",
    "cut_stream_reply",
    "stream_error_reply",
    "echo_responder",
    "last_user_text",
]

DEFAULT_USAGE: dict[str, int] = {
    "input_tokens": 100,
    "output_tokens": 20,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}

_MAX_CACHE_BREAKPOINTS = 4
_STATUS_PHRASES = {529: "Overloaded"}


# --------------------------------------------------------------------------------------------
# What was received


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request as the server received it."""

    method: str
    path: str  # without the query string
    headers: dict[str, str]  # lower-case names
    body: Any  # the parsed JSON body, or None when there was none (or it was not JSON)
    api_key: str | None  # the x-api-key value, else the ``authorization: Bearer`` token

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


# --------------------------------------------------------------------------------------------
# What to answer


@dataclass(frozen=True)
class MessageReply:
    """A complete message: streamed as SSE or sent as JSON, as the request asks."""

    content: list[dict[str, Any]]
    stop_reason: str | None = "end_turn"
    usage: Mapping[str, int] | None = None  # merged over DEFAULT_USAGE
    model: str | None = None  # None: the request's model
    stop_sequence: str | None = None
    delay_seconds: float = 0.0  # wait before answering (a model "thinking")


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error with the API's error body."""

    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class CutStreamReply:
    """A stream that stops after some text deltas, without ``message_delta``/``message_stop``."""

    text: str
    clean_eof: bool = False  # end the chunked body properly instead of dropping the connection


@dataclass(frozen=True)
class StreamErrorReply:
    """A stream that starts, then sends an ``error`` event (HTTP status stays 200)."""

    error_type: str = "overloaded_error"
    message: str = "Overloaded"
    text: str = ""  # text streamed before the error


Reply = MessageReply | ErrorReply | CutStreamReply | StreamErrorReply


def reply(
    content_blocks: list[dict[str, Any]],
    stop_reason: str | None,
    usage: Mapping[str, int] | None = None,
    model: str | None = None,
    *,
    stop_sequence: str | None = None,
    delay_seconds: float = 0.0,
) -> MessageReply:
    """Any message: ``text``, ``tool_use``, ``thinking`` or other blocks, any stop reason."""
    return MessageReply(
        content=[dict(block) for block in content_blocks],
        stop_reason=stop_reason,
        usage=dict(usage) if usage is not None else None,
        model=model,
        stop_sequence=stop_sequence,
        delay_seconds=delay_seconds,
    )


def text_reply(
    text: str,
    *,
    stop_reason: str | None = "end_turn",
    usage: Mapping[str, int] | None = None,
    model: str | None = None,
    delay_seconds: float = 0.0,
) -> MessageReply:
    """One text block."""
    return reply([{"type": "text", "text": text}], stop_reason, usage, model, delay_seconds=delay_seconds)


def tool_use_reply(
    command: str,
    *,
    text: str | None = None,
    tool_id: str | None = None,
    usage: Mapping[str, int] | None = None,
    model: str | None = None,
    delay_seconds: float = 0.0,
) -> MessageReply:
    """A ``bash`` tool call (after an optional text block), ``stop_reason`` ``tool_use``.

    Without ``tool_id`` the server assigns ``toolu_fake_<n>`` when it serves the reply.
    """
    blocks: list[dict[str, Any]] = []
    if text is not None:
        blocks.append({"type": "text", "text": text})
    blocks.append({"type": "tool_use", "id": tool_id, "name": "bash", "input": {"command": command}})
    return reply(blocks, "tool_use", usage, model, delay_seconds=delay_seconds)


def error_reply(
    status: int, error_type: str, message: str, *, headers: Mapping[str, str] | None = None
) -> ErrorReply:
    """An HTTP error with the API's body.

    E.g. ``(429, "rate_limit_error", ...)``, ``(500, "api_error", ...)``, ``(529, "overloaded_error", ...)``.

    Add ``headers={"retry-after-ms": "1"}`` to have the SDK retry at once (see the module doc).
    """
    return ErrorReply(
        status=status, error_type=error_type, message=message, headers=dict(headers) if headers else None
    )


def cut_stream_reply(text: str, *, clean_eof: bool = False) -> CutStreamReply:
    """A streaming reply cut short after some ``content_block_delta`` events (see the module doc)."""
    return CutStreamReply(text=text, clean_eof=clean_eof)


def stream_error_reply(
    error_type: str = "overloaded_error", message: str = "Overloaded", *, text: str = ""
) -> StreamErrorReply:
    """A stream that fails with an ``error`` event after ``message_start`` (and ``text``, if any)."""
    return StreamErrorReply(error_type=error_type, message=message, text=text)


def last_user_text(body: Mapping[str, Any]) -> str:
    """The text of the last user message: its text blocks, else the text of its tool results."""
    for message in reversed(list(body.get("messages") or [])):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        blocks = [block for block in content or [] if isinstance(block, dict)]
        texts = [str(block.get("text", "")) for block in blocks if block.get("type") == "text"]
        if texts:
            return "\n".join(texts)
        results = []
        for block in blocks:
            if block.get("type") != "tool_result":
                continue
            inner = block.get("content")
            if isinstance(inner, str):
                results.append(inner)
            elif isinstance(inner, list):
                results.extend(
                    str(part.get("text", ""))
                    for part in inner
                    if isinstance(part, dict) and part.get("type") == "text"
                )
        return "\n".join(results)
    return ""


def echo_responder(body: dict[str, Any]) -> Reply:
    """The default answer: ``end_turn`` with ``Echo: <last user text>``."""
    return text_reply(f"Echo: {last_user_text(body)}")


# --------------------------------------------------------------------------------------------
# The server


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a keep-alive connection left open by a client must not block stop()
    allow_reuse_address = True
    api: FakeMessagesAPI

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (a cut stream, a closed pool) are normal here, not worth a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    # Small SSE writes must not wait for the client's delayed ACK (Nagle): about 40 ms a reply.
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"  # keep-alive and chunked bodies, as the SDK's client expects
    timeout = 60  # an idle keep-alive connection's thread ends after this
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # keep test output clean

    def _dispatch(self) -> None:
        self.server.api._handle(self)

    do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = _dispatch


class FakeMessagesAPI:
    """The Messages API on ``127.0.0.1``; see the module docstring. Thread-safe.

    ``with FakeMessagesAPI() as api:`` starts and stops it; point a client at ``api.base_url``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._script: deque[Reply] = deque()
        self._responder: Callable[[dict[str, Any]], Reply] | None = None
        self._accepted_keys: frozenset[str] | None = None
        self._counters = {"msg": 0, "req": 0, "toolu": 0}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.base_url: str = ""
        self.requests: list[RecordedRequest] = []
        # Exceptions raised by the responder; each was answered with a 500 the SDK does not retry.
        self.responder_errors: list[BaseException] = []
        self._rate_limit: FakeRateLimit | None = None
        self._overloads: list[Mapping[str, str]] = []  # the next calls' 529s (their headers)
        self.admitted: list[float] = []  # time.monotonic() of each message call answered
        self.throttled = 0  # 429s sent by the rate limit
        self.overloaded = 0  # 529s sent by `overload`

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeMessagesAPI:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.api = self
        port = server.server_address[1]
        self._server = server
        self.base_url = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-anthropic-{port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> FakeMessagesAPI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- configuration -----------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue replies; each ``POST /v1/messages`` that passes auth and validation takes the next."""
        with self._lock:
            self._script.extend(replies)

    def set_responder(self, fn: Callable[[dict[str, Any]], Reply] | None) -> None:
        """What to answer when the script is empty (None: :func:`echo_responder`)."""
        with self._lock:
            self._responder = fn

    def accept_keys(self, keys: set[str] | None) -> None:
        """Only these ``x-api-key`` values are accepted (None: any non-empty key)."""
        with self._lock:
            self._accepted_keys = frozenset(keys) if keys is not None else None

    def rate_limit(self, limit: FakeRateLimit | None) -> None:
        """Enforce ``limit`` per key from now on (None: no limit)."""
        with self._lock:
            self._rate_limit = limit

    def overload(self, count: int = 1, *, retry_after: str | None = None) -> None:
        """Answer the next ``count`` message calls 529 ``overloaded_error``."""
        with self._lock:
            self._overloads.extend([{"retry-after": retry_after} if retry_after else {}] * count)

    def _refused(self, api_key: str, answer: Reply) -> ErrorReply | None:
        """A 529 owed, or a 429 when ``answer`` does not fit the key's rate limit."""
        with self._lock:
            if self._overloads:
                self.overloaded += 1
                return ErrorReply(529, "overloaded_error", "Overloaded", self._overloads.pop(0))
            limit = self._rate_limit
        if limit is not None and isinstance(answer, MessageReply):
            refusal = limit.admit(api_key, {**DEFAULT_USAGE, **(answer.usage or {})})
            if refusal is not None:
                with self._lock:
                    self.throttled += 1
                message = f"This request would exceed your rate limit ({refusal.limit})"
                return ErrorReply(429, "rate_limit_error", message, refusal.headers)
        with self._lock:
            self.admitted.append(time.monotonic())
        return None

    def reset(self) -> None:
        """Forget the script, the responder, the accepted keys, the requests and responder errors."""
        with self._lock:
            self._script.clear()
            self._responder = None
            self._accepted_keys = None
            self.requests.clear()
            self.responder_errors.clear()
            self._rate_limit = None
            self._overloads.clear()
            self.admitted.clear()
            self.throttled = self.overloaded = 0

    # -- inspection --------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Scripted replies not yet served."""
        with self._lock:
            return len(self._script)

    def message_requests(self) -> list[RecordedRequest]:
        """The ``POST /v1/messages`` requests received, in order."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path == "/v1/messages"]

    # -- serving -----------------------------------------------------------------------------

    def _next_id(self, kind: str) -> str:
        with self._lock:
            self._counters[kind] += 1
            return f"{kind}_fake_{self._counters[kind]:06d}"

    def _handle(self, handler: _Handler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length > 0 else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in handler.headers.items()}
        path = urlsplit(handler.path).path
        api_key = _api_key(headers)
        with self._lock:
            self.requests.append(
                RecordedRequest(
                    method=handler.command, path=path, headers=headers, body=body, api_key=api_key
                )
            )
            accepted = self._accepted_keys
        responder = _Responder(self, handler)

        if not api_key:
            return responder.error(ErrorReply(401, "authentication_error", "x-api-key header is required"))
        if accepted is not None and api_key not in accepted:
            return responder.error(ErrorReply(401, "authentication_error", "invalid x-api-key"))
        if handler.command == "POST" and path == "/v1/messages/count_tokens":
            if not isinstance(body, dict):
                return responder.error(ErrorReply(400, "invalid_request_error", "the body must be JSON"))
            chars = len(json.dumps([body.get("system"), body.get("messages"), body.get("tools")]))
            return responder.json(200, {"input_tokens": max(1, chars // 4)})
        if handler.command != "POST" or path != "/v1/messages":
            return responder.error(ErrorReply(404, "not_found_error", f"{handler.command} {path} not found"))
        problem = _validate(body)
        if problem:
            return responder.error(ErrorReply(400, "invalid_request_error", problem))

        with self._lock:
            scripted = self._script.popleft() if self._script else None
            responder_fn = self._responder or echo_responder
        if scripted is not None:
            if (refused := self._refused(api_key, scripted)) is not None:
                with self._lock:
                    self._script.appendleft(scripted)  # a refused call consumes nothing
                return responder.error(refused)
            return responder.answer(scripted, body)
        try:
            answer = responder_fn(body)
        except Exception as error:  # a bug in a test's responder: say so instead of hanging up
            with self._lock:
                self.responder_errors.append(error)
            return responder.error(
                ErrorReply(
                    500,
                    "api_error",
                    f"the fake's responder failed: {error!r}",
                    headers={"x-should-retry": "false"},
                )
            )
        if (refused := self._refused(api_key, answer)) is not None:
            return responder.error(refused)
        responder.answer(answer, body)


def _api_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: ``x-api-key``, else the token of ``authorization: Bearer``.

    Both count because the API accepts both, and SDK 2.x sends ``api_key=`` as a Bearer token.
    """
    key = headers.get("x-api-key")
    if key:
        return key
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _validate(body: Any) -> str | None:
    """What the real API would refuse about the request's shape, or None."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return "max_tokens: must be an integer of at least 1"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    breakpoints = 0
    for tool in body.get("tools") or []:
        breakpoints += isinstance(tool, dict) and "cache_control" in tool
    system = body.get("system")
    if isinstance(system, list):
        for block in system:
            breakpoints += isinstance(block, dict) and "cache_control" in block
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{index}.role: must be 'user' or 'assistant'"
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            return f"messages.{index}.content: must be a string or a list of blocks"
        for position, block in enumerate(content):
            if not isinstance(block, dict) or "type" not in block:
                return f"messages.{index}.content.{position}: must be a content block"
            if block["type"] == "text" and not block.get("text"):
                return "messages: text content blocks must be non-empty"
            breakpoints += "cache_control" in block
    if breakpoints > _MAX_CACHE_BREAKPOINTS:
        return (
            f"A maximum of {_MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {breakpoints}."
        )
    return None


def _pieces(text: str, parts: int = 3) -> list[str]:
    """``text`` in up to ``parts`` non-empty pieces, so the client has to join deltas."""
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _sse(event: str, payload: Mapping[str, Any]) -> tuple[str, bytes]:
    """One Server-Sent Event: its name (to pick events by) and its bytes on the wire."""
    return event, f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode()


class _Responder:
    """Writes one reply onto one HTTP exchange."""

    def __init__(self, api: FakeMessagesAPI, handler: _Handler):
        self.api = api
        self.handler = handler

    def _status(self, status: int, headers: Mapping[str, str]) -> None:
        self.handler.send_response(status, _STATUS_PHRASES.get(status))
        self.handler.send_header("request-id", self.api._next_id("req"))
        for name, value in headers.items():
            self.handler.send_header(name, value)
        self.handler.end_headers()

    def json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._status(
            status, {"content-type": "application/json", "content-length": str(len(data)), **(headers or {})}
        )
        self.handler.wfile.write(data)

    def error(self, error: ErrorReply) -> None:
        body = {"type": "error", "error": {"type": error.error_type, "message": error.message}}
        self.json(error.status, body, error.headers)

    def answer(self, answer: Reply, body: dict[str, Any]) -> None:
        stream = bool(body.get("stream"))
        if isinstance(answer, ErrorReply):
            return self.error(answer)
        if isinstance(answer, CutStreamReply):
            return self._cut(answer, body, stream)
        if isinstance(answer, StreamErrorReply):
            return self._stream_error(answer, body)
        if not isinstance(answer, MessageReply):
            raise TypeError(f"not a reply: {answer!r}")
        if answer.delay_seconds > 0:
            time.sleep(answer.delay_seconds)
        message = self._message(answer, body)
        if stream:
            self._start_stream()
            self._chunk(b"".join(data for _, data in _message_events(message)))
            self._end_stream()
        else:
            self.json(200, message)

    def _message(self, answer: MessageReply, body: dict[str, Any]) -> dict[str, Any]:
        content = []
        for block in answer.content:
            block = dict(block)
            if block.get("type") == "tool_use" and not block.get("id"):
                block["id"] = self.api._next_id("toolu")
            content.append(block)
        return {
            "id": self.api._next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": answer.model or body.get("model"),
            "content": content,
            "stop_reason": answer.stop_reason,
            "stop_sequence": answer.stop_sequence,
            "usage": {**DEFAULT_USAGE, **(answer.usage or {})},
        }

    # -- streaming ---------------------------------------------------------------------------

    def _start_stream(self, *, closing: bool = False) -> None:
        headers = {
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
            "transfer-encoding": "chunked",
        }
        if closing:
            # Say so up front: a client must not pool a connection the server is about to close,
            # or its next request fails on the dead socket and counts as one more attempt.
            headers["connection"] = "close"
        self._status(200, headers)

    def _chunk(self, data: bytes) -> None:
        if data:
            self.handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.handler.wfile.flush()

    def _end_stream(self) -> None:
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()

    def _drop_connection(self) -> None:
        """Close mid-body: the client sees an incomplete chunked (or short) body."""
        self.handler.close_connection = True
        try:
            self.handler.wfile.flush()
            self.handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _cut(self, answer: CutStreamReply, body: dict[str, Any], stream: bool) -> None:
        message = self._message(MessageReply(content=[{"type": "text", "text": answer.text}]), body)
        if not stream:
            data = json.dumps(message).encode()
            self._status(200, {"content-type": "application/json", "content-length": str(len(data))})
            self.handler.wfile.write(data[: len(data) // 2])
            return self._drop_connection()
        self._start_stream(closing=answer.clean_eof)
        events = _message_events(message)
        # message_start, ping, content_block_start, then the text deltas; never content_block_stop,
        # message_delta or message_stop.
        self._chunk(
            b"".join(
                data
                for name, data in events
                if name not in ("content_block_stop", "message_delta", "message_stop")
            )
        )
        if answer.clean_eof:
            self._end_stream()
            self.handler.close_connection = True
        else:
            self._drop_connection()

    def _stream_error(self, answer: StreamErrorReply, body: dict[str, Any]) -> None:
        message = self._message(MessageReply(content=[{"type": "text", "text": answer.text}]), body)
        if not answer.text:
            message["content"] = []
        self._start_stream()
        events = [
            data for name, data in _message_events(message) if name not in ("message_delta", "message_stop")
        ]
        error = {"type": "error", "error": {"type": answer.error_type, "message": answer.message}}
        self._chunk(b"".join(events) + _sse("error", error)[1])
        self._end_stream()


def _message_events(message: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The SSE events the API sends for ``message``, in order."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": min(1, usage.get("output_tokens", 0))},
    }
    events = [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        kind = block.get("type")
        if kind == "text":
            initial: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block.get("text", ""))]
        elif kind == "tool_use":
            initial = {"type": "tool_use", "id": block["id"], "name": block.get("name"), "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": piece}
                for piece in _pieces(json.dumps(block.get("input", {})))
            ]
        elif kind == "thinking":
            initial = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": piece} for piece in _pieces(block.get("thinking", ""))
            ]
            if block.get("signature"):
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            initial, deltas = dict(block), []
        events.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": initial},
            )
        )
        events.extend(
            _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            for delta in deltas
        )
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                "usage": dict(usage),
            },
        )
    )
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events
