"""The program's end of the runtime socket: one request in flight, and a stop the program can't catch.

Every journaled step goes through `RuntimeClient.call`, so it is kept to a raw socket, one
``json.dumps`` and one ``readline``. A ``park`` or ``fatal`` answer, on whichever thread it
arrives (the main thread's steps, the model relay's threads), ends the process right there with
`os._exit` after flushing the program's output: the actor already journaled the outcome and
kills the sandbox process anyway, and no ``except Exception`` (nor ``finally``) in the user's
code gets to run more of the program.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import NoReturn

from .protocol import (
    MAX_LINE_BYTES,
    ErrorInfo,
    Log,
    Outcome,
    ProtocolError,
    Raise,
    Reply,
    Request,
    parse_reply,
)

__all__ = ["RuntimeClient", "EXIT_PARKED", "EXIT_FATAL", "EXIT_LOST", "EXIT_RAISED"]

EXIT_PARKED = 0  # the run waits (a timer, a message, children); the actor knows
EXIT_RAISED = 1  # the program raised; `Raise` was journaled
EXIT_FATAL = 3  # the actor ended the run (NonDeterministic, ...)
EXIT_LOST = 4  # the socket closed under the program: the actor is gone

_LOG_CHUNK = 64 << 10  # a long log line goes in pieces, each far under MAX_LINE_BYTES


def _dumps(request: Request) -> bytes:
    # Shallow: the dataclasses hold JSON values as they are, except an ErrorInfo; asdict would
    # deep-copy a step's whole value first.
    data = dict(request.__dict__)
    error = data.get("error")
    if isinstance(error, ErrorInfo):
        data["error"] = asdict(error)
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"


class RuntimeClient:
    """Requests to the run actor over the Unix socket ``path`` (``NODUS_RUNTIME_SOCKET``)."""

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._rfile = self._sock.makefile("rb")
        self._lock = threading.RLock()
        self.replaying = False  # from the latest reply: output now is output shown before
        self._flushers: list[Callable[[], None]] = []

    def on_exit(self, flush: Callable[[], None]) -> None:
        """Run ``flush`` (best effort) before the process ends on a park or fatal answer."""
        self._flushers.append(flush)

    def call(self, request: Request) -> Reply:
        """Send ``request``, return the actor's answer; never returns for park or fatal.

        Raises TypeError/ValueError (before anything is sent) for a request that is not JSON."""
        line = _dumps(request)
        with self._lock:
            self._sock.sendall(line)
            answer = self._rfile.readline(MAX_LINE_BYTES + 1)
            if not answer:
                self.exit(EXIT_LOST)
            try:
                reply = parse_reply(answer)
            except ProtocolError as bad:
                self._last_words(f"nodus: a bad answer from the run actor: {bad}")
                self.exit(EXIT_FATAL)
            self.replaying = reply.replaying
            if reply.outcome is Outcome.PARK:
                self.exit(EXIT_PARKED)
            if reply.outcome is Outcome.FATAL:
                self._last_words(f"nodus: the run ended: {reply.message}" if reply.message else "")
                self.exit(EXIT_FATAL)
            return reply

    def post(self, request: Request) -> None:
        """Send a request the actor does not answer (a pure or idempotent step's end). A lost
        actor shows at the next `call`, which finds the socket closed."""
        line = _dumps(request)
        with self._lock:
            try:
                self._sock.sendall(line)
            except OSError:
                self.exit(EXIT_LOST)

    def log(self, text: str, stream: str = "stdout") -> None:
        """Program output; fire-and-forget (the actor does not answer it)."""
        with self._lock:
            for start in range(0, max(len(text), 1), _LOG_CHUNK):
                try:
                    self._sock.sendall(_dumps(Log(text=text[start : start + _LOG_CHUNK], stream=stream)))
                except OSError:
                    return

    def fail(self, error: ErrorInfo) -> NoReturn:
        """End the program with ``error`` as the run's failure (`Raise`), then exit."""
        self.call(Raise(error=error))
        self.exit(EXIT_RAISED)

    def exit(self, code: int) -> NoReturn:
        """Flush the program's output and end the process now, whatever it was doing."""
        for flush in self._flushers:
            try:
                flush()
            except Exception:  # noqa: BLE001 - the process ends regardless
                pass
        os._exit(code)

    def _last_words(self, text: str) -> None:
        """A line on the process's own stderr (the sandbox's), for an end the protocol can't say."""
        stream = sys.__stderr__
        if text and stream is not None:
            try:
                stream.write(text + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass
