"""``python -m nodus._runtime.bootstrap``: what the sandbox runs to start a durable program.

1. Connect to the run actor (``NODUS_RUNTIME_SOCKET``) and say `Hello`; the answer is the
   run's facts (input, run, project, idempotencyKey, attempt) and whether it replays.
2. Put the Agent's source, then what ``setup`` installed, first on ``sys.path``; start the model
   relay and point ``ANTHROPIC_BASE_URL`` at it; send ``print`` output as `Log` lines, except
   while the program replays steps whose output was shown the first time.
3. Import the entrypoint's module (``NODUS_ENTRYPOINT``, ``module:function``) and call
   ``fn(ctx, input)`` (``asyncio.run`` for an ``async def``); send `Return` with its value or
   `Raise` with its exception and the traceback's tail, and exit.

A script that deploys and submits itself at module level (``agent.deploy()`` below the
functions) is imported up to that call (`definition.StopImport`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import io
import os
import sys
import threading
from types import ModuleType
from typing import Any, NoReturn

from . import definition
from .client import EXIT_FATAL, EXIT_PARKED, RuntimeClient
from .context import ProgramContext, error_info
from .protocol import (
    ENV_ENTRYPOINT,
    ENV_SOCKET,
    SANDBOX_RUNTIME_SOCKET,
    SANDBOX_SITE_DIR,
    SANDBOX_SOURCE_DIR,
    ErrorInfo,
    Hello,
    Outcome,
    Request,
    Return,
)
from .relay import ModelRelay

__all__ = ["main", "LogWriter"]


class LogWriter(io.TextIOBase):
    """``sys.stdout`` / ``sys.stderr`` of the program: whole lines as `Log` requests, none while
    the client replays (that output was shown when the steps first ran)."""

    def __init__(self, client: RuntimeClient, stream: str) -> None:
        super().__init__()
        self._client = client
        self._stream = stream
        self._buffer: list[str] = []
        self._lock = threading.Lock()
        self._bytes = _BytesWriter(self)  # one: a dropped one would flush a partial line as it goes

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def reconfigure(self, **_: Any) -> None:
        """What ``sys.stdout.reconfigure(...)`` does on a terminal; lines are lines here."""

    @property
    def buffer(self) -> _BytesWriter:
        """For code that writes bytes (``sys.stdout.buffer.write``): decoded as UTF-8."""
        return self._bytes

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            if "\n" not in text:
                self._buffer.append(text)
                return len(text)
            head, _, rest = text.rpartition("\n")
            line = "".join(self._buffer) + head + "\n"
            self._buffer = [rest] if rest else []
        if not self._client.replaying:
            self._client.log(line, self._stream)
        return len(text)

    def flush(self) -> None:
        if not self._lock.acquire(timeout=0.2):  # another thread is mid-write: leave its bytes
            return
        try:
            text, self._buffer = "".join(self._buffer), []
        finally:
            self._lock.release()
        if text and not self._client.replaying:
            self._client.log(text, self._stream)


class _BytesWriter(io.RawIOBase):
    def __init__(self, text: LogWriter) -> None:
        super().__init__()
        self._text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._text.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        self._text.flush()


def _import_program(module_name: str) -> ModuleType:
    """Import the entrypoint's module as ``module_name``; a client-side call at its module level
    (`definition.StopImport`) ends the import there, keeping what was defined above it."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"the Agent's source has no module {module_name!r}", name=module_name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except definition.StopImport:
        pass
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _entrypoint(ref: str) -> Any:
    module_name, _, function = ref.partition(":")
    if not module_name or not function:
        raise ValueError(f"{ENV_ENTRYPOINT} must be module:function, not {ref!r}")
    definition.set_process_runtime(definition.active_runtime(), importing=True)
    try:
        module = _import_program(module_name)
    finally:
        definition.set_process_runtime(definition.active_runtime(), importing=False)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise AttributeError(f"module {module_name} has no function {function}")
    return fn


def _run(fn: Any, ctx: ProgramContext, value: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(ctx, value))
    result = fn(ctx, value)
    if inspect.iscoroutine(result):
        return asyncio.run(result)
    return result


class _Transport:
    """The context's transport: the client, with the bootstrap's way to end the program."""

    def __init__(self, client: RuntimeClient) -> None:
        self.client = client

    def call(self, request: Request) -> Any:
        return self.client.call(request)

    def post(self, request: Request) -> None:
        self.client.post(request)

    def fail(self, error: ErrorInfo, cause: BaseException | None = None) -> NoReturn:
        self.client.fail(error)

    def stop(self) -> NoReturn:
        self.client.exit(EXIT_PARKED)


def main() -> NoReturn:
    path = os.environ.get(ENV_SOCKET) or SANDBOX_RUNTIME_SOCKET
    try:
        client = RuntimeClient(path)
    except OSError as bad:
        sys.stderr.write(f"nodus: cannot reach the run actor at {path}: {bad}\n")
        os._exit(EXIT_FATAL)
    hello = client.call(Hello())
    if hello.outcome is not Outcome.OK and hello.outcome is not Outcome.RECORDED:
        client.exit(EXIT_FATAL)
    facts: dict[str, Any] = hello.value if isinstance(hello.value, dict) else {}

    # The Agent's own modules first (what the user wrote wins), then what ``setup`` installed.
    sys.path[:0] = [d for d in (SANDBOX_SOURCE_DIR, SANDBOX_SITE_DIR) if d not in sys.path]
    relay = ModelRelay(client.call, os.environ.get("ANTHROPIC_API_KEY", "")).start()
    os.environ["ANTHROPIC_BASE_URL"] = relay.base_url
    for proxy_env in ("NO_PROXY", "no_proxy"):  # an egress proxy must not carry the relay's calls
        current = os.environ.get(proxy_env, "")
        os.environ[proxy_env] = ",".join(p for p in (current, "127.0.0.1", "localhost") if p)

    stdout, stderr = LogWriter(client, "stdout"), LogWriter(client, "stderr")
    client.on_exit(stdout.flush)
    client.on_exit(stderr.flush)
    sys.stdout, sys.stderr = stdout, stderr

    transport = _Transport(client)
    ctx = ProgramContext(transport, facts)
    definition.set_process_runtime(ctx)
    try:
        fn = _entrypoint(os.environ.get(ENV_ENTRYPOINT, ""))
        value = _run(fn, ctx, ctx.input)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        stdout.flush()
        stderr.flush()
        client.fail(error_info(exc))
    value = ctx.json_result(value, "the entrypoint's return value")
    stdout.flush()
    stderr.flush()
    client.call(Return(value=value))
    client.exit(0)


if __name__ == "__main__":
    main()
