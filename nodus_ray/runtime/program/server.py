"""The run actor's half of the program protocol: each request of the program, a journaled step.

The program (untrusted, in the sandbox) speaks `nodus._runtime.protocol` over one Unix
socket; `ProgramServer` reads its requests in order and answers each one from the journal
(`durable.steps.Steps`): a recorded step's result or error comes back without running
again, a new one is executed (by the program itself for ``StepBegin``, by the actor for
everything else) and journaled before the answer. The actor numbers the step ids, so a
program cannot address another step's record.

The server stops the program by answering ``park`` (the run waits without a process: a timer,
a message, children, a person, the cost cap) or ``fatal`` (the run ends: NonDeterministic, a
broken protocol); `ProgramServer.finished` then raises what stopped it, for the run actor to
turn into the run's outcome, exactly as it does for the Claude conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nodus._runtime import protocol as wire
from nodus.lifecycle import RunReason
from nodus_ray import tracing
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.steps import NeedsResolution, NonDeterministic, StepFailed, Steps
from nodus_ray.faults import crash_point
from nodus_ray.money.spend import BudgetExceeded, CapExceeded, CreditsExhausted
from nodus_ray.runtime.conversation import RunFailure
from nodus_ray.runtime.program.ends import ContinuedAsNew, Parked

__all__ = ["ContinuedAsNew", "Parked", "ProgramEnd", "ProgramOps", "ProgramServer", "error_info"]

logger = logging.getLogger(__name__)

# What stops the program with ``park``: the run waits (the actor turns each into its outcome).
_PARKING = (NeedsResolution, CapExceeded, CreditsExhausted, BudgetExceeded)


@dataclass(frozen=True)
class ProgramEnd:
    """The program ended by itself: `Return` (``value``) or `Raise` (``error``)."""

    value: Any = None
    error: wire.ErrorInfo | None = None


class ProgramOps(Protocol):
    """The requests the actor carries out itself, each as one journaled step (``step_id``).

    Each returns the value the program gets, raises `StepFailed` with a recorded error (the
    program raises it), `Parked` (or a `_PARKING` exception) to stop the program until later,
    or `RunFailure` to end the run.
    """

    async def model(self, step_id: str, request: wire.ModelCall) -> Any: ...

    async def sleep(self, step_id: str, request: wire.Sleep) -> Any: ...

    async def wait_for_message(self, step_id: str, request: wire.WaitForMessage) -> Any: ...

    async def spawn(self, step_id: str, request: wire.Spawn) -> Any: ...

    async def gather(self, step_id: str, request: wire.Gather) -> Any: ...

    async def child_output(self, step_id: str, request: wire.ChildOutput) -> Any: ...

    async def send(self, step_id: str, request: wire.Send) -> Any: ...

    async def save_output(self, step_id: str, request: wire.SaveOutput) -> Any: ...

    async def continue_as_new(self, step_id: str, request: wire.ContinueAsNew) -> Any:
        """Journal the request as the generation's last step, then switch (`ContinuedAsNew`)."""
        ...

    async def after_external(self, step_id: str) -> None:
        """An external step ended: the workspace is snapshotted (its effect is kept)."""
        ...

    def replayed(self, step_id: str) -> None:
        """A step nested in a replayed one (a model call inside a step) counts as replayed."""
        ...


def error_info(error: dict[str, Any]) -> wire.ErrorInfo:
    """A journaled error as the program raises it again."""
    return wire.ErrorInfo(
        type=str(error.get("type") or "nodus.errors.StepError"),
        message=str(error.get("message") or ""),
        traceback=str(error.get("traceback") or ""),
    )


def _error_dict(error: wire.ErrorInfo) -> dict[str, Any]:
    return {"type": error.type, "message": error.message, "traceback": error.traceback}


@dataclass
class _Open:
    """The program's step running now (between its ``execute`` and its StepEnd/StepFail)."""

    name: str
    step_id: str
    effect: str
    attempt: int
    calls: int = 0  # model calls made inside it
    span: tracing.Span = tracing.NOOP  # its ``nodus.step`` span, the parent of its model calls


class ProgramServer:
    """Serves one program's requests over `Steps`; see the module docstring.

    ``facts`` is the `Hello` reply's value (input, run, project, idempotencyKey, attempt);
    ``on_log`` receives what the program prints (only outside replay: the program drops the
    rest). `dispatch` answers one request without the socket (tests, the benchmark).
    """

    def __init__(
        self,
        steps: Steps,
        ops: ProgramOps,
        facts: dict[str, Any],
        *,
        on_log: Callable[[wire.Log], None] | None = None,
        redact: Redactor | None = None,
    ) -> None:
        self.steps = steps
        self.ops = ops
        self.facts = facts
        self.on_log = on_log
        # The run's secret values, masked in whatever the program hands over to be kept (a
        # step's value or exception, its return value, why it raised) before it is journaled
        # or stored, as command output is: neither storage nor status ever holds one.
        self.redact = redact or Redactor({})
        self._counts: dict[str, int] = {}
        self._open: _Open | None = None
        self._said_hello = False
        self._server: asyncio.AbstractServer | None = None
        self._finished: asyncio.Future[ProgramEnd] | None = None
        self._connected = False

    # -- the socket ----------------------------------------------------------------------
    async def start(self, path: Path) -> None:
        """Listen on ``path`` (made 0666: the sandbox's uid connects to it)."""
        self._finished = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_unix_server(
            self._serve_connection, path=str(path), limit=wire.MAX_LINE_BYTES + 2
        )
        path.chmod(0o666)

    async def finished(self) -> ProgramEnd:
        """The program's end, or raises what stopped it (`Parked`, `RunFailure`, ...)."""
        assert self._finished is not None, "start() first"
        return await asyncio.shield(self._finished)

    @property
    def done(self) -> bool:
        return self._finished is not None and self._finished.done()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self._finished is not None and not self._finished.done():
            self._finished.cancel()

    def _settle(self, end: ProgramEnd | None, stop: BaseException | None) -> None:
        if self._finished is None or self._finished.done():
            return
        if stop is not None:
            self._finished.set_exception(stop)
        else:
            assert end is not None
            self._finished.set_result(end)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connected:  # one program, one connection: nothing else may speak for it
            writer.close()
            return
        self._connected = True
        try:
            while not self.done:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    self._settle(
                        None, RunFailure(RunReason.PROGRAM_FAILED, "a request line is over its limit")
                    )
                    break
                if not line:
                    break  # the program closed its end: the process watch says how it ended
                reply = await self.handle(line)
                if reply is not None:
                    writer.write(wire.encode(reply))
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        except Exception as error:  # noqa: BLE001 - e.g. Fenced: the actor's finished() raises it
            self._settle(None, error)
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    # -- requests ------------------------------------------------------------------------
    async def handle(self, line: bytes) -> wire.Reply | None:
        """One request line -> its reply (None for a Log); a stop settles `finished`."""
        try:
            request = wire.parse_request(line)
        except wire.ProtocolError as bad:
            return self._fatal(RunFailure(RunReason.PROGRAM_FAILED, f"the program broke the protocol: {bad}"))
        return await self.dispatch(request)

    async def dispatch(self, request: wire.Request) -> wire.Reply | None:
        try:
            return await self._dispatch(request)
        except StepFailed as failed:
            return wire.Reply(
                wire.Outcome.RECORDED, error=error_info(failed.error), replaying=self._replaying()
            )
        except NonDeterministic as diverged:
            return self._fatal(RunFailure(diverged.reason, str(diverged)))
        except RunFailure as failure:
            return self._fatal(failure)
        except wire.ProtocolError as bad:
            return self._fatal(RunFailure(RunReason.PROGRAM_FAILED, f"the program broke the protocol: {bad}"))
        except (Parked, *_PARKING) as parked:
            self._settle(None, parked)
            return wire.Reply(wire.Outcome.PARK, message=str(parked))
        except ContinuedAsNew as switched:  # the program ends here; the actor runs the next one
            self._settle(None, switched)
            return wire.Reply(wire.Outcome.OK)

    def _redacted(self, error: wire.ErrorInfo) -> wire.ErrorInfo:
        return wire.ErrorInfo(error.type, self.redact(error.message), self.redact(error.traceback))

    def _fatal(self, failure: RunFailure) -> wire.Reply:
        self._settle(None, failure)
        return wire.Reply(wire.Outcome.FATAL, message=failure.message)

    def _replaying(self) -> bool:
        return self.steps.replaying

    def _next_id(self, name: str) -> str:
        n = self._counts.get(name, 0) + 1
        self._counts[name] = n
        return f"{name}-{n}"

    def _value(self, value: Any) -> wire.Reply:
        return wire.Reply(wire.Outcome.RECORDED, value=value, replaying=self._replaying())

    async def _dispatch(self, request: wire.Request) -> wire.Reply | None:
        if isinstance(request, wire.Log):
            if self.on_log is not None:
                self.on_log(request)
            return None
        if isinstance(request, wire.Hello):
            if request.version != 1:
                raise RunFailure(
                    RunReason.PROGRAM_FAILED, f"protocol version {request.version} is not served"
                )
            self._said_hello = True
            return wire.Reply(wire.Outcome.OK, value=self.facts, replaying=self._replaying())
        if not self._said_hello:
            raise wire.ProtocolError("the first request must be hello")
        if isinstance(request, wire.StepEnd | wire.StepFail):
            return await self._step_end(request)
        if self._open is not None:
            if isinstance(request, wire.ModelCall):
                # The SDK called inside a step (a framework's, or the user's own): a model step
                # of its own, nested under the step, so a replay of the whole step skips it.
                if self._open.calls == 0 and self._open.effect != "external":
                    await self.steps.mark_started(
                        self._open.step_id, "step", {"effect": self._open.effect}, attempt=self._open.attempt
                    )
                self._open.calls += 1
                return self._value(
                    await self.ops.model(f"{self._open.step_id}/model-{self._open.calls}", request)
                )
            if not isinstance(request, wire.Raise):
                raise wire.ProtocolError(f"step {self._open.step_id} has not ended")
            # The program gave up inside the step (its result is not JSON, or the process is
            # going down): the run fails with what it said; the step stays without an end.
        match request:
            case wire.StepBegin():
                return await self._step_begin(request)
            case wire.Return():
                self._settle(ProgramEnd(value=self.redact.tree(request.value)), None)
                return wire.Reply(wire.Outcome.OK)
            case wire.Raise():
                self._settle(ProgramEnd(error=self._redacted(request.error)), None)
                return wire.Reply(wire.Outcome.OK)
            case wire.ModelCall():
                return self._value(await self.ops.model(self._next_id("model"), request))
            case wire.Sleep():
                return self._value(await self.ops.sleep(self._next_id("sleep"), request))
            case wire.WaitForMessage():
                return self._value(
                    await self.ops.wait_for_message(self._next_id(f"message/{request.name}"), request)
                )
            case wire.Spawn():
                return self._value(await self.ops.spawn(f"spawn/{request.key}", request))
            case wire.Gather():
                return self._value(await self.ops.gather(self._next_id("gather"), request))
            case wire.ChildOutput():
                return self._value(await self.ops.child_output(self._next_id("child-output"), request))
            case wire.Send():
                return self._value(await self.ops.send(self._next_id("send"), request))
            case wire.SaveOutput():
                return self._value(
                    await self.ops.save_output(self._next_id(f"output/{request.name}"), request)
                )
            case wire.ContinueAsNew():
                return self._value(await self.ops.continue_as_new("continue-as-new", request))
        raise wire.ProtocolError(f"unexpected request {request.op}")

    async def _step_begin(self, request: wire.StepBegin) -> wire.Reply:
        step_id = self._next_id(request.name)
        effect = request.effect
        begun = await self.steps.begin(
            step_id,
            "step",
            effect="external" if effect == "external" else "pure" if effect == "pure" else "idempotent",
            started={"effect": effect} if effect == "external" else None,
            write_started=effect == "external",
        )
        if begun.recorded:
            for nested in begun.nested:  # its model calls: their charges and turns count again
                self.ops.replayed(nested)
            if begun.error is not None:
                return wire.Reply(
                    wire.Outcome.RECORDED, error=error_info(begun.error), replaying=self._replaying()
                )
            return self._value(begun.value)
        span = tracing.step(request.name, step_id, effect).__enter__()
        self._open = _Open(
            name=request.name, step_id=step_id, effect=effect, attempt=begun.attempt, span=span
        )
        return wire.Reply(wire.Outcome.EXECUTE, replaying=self._replaying())

    async def _step_end(self, request: wire.StepEnd | wire.StepFail) -> wire.Reply | None:
        running = self._open
        if running is None or running.name != request.name:
            raise wire.ProtocolError(f"step {request.name!r} ended but was not running")
        self._open = None
        if isinstance(request, wire.StepFail):
            running.span.failed(request.error.type)
        running.span.__exit__(None, None, None)
        if running.effect == "external":  # its effect is in the workspace: keep it before the end
            await self.ops.after_external(running.step_id)
        crash_point("step-effect-done", f"{self.steps.journal.prefix}/{running.step_id}")
        if isinstance(request, wire.StepFail):
            error = _error_dict(self._redacted(request.error))
            await self.steps.fail(running.step_id, "step", error, attempt=running.attempt)
        else:
            await self.steps.end(
                running.step_id,
                "step",
                self.redact.tree(request.value),
                attempt=running.attempt,
                summary=self.redact(_summary(request.value)),
            )
        if running.effect != "external" and isinstance(request, wire.StepEnd):
            return None  # the program went on already (`RunContext`'s step end of a pure step)
        return wire.Reply(wire.Outcome.OK, replaying=self._replaying())


def _summary(value: Any) -> str:
    """A short text of a step's result for ``steps`` (the whole result is in the journal)."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
