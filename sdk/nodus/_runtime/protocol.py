"""The wire between a durable Python program (in its sandbox) and its run actor (in Ray).

The program is untrusted code: it runs inside the run's bubblewrap sandbox and reaches the
run actor only through one Unix socket bound into the sandbox (`SANDBOX_RUNTIME_SOCKET`). The
actor owns the journal; the program asks, the actor decides. Every request is one JSON object
on one line; the actor answers each request that expects an answer with one line, in order.
There is one request in flight at a time (the program's client holds a lock), so the order of
the lines is the order of the program's steps, which is what replay compares.

A step the program runs itself (a decorated function, ``ctx.step``) is two requests:

1. ``StepBegin`` -> the actor answers `Reply` with ``outcome``:
   - ``recorded``: the journal has the step's result (``value``) or its exception (``error``);
     the program returns or raises it without running the function.
   - ``execute``: run the function now, then send ``StepEnd`` (its JSON value) or
     ``StepFail`` (its exception); the actor answers ``ok`` once the result is journaled,
     except for the ``StepEnd`` of a ``pure`` or ``idempotent`` step, which it does not answer:
     the program goes on at once (the actor writes the record before it reads the next
     request, and a step whose record was lost runs again anyway), which saves a round trip.
2. Everything else (a model call, a timer, a message, children, outputs) is one request that
   the actor carries out as a journaled step of its own and answers with ``recorded`` (the
   step's value) — whether it ran now or was replayed makes no difference to the program.

Any request may be answered ``park`` (the run waits without a process: a timer, a message,
children, a person's resolution, the cost cap) or ``fatal`` (the run ends, e.g.
``NonDeterministic``): the program stops at once, without running any more of its code.
``replaying`` in every answer says whether the journal still holds steps ahead of this one;
while it is true the program's output is not shown again (it was shown the first time).

Log lines (`Log`) expect no answer. The program ends with `Return` (its JSON value) or
`Raise` (its exception and the tail of its traceback), which the actor answers ``ok``.

Kept free of pydantic on purpose: the program's side imports this on every start and every
step goes through it; the actor's side validates what it receives with `parse_request`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "SANDBOX_RUNTIME_DIR",
    "SANDBOX_RUNTIME_SOCKET",
    "SANDBOX_SOURCE_DIR",
    "SANDBOX_SITE_DIR",
    "SANDBOX_STATE_DIR",
    "ENV_SOCKET",
    "ENV_ENTRYPOINT",
    "MAX_LINE_BYTES",
    "Op",
    "Outcome",
    "ProtocolError",
    "Hello",
    "StepBegin",
    "StepEnd",
    "StepFail",
    "ModelCall",
    "Sleep",
    "WaitForMessage",
    "Spawn",
    "Gather",
    "ChildOutput",
    "Send",
    "SaveOutput",
    "ContinueAsNew",
    "Log",
    "Return",
    "Raise",
    "Request",
    "Reply",
    "ErrorInfo",
    "encode",
    "parse_request",
    "parse_reply",
]

# Inside the sandbox, under its private /tmp (the read-only host root has no other place for a
# mount point): the runtime directory, bound read-only, holds the socket and the Agent's source.
SANDBOX_RUNTIME_DIR = "/tmp/.nodus-runtime"
SANDBOX_RUNTIME_SOCKET = f"{SANDBOX_RUNTIME_DIR}/runtime.sock"
SANDBOX_SOURCE_DIR = f"{SANDBOX_RUNTIME_DIR}/source"
# In the workspace, so they persist with it (snapshots, node moves): what ``setup`` installs
# (``PIP_TARGET``, first on the program's ``sys.path``) and the program's ``ctx.state_dir``.
SANDBOX_SITE_DIR = "/tmp/workspace/.nodus/site-packages"
SANDBOX_STATE_DIR = "/tmp/workspace/state"

ENV_SOCKET = "NODUS_RUNTIME_SOCKET"
ENV_ENTRYPOINT = "NODUS_ENTRYPOINT"  # "module:function", e.g. "main:main"

# One line may carry a step's result or a whole Messages API request: bounded, so a program
# cannot make the actor buffer without end. A step result over this fails the run naming it.
MAX_LINE_BYTES = 8 << 20


class ProtocolError(ValueError):
    """A line that is not a request (or a reply) of this protocol; the actor fails the run."""


class Op(StrEnum):
    HELLO = "hello"
    STEP_BEGIN = "step.begin"
    STEP_END = "step.end"
    STEP_FAIL = "step.fail"
    MODEL = "model"
    SLEEP = "sleep"
    WAIT_FOR_MESSAGE = "wait_for_message"
    SPAWN = "spawn"
    GATHER = "gather"
    CHILD_OUTPUT = "child_output"
    SEND = "send"
    SAVE_OUTPUT = "save_output"
    CONTINUE_AS_NEW = "continue_as_new"
    LOG = "log"
    RETURN = "return"
    RAISE = "raise"


class Outcome(StrEnum):
    OK = "ok"
    RECORDED = "recorded"  # ``value`` (or ``error``) is the step's result
    EXECUTE = "execute"  # run the step's function now, then StepEnd / StepFail
    PARK = "park"  # the run waits without a process; stop now
    FATAL = "fatal"  # the run ends (``message`` says why); stop now


@dataclass(frozen=True)
class ErrorInfo:
    """An exception as the journal keeps it: replay raises ``module.qualname(message)`` again
    when that class can be imported and built from a message, else `nodus.errors.StepError`."""

    type: str  # qualified class name, "builtins.ValueError"
    message: str
    traceback: str = ""  # the tail of the traceback (a step's or the program's)

    @classmethod
    def from_dict(cls, data: Any) -> ErrorInfo:
        if not isinstance(data, dict):
            raise ProtocolError("error must be an object")
        return cls(
            type=_text(data.get("type"), "error.type", 256),
            message=_text(data.get("message", ""), "error.message", 64 << 10),
            traceback=_text(data.get("traceback", ""), "error.traceback", 64 << 10),
        )


# -- requests (program -> actor) ---------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The first line: which protocol the program speaks. Answered with the run's facts in
    ``value``: ``{"input", "run", "project", "idempotencyKey", "attempt"}``."""

    op: Op = Op.HELLO
    version: int = 1


@dataclass(frozen=True)
class StepBegin:
    """``name`` is the step's name (the function's, or ``ctx.step``'s); the actor makes it the
    journal's step id ``{name}-{n}``, n counting that name's calls in the run, because the
    actor (trusted, and reading the requests in order) is what replay must agree with.
    ``effect`` is ``pure``, ``idempotent`` or ``external``."""

    name: str
    effect: str = "pure"
    op: Op = Op.STEP_BEGIN


@dataclass(frozen=True)
class StepEnd:
    name: str
    value: Any = None
    op: Op = Op.STEP_END


@dataclass(frozen=True)
class StepFail:
    name: str
    error: ErrorInfo = field(default_factory=lambda: ErrorInfo("builtins.Exception", ""))
    op: Op = Op.STEP_FAIL


@dataclass(frozen=True)
class ModelCall:
    """One Messages API request, as the official SDK sent it to ``ANTHROPIC_BASE_URL``; the
    value recorded is the Messages API response (a JSON object), or ``error`` an API error."""

    body: dict[str, Any]
    op: Op = Op.MODEL


@dataclass(frozen=True)
class Sleep:
    """``seconds`` from when the step first ran, or ``until`` (an RFC 3339 time)."""

    seconds: float | None = None
    until: str | None = None
    op: Op = Op.SLEEP


@dataclass(frozen=True)
class WaitForMessage:
    """Value: the message's payload, or ``{"timedOut": true}`` wrapped as ``None`` by the program."""

    name: str
    timeout_seconds: float | None = None
    op: Op = Op.WAIT_FOR_MESSAGE


@dataclass(frozen=True)
class Spawn:
    """Create the child run ``<run>-<key>`` once; value: ``{"name": child run name}``."""

    input: Any
    key: str
    deadline: str | None = None
    op: Op = Op.SPAWN


@dataclass(frozen=True)
class Gather:
    """Wait for the children (run names); value: one ``{"ok": bool, "value"| "error"}`` each."""

    children: list[str]
    op: Op = Op.GATHER


@dataclass(frozen=True)
class ChildOutput:
    """A child's saved output; value: ``{"text": ...}`` or ``{"base64": ...}``."""

    child: str
    name: str
    op: Op = Op.CHILD_OUTPUT


@dataclass(frozen=True)
class Send:
    target: str
    name: str
    payload: Any = None
    op: Op = Op.SEND


@dataclass(frozen=True)
class SaveOutput:
    """``path`` relative to the workspace (or absolute under ``/tmp/workspace``)."""

    name: str
    path: str
    op: Op = Op.SAVE_OUTPUT


@dataclass(frozen=True)
class ContinueAsNew:
    input: Any = None
    op: Op = Op.CONTINUE_AS_NEW


@dataclass(frozen=True)
class Log:
    """Program output (``stream`` is ``stdout`` or ``stderr``); never answered."""

    text: str
    stream: str = "stdout"
    op: Op = Op.LOG


@dataclass(frozen=True)
class Return:
    value: Any = None
    op: Op = Op.RETURN


@dataclass(frozen=True)
class Raise:
    error: ErrorInfo = field(default_factory=lambda: ErrorInfo("builtins.Exception", ""))
    op: Op = Op.RAISE


Request = (
    Hello
    | StepBegin
    | StepEnd
    | StepFail
    | ModelCall
    | Sleep
    | WaitForMessage
    | Spawn
    | Gather
    | ChildOutput
    | Send
    | SaveOutput
    | ContinueAsNew
    | Log
    | Return
    | Raise
)

_REQUESTS: dict[Op, type[Any]] = {
    Op.HELLO: Hello,
    Op.STEP_BEGIN: StepBegin,
    Op.STEP_END: StepEnd,
    Op.STEP_FAIL: StepFail,
    Op.MODEL: ModelCall,
    Op.SLEEP: Sleep,
    Op.WAIT_FOR_MESSAGE: WaitForMessage,
    Op.SPAWN: Spawn,
    Op.GATHER: Gather,
    Op.CHILD_OUTPUT: ChildOutput,
    Op.SEND: Send,
    Op.SAVE_OUTPUT: SaveOutput,
    Op.CONTINUE_AS_NEW: ContinueAsNew,
    Op.LOG: Log,
    Op.RETURN: Return,
    Op.RAISE: Raise,
}


# -- replies (actor -> program) ----------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    outcome: Outcome
    value: Any = None
    error: ErrorInfo | None = None  # with RECORDED: the step raised this (raise it again)
    message: str = ""  # with PARK or FATAL: why, for the program's last words
    replaying: bool = False  # the journal holds more steps ahead: output is not shown again


def encode(message: Request | Reply) -> bytes:
    """One line of the protocol. Raises TypeError/ValueError for a value that is not JSON.

    Shallow on purpose (this is on every step's path): the fields hold JSON values as they
    are, but for an ErrorInfo; `asdict` would deep-copy a step's whole value first."""
    data = dict(message.__dict__)
    error = data.get("error")
    if error is None and isinstance(message, Reply):
        data.pop("error")
    elif isinstance(error, ErrorInfo):
        data["error"] = asdict(error)
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"


def _text(value: Any, where: str, limit: int) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{where} must be a string")
    if len(value) > limit:
        raise ProtocolError(f"{where} is longer than {limit} characters")
    return value


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"{where} must be a number")
    return float(value)


def _load(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"a line is over {MAX_LINE_BYTES} bytes")
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as bad:
        raise ProtocolError(f"not JSON: {bad}") from None
    if not isinstance(data, dict):
        raise ProtocolError("a line must be a JSON object")
    return data


def parse_request(line: bytes) -> Request:
    """A request from the (untrusted) program, checked field by field; ProtocolError if not one."""
    data = _load(line)
    try:
        op = Op(str(data.get("op")))
    except ValueError:
        raise ProtocolError(f"unknown op {str(data.get('op'))[:40]!r}") from None
    name_limit = 200
    match op:
        case Op.HELLO:
            version = data.get("version", 1)
            if not isinstance(version, int) or isinstance(version, bool):
                raise ProtocolError("version must be an integer")
            return Hello(version=version)
        case Op.STEP_BEGIN:
            effect = _text(data.get("effect", "pure"), "effect", 16)
            if effect not in ("pure", "idempotent", "external"):
                raise ProtocolError(f"effect must be pure, idempotent or external, not {effect!r}")
            return StepBegin(name=_text(data.get("name"), "name", name_limit), effect=effect)
        case Op.STEP_END:
            return StepEnd(name=_text(data.get("name"), "name", name_limit), value=data.get("value"))
        case Op.STEP_FAIL:
            return StepFail(
                name=_text(data.get("name"), "name", name_limit), error=ErrorInfo.from_dict(data.get("error"))
            )
        case Op.MODEL:
            body = data.get("body")
            if not isinstance(body, dict):
                raise ProtocolError("body must be a JSON object")
            return ModelCall(body=body)
        case Op.SLEEP:
            until = data.get("until")
            seconds = _number(data.get("seconds"), "seconds")
            if (seconds is None) == (until is None):
                raise ProtocolError("sleep takes exactly one of seconds and until")
            return Sleep(seconds=seconds, until=None if until is None else _text(until, "until", 64))
        case Op.WAIT_FOR_MESSAGE:
            return WaitForMessage(
                name=_text(data.get("name"), "name", name_limit),
                timeout_seconds=_number(data.get("timeout_seconds"), "timeout_seconds"),
            )
        case Op.SPAWN:
            deadline = data.get("deadline")
            return Spawn(
                input=data.get("input"),
                key=_text(data.get("key"), "key", 63),
                deadline=None if deadline is None else _text(deadline, "deadline", 64),
            )
        case Op.GATHER:
            children = data.get("children")
            if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
                raise ProtocolError("children must be a list of run names")
            return Gather(children=list(children))
        case Op.CHILD_OUTPUT:
            return ChildOutput(
                child=_text(data.get("child"), "child", name_limit), name=_text(data.get("name"), "name", 128)
            )
        case Op.SEND:
            return Send(
                target=_text(data.get("target"), "target", name_limit),
                name=_text(data.get("name"), "name", 128),
                payload=data.get("payload"),
            )
        case Op.SAVE_OUTPUT:
            return SaveOutput(
                name=_text(data.get("name"), "name", 128), path=_text(data.get("path"), "path", 4096)
            )
        case Op.CONTINUE_AS_NEW:
            return ContinueAsNew(input=data.get("input"))
        case Op.LOG:
            stream = _text(data.get("stream", "stdout"), "stream", 8)
            return Log(text=_text(data.get("text", ""), "text", MAX_LINE_BYTES), stream=stream)
        case Op.RETURN:
            return Return(value=data.get("value"))
        case Op.RAISE:
            return Raise(error=ErrorInfo.from_dict(data.get("error")))
    raise ProtocolError(f"unknown op {op!r}")  # pragma: no cover - every Op is matched above


def parse_reply(line: bytes) -> Reply:
    """The actor's answer (trusted, but checked: a bad one is a bug worth a clear message)."""
    data = _load(line)
    try:
        outcome = Outcome(str(data.get("outcome")))
    except ValueError:
        raise ProtocolError(f"unknown outcome {data.get('outcome')!r}") from None
    error = data.get("error")
    return Reply(
        outcome=outcome,
        value=data.get("value"),
        error=None if error is None else ErrorInfo.from_dict(error),
        message=str(data.get("message") or ""),
        replaying=bool(data.get("replaying")),
    )
