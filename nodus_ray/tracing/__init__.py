"""OpenTelemetry traces of runs: off unless an OTLP endpoint is set, and free when off.

A run actor whose `RunConfig.telemetry` is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` in the
environment of ``nodus up``, `attributes.telemetry_from_env`) exports one trace per run over
OTLP/HTTP: ``nodus.run`` (the root; ``nodus.run.resume`` under it for each later actor of the
run), ``nodus.turn`` per conversation turn, ``chat {model}`` per Messages API call (GenAI
semantic conventions), ``nodus.command`` per sandbox command, ``nodus.step`` per step of a
Python program, and ``nodus.journal.write`` per journal write (see docs/traces.md, decision 57).

Every function here is what the engine calls at those places. Off, each returns `NOOP` and
does nothing else: this module imports only the standard library and `attributes`, and the
OpenTelemetry SDK (`otel`) is imported by `configure` alone, the first time a run with tracing
on starts in the process (`tests/unit/test_tracing.py` checks that a run's imports hold no
``opentelemetry``; benchmarks/tracing_off.py measures what the calls cost).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from nodus_ray.tracing.attributes import (
    Telemetry,
    command_attributes,
    model_request_attributes,
    run_attributes,
)

if TYPE_CHECKING:
    from nodus_ray.tracing.otel import Tracing

__all__ = [
    "Span",
    "NOOP",
    "configure",
    "enabled",
    "flush",
    "traced_run",
    "turn",
    "traced_turn",
    "model_call",
    "command",
    "step",
    "journal_write",
]

T = TypeVar("T")

_tracing: Tracing | None = None


class Span(Protocol):
    """What a call site holds: a context manager (the span is the parent of what happens in
    it) with what the site can add. `NOOP` when tracing is off."""

    def __enter__(self) -> Span: ...

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def set(self, attributes: dict[str, Any]) -> None:
        """Plain attributes (a turn's family and model once routed)."""

    def reply(self, response: Any) -> None:
        """A model call's `ModelResponse`: response model, finish reason, token counts."""

    def result(self, result: Any) -> None:
        """A command's `CommandResult`: exit code, the limit that stopped it; never its output."""

    def failed(self, error: str) -> None:
        """What failed (a program step that raised): the span's status is an error."""


class _Noop:
    """Tracing off: every span is this one object, and every call on it does nothing."""

    __slots__ = ()

    def __enter__(self) -> _Noop:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def set(self, attributes: dict[str, Any]) -> None:
        return None

    def reply(self, response: Any) -> None:
        return None

    def result(self, result: Any) -> None:
        return None

    def failed(self, error: str) -> None:
        return None


NOOP: Span = _Noop()


def configure(telemetry: Telemetry) -> bool:
    """Start this process's tracer provider once, when ``telemetry`` turns tracing on."""
    global _tracing
    if _tracing is None and telemetry:
        from nodus_ray.tracing.otel import Tracing

        _tracing = Tracing(telemetry)
    return _tracing is not None


def enabled() -> bool:
    return _tracing is not None


def flush() -> None:
    """Export what is queued now (a run's end already does; for a process about to exit)."""
    if _tracing is not None:
        _tracing.flush()


def traced_run(config: Any, program: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """``program`` (a run actor's whole work on its run) inside the run's span, flushed at its
    end; ``program`` itself, untouched, when the run's `RunConfig.telemetry` is empty."""
    if not configure(config.telemetry):
        return program
    assert _tracing is not None
    attributes = run_attributes(
        project=config.project,
        name=config.name,
        uid=str(config.uid or ""),
        agent=config.agent,
        agent_revision=int(config.agent_revision),
        group=config.group,
        attempt=int(config.attempt),
        generation=int(config.generation),
        kind="program" if config.agent_spec.get("entrypoint") else "claude",  # `program.ends.is_program`
    )
    run: Coroutine[Any, Any, T] = _tracing.run(config, attributes, program)
    return run


def turn(index: int, *, replaying: bool) -> Span:
    """A conversation turn. Begun while the journal replays, its span opens only when something
    in it happens live (a replayed turn costs nothing)."""
    if _tracing is None:
        return NOOP
    attributes: dict[str, Any] = {"nodus.turn.index": index}
    if replaying:
        return _tracing.lazy("nodus.turn", {**attributes, "nodus.turn.resumed": True})
    return _tracing.node("nodus.turn", attributes)


def model_call(provider: str, model: str, max_tokens: int, step_id: str) -> Span:
    """One Messages API call, as it is made (``chat {model}``, GenAI conventions)."""
    if _tracing is None:
        return NOOP
    from opentelemetry.trace import SpanKind

    return _tracing.node(
        f"chat {model}", model_request_attributes(provider, model, max_tokens, step_id), kind=SpanKind.CLIENT
    )


def command(text: str, step_id: str) -> Span:
    """One sandbox command, as it runs; ``text`` is the command already redacted."""
    if _tracing is None:
        return NOOP
    return _tracing.node("nodus.command", command_attributes(text, step_id))


def step(name: str, step_id: str, effect: str) -> Span:
    """One step of a Python program, from its begin to its end (entered and left by hand)."""
    if _tracing is None:
        return NOOP
    return _tracing.node(
        "nodus.step", {"nodus.step.name": name, "nodus.step_id": step_id, "nodus.step.effect": effect}
    )


def journal_write(first_seq: int, records: int, step_id: str, state: str, backend: str) -> Span:
    """One durable journal write (one fsync'd append, or one object): ``records`` records."""
    if _tracing is None:
        return NOOP
    return _tracing.node(
        "nodus.journal.write",
        {
            "nodus.journal.first_seq": first_seq,
            "nodus.journal.records": records,
            "nodus.step_id": step_id,
            "nodus.journal.state": state,
            "nodus.journal.backend": backend,
        },
    )


def traced_turn(
    method: Callable[[Any, int, str], Coroutine[Any, Any, T]],
) -> Callable[[Any, int, str], Coroutine[Any, Any, T]]:
    """`Conversation._turn(index, prompt)` inside its turn's span (`turn`), decorated so the
    conversation loop keeps its shape; off, one await more per turn and nothing else."""

    @functools.wraps(method)
    async def in_span(conversation: Any, index: int, prompt: str) -> T:
        if _tracing is None:
            return await method(conversation, index, prompt)
        with turn(index, replaying=bool(conversation.steps.replaying)):
            return await method(conversation, index, prompt)

    return in_span
