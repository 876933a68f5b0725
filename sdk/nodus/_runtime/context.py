"""`ProgramContext`: the ``ctx`` a durable entrypoint receives, over a request/answer transport.

The transport is the bootstrap's `RuntimeClient` in a sandbox, or `local`'s in-memory journal in
``Agent.local``: both answer the same protocol requests, so a program meets the same rules in
both (the same step names, the same JSON check of a step's result, the same errors replayed).

A step's value is what its JSON says, on the first run as on a replay (a tuple comes back a
list both times), so a program cannot behave differently once replayed. ``ctx.*`` inside a
running step raises: the step's recorded result already stands for everything the step did.
"""

from __future__ import annotations

import base64
import importlib
import json
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, Protocol

from ..durations import parse_timeout
from ..errors import AgentRunFailed, StepError, Unsupported
from ..handles import _run_failed
from .definition import check_effect
from .protocol import (
    MAX_LINE_BYTES,
    SANDBOX_STATE_DIR,
    ChildOutput,
    ContinueAsNew,
    ErrorInfo,
    Gather,
    Outcome,
    Reply,
    Request,
    SaveOutput,
    Send,
    Sleep,
    Spawn,
    StepBegin,
    StepEnd,
    StepFail,
    WaitForMessage,
)

__all__ = ["ProgramContext", "ChildRun", "Transport", "error_info", "rebuild_error", "traceback_tail"]

_TRACEBACK_LINES = 30
_TRACEBACK_CHARS = 8 << 10
_MESSAGE_CHARS = 32 << 10


class Transport(Protocol):
    """Where a context's requests go: the run actor's socket, or `local`'s in-memory journal."""

    def call(self, request: Request) -> Reply: ...

    def post(self, request: Request) -> None:
        """Send a request the actor does not answer (a pure or idempotent step's end)."""
        ...

    def fail(self, error: ErrorInfo, cause: BaseException | None = None) -> NoReturn:
        """End the run as failed with ``error`` (the program does not go on)."""
        ...

    def stop(self) -> NoReturn:
        """End this program now (after ``continue_as_new`` was journaled)."""
        ...


@dataclass(frozen=True)
class ChildRun:
    """A child run `ProgramContext.spawn` created: ``name`` is ``<run>-<key>``."""

    name: str
    key: str


def traceback_tail(exc: BaseException) -> str:
    """The last 30 lines (at most 8 KiB) of ``exc``'s traceback: where it went wrong."""
    lines = "".join(traceback.format_exception(exc)).splitlines()
    return "\n".join(lines[-_TRACEBACK_LINES:])[-_TRACEBACK_CHARS:]


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def error_info(exc: BaseException) -> ErrorInfo:
    return ErrorInfo(
        type=_type_name(type(exc))[:256], message=str(exc)[:_MESSAGE_CHARS], traceback=traceback_tail(exc)
    )


_REBUILT: dict[str, type[BaseException] | None] = {}


def _error_class(name: str) -> type[BaseException] | None:
    if name in _REBUILT:
        return _REBUILT[name]
    parts = name.split(".")
    found: type[BaseException] | None = None
    for cut in range(len(parts) - 1, 0, -1):  # "a.b.Outer.Inner": module a.b, then Outer.Inner
        module_name = ".".join(parts[:cut])
        try:
            target: Any = sys.modules.get(module_name) or importlib.import_module(module_name)
            for attribute in parts[cut:]:
                target = getattr(target, attribute)
        except Exception:  # noqa: BLE001 - not importable this way: try a shorter module
            continue
        if isinstance(target, type) and issubclass(target, Exception):
            found = target
        break
    _REBUILT[name] = found
    return found


def rebuild_error(info: ErrorInfo) -> Exception:
    """The recorded exception again: ``module.qualname(message)`` when that class imports and
    builds from one message, else `nodus.errors.StepError` naming the class."""
    cls = _error_class(info.type)
    error: Exception | None = None
    if cls is not None and cls is not StepError:
        try:
            built = cls(info.message)
            error = built if isinstance(built, Exception) else None
        except Exception:  # noqa: BLE001 - a class that needs more than a message
            error = None
    if error is None:
        error = StepError(info.type, info.message)
    if info.traceback:
        error.add_note(f"(replayed from the journal; the recorded traceback ends)\n{info.traceback}")
    return error


def _seconds(value: str | float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f"{what} takes a duration such as '10m' or a number of seconds, not {value!r}")
    seconds = parse_timeout(value) if isinstance(value, str) else float(value)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{what} takes a duration of 0 seconds or more, not {value!r}")
    return seconds


def _rfc3339(value: str) -> str:
    """``value`` checked as an RFC 3339 time with a zone, normalised to UTC (``...Z``)."""
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ValueError(
            f"sleep_until takes an RFC 3339 time with a zone such as 2026-01-01T09:00:00Z, not {value!r}"
        )
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _child_name(child: Any) -> str:
    name = child if isinstance(child, str) else getattr(child, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"a child is a handle from ctx.spawn (or its run name), not {child!r}")
    return name


class ProgramContext:
    """The ``RunContext`` of a durable program (see `nodus.agent_run.RunContext`)."""

    def __init__(self, transport: Transport, facts: dict[str, Any], *, state_dir: Path | None = None) -> None:
        self._transport = transport
        self.input: Any = facts.get("input")
        self.run = str(facts.get("run") or "")
        self.project = str(facts.get("project") or "")
        self.idempotency_key = str(facts.get("idempotencyKey") or "")
        self.attempt = int(facts.get("attempt") or 1)
        self._state_dir = Path(state_dir or SANDBOX_STATE_DIR)
        self._depth = 0  # > 0 while a step's function runs
        self._maps = 0

    # -- the Runtime protocol of `definition` (decorated steps) ---------------------------------

    @property
    def in_step(self) -> bool:
        return self._depth > 0

    @property
    def state_dir(self) -> Path:
        """A directory that persists across replays and node moves (in the workspace)."""
        self._state_dir.mkdir(parents=True, exist_ok=True)
        return self._state_dir

    def _call(self, request: Request) -> Any:
        reply = self._transport.call(request)
        if reply.error is not None:
            raise rebuild_error(reply.error)
        if reply.outcome is not Outcome.RECORDED and reply.outcome is not Outcome.OK:
            self._transport.fail(
                ErrorInfo(
                    "nodus.errors.NodusError", f"the run actor answered {reply.outcome} to {request.op}"
                )
            )
        return reply.value

    def _outside_step(self, what: str) -> None:
        if self._depth:
            raise RuntimeError(f"ctx.{what}() cannot be called inside a running step")

    def json_result(self, value: Any, what: str) -> Any:
        """``value`` as its JSON reads back; ends the run naming ``what`` ("step fetch_issue
        returned a value that", "the entrypoint's return value") if it is not JSON."""
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as bad:
            message = f"{what} is not JSON-serialisable: {type(bad).__name__}: {bad}"
            stack = "".join(traceback.format_stack()[-_TRACEBACK_LINES:])[-_TRACEBACK_CHARS:]
            self._transport.fail(ErrorInfo("builtins.TypeError", message, stack), bad)
        if len(text) > MAX_LINE_BYTES - (64 << 10):
            message = f"{what} is {len(text)} bytes of JSON, over the {MAX_LINE_BYTES >> 20} MiB a step keeps"
            self._transport.fail(ErrorInfo("builtins.ValueError", message))
        return json.loads(text)

    @staticmethod
    def _argument(value: Any, what: str) -> None:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as bad:
            raise TypeError(f"{what} must be JSON-serialisable: {bad}") from None

    def _begin(self, name: str, effect: str) -> Reply:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError("a step's name must be a non-empty string of at most 200 characters")
        reply = self._transport.call(StepBegin(name=name, effect=check_effect(effect)))
        if reply.outcome is Outcome.RECORDED and reply.error is not None:
            raise rebuild_error(reply.error)
        return reply

    def _failed(self, name: str, exc: Exception) -> None:
        self._transport.call(StepFail(name=name, error=error_info(exc)))

    def _end(self, name: str, value: Any, effect: str) -> None:
        """A step's value to the journal. An external step waits for the record (its effect is
        done and must not be repeated); a pure or idempotent one goes on at once: the actor
        reads requests in order, so the record is written before anything this program asks
        next, and were it lost with the actor, the step would simply run again."""
        end = StepEnd(name=name, value=value)
        if effect == "external":
            self._transport.call(end)
        else:
            self._transport.post(end)

    def run_step(self, name: str, fn: Callable[[], Any], effect: str) -> Any:
        if self._depth:
            return fn()
        reply = self._begin(name, effect)
        if reply.outcome is Outcome.RECORDED:
            return reply.value
        self._depth += 1
        try:
            value = fn()
        except Exception as exc:
            self._depth -= 1
            self._failed(name, exc)
            raise
        self._depth -= 1
        value = self.json_result(value, f"step {name} returned a value that")
        self._end(name, value, effect)
        return value

    async def run_step_async(self, name: str, fn: Callable[[], Awaitable[Any]], effect: str) -> Any:
        if self._depth:
            return await fn()
        reply = self._begin(name, effect)
        if reply.outcome is Outcome.RECORDED:
            return reply.value
        self._depth += 1
        try:
            value = await fn()
        except Exception as exc:
            self._depth -= 1
            self._failed(name, exc)
            raise
        self._depth -= 1
        value = self.json_result(value, f"step {name} returned a value that")
        self._end(name, value, effect)
        return value

    # -- RunContext -----------------------------------------------------------------------------

    def step(self, name: str, fn: Callable[[], Any], effect: str = "pure") -> Any:
        """Run ``fn()`` as the journaled step ``name`` (inside another step: a plain call)."""
        return self.run_step(name, fn, effect)

    def sleep(self, duration: str | float) -> None:
        """A durable timer: the run parks without a process until it is due."""
        self._outside_step("sleep")
        self._call(Sleep(seconds=_seconds(duration, "sleep")))

    def sleep_until(self, time: str) -> None:
        self._outside_step("sleep_until")
        self._call(Sleep(until=_rfc3339(time)))

    def wait_for_message(self, name: str, timeout: str | float | None = None) -> Any:
        """The next message ``name`` sent to this run (its payload), or None once ``timeout`` passed."""
        self._outside_step("wait_for_message")
        seconds = None if timeout is None else _seconds(timeout, "wait_for_message timeout")
        value = self._call(WaitForMessage(name=name, timeout_seconds=seconds))
        if isinstance(value, dict) and value.get("timedOut") is True and len(value) == 1:
            return None
        return value

    def send(self, target: str, name: str, payload: Any) -> None:
        """Deliver a message to another run of the project, once."""
        self._outside_step("send")
        self._argument(payload, "send payload")
        self._call(Send(target=_child_name(target), name=name, payload=payload))

    def spawn(self, input: Any, key: str, permissions: Any = None, deadline: str | None = None) -> ChildRun:
        """Create the child run ``<run>-<key>`` once (the key makes it idempotent across replays)."""
        self._outside_step("spawn")
        if permissions is not None:
            raise Unsupported(
                "ctx.spawn(permissions=...) is not supported: a child runs with its parent's agent",
                details={"field": "permissions"},
            )
        if not isinstance(key, str) or not key:
            raise ValueError("ctx.spawn takes a key, a non-empty string")
        if deadline is not None and not isinstance(deadline, str):
            raise TypeError("ctx.spawn deadline is a duration such as '1h' or an RFC 3339 time")
        self._argument(input, "ctx.spawn input")
        value = self._call(Spawn(input=input, key=key, deadline=deadline))
        return ChildRun(name=str((value or {}).get("name") or ""), key=key)

    def gather(self, children: list[Any], return_exceptions: bool = False) -> list[Any]:
        """Each child's result in order, waiting durably; a failed child is `AgentRunFailed`."""
        self._outside_step("gather")
        names = [_child_name(child) for child in children]
        if not names:
            return []
        results = self._call(Gather(children=names))
        out: list[Any] = []
        for name, result in zip(names, results or [], strict=True):
            if result.get("ok"):
                out.append(result.get("value"))
                continue
            failure = _child_failure(name, result.get("error"))
            if not return_exceptions:
                raise failure
            out.append(failure)
        return out

    def map(self, inputs: Iterable[Any]) -> list[Any]:
        """One child per input (keys ``map{n}-{i}``), then `gather`."""
        self._outside_step("map")
        self._maps += 1
        children = [self.spawn(item, f"map{self._maps}-{i}") for i, item in enumerate(inputs)]
        return self.gather(children)

    def child_output(self, child: Any, name: str) -> Any:
        """A child's saved output: its text, or bytes when it is not UTF-8."""
        self._outside_step("child_output")
        value = self._call(ChildOutput(child=_child_name(child), name=name)) or {}
        if "base64" in value:
            return base64.b64decode(value["base64"])
        return value.get("text")

    def save_output(self, name: str, path: str) -> None:
        """Store a workspace file as the run's output ``name``."""
        self._outside_step("save_output")
        self._call(SaveOutput(name=name, path=str(path)))

    def continue_as_new(self, input: Any) -> NoReturn:
        """Start a fresh journal of this run with ``input``; this program ends here."""
        self._outside_step("continue_as_new")
        self._argument(input, "continue_as_new input")
        self._call(ContinueAsNew(input=input))
        self._transport.stop()


def _child_failure(name: str, error: Any) -> AgentRunFailed:
    """A failed child as `gather` gives it: the actor's error is ``{"type", "message", "run",
    "phase", "reason"}`` with the whole story in ``message``; else its status's fields."""
    if isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error:
        details = {"name": name, "phase": error.get("phase"), "reason": error.get("reason")}
        return AgentRunFailed(
            f"agentrun/{error['message']}", details={**details, "message": error["message"]}
        )
    if isinstance(error, dict):
        return _run_failed(name, error)
    return _run_failed(name, {"phase": "Failed", "message": str(error or "")})
