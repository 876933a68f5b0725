"""The OpenTelemetry SDK behind `nodus_ray.tracing`, loaded only when tracing is on.

A `Tracing` is one process's tracer provider: a batch span processor and the OTLP/HTTP
(protobuf) exporter, both configured by the standard ``OTEL_*`` variables the run was given
(`attributes.telemetry_from_env`). Spans are nested by a context variable of our own
(`_parent`), not by OpenTelemetry's current context, for two reasons:

* A turn that starts while the journal is still replaying may have nothing live in it (a
  keep-alive run's next actor replays every earlier turn): its span is opened only when
  something in it happens now (a model call, a command, a journal write), with the turn's
  start time, so replayed turns cost no spans and the trace shows each turn once.
* The run's span is the parent of last resort (`_Tracing.default`): a Python program's
  requests are served by a connection task whose context does not descend from the run's.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from nodus_ray.tracing.attributes import (
    Telemetry,
    command_result_attributes,
    model_response_attributes,
    root_span_id_of,
    trace_id_of,
)

__all__ = ["Tracing", "Node"]

_FLUSH_MILLIS = 5000
# (trace id, span id) the next span created in this context takes: the run's root span.
_fixed: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "nodus_trace_ids", default=None
)
_parent: contextvars.ContextVar[Node | None] = contextvars.ContextVar("nodus_trace_parent", default=None)


class _RunIds(RandomIdGenerator):
    """Random ids, except for the span being created under `_fixed` (a run's root)."""

    def generate_trace_id(self) -> int:
        fixed = _fixed.get()
        return fixed[0] if fixed is not None else super().generate_trace_id()

    def generate_span_id(self) -> int:
        fixed = _fixed.get()
        return fixed[1] if fixed is not None else super().generate_span_id()


class _Outcome(Protocol):
    phase: Any
    reason: str | None


class Node:
    """One span of ours: opened at once, or (``lazy``) when a child or an attribute needs it."""

    def __init__(
        self,
        tracing: Tracing,
        name: str,
        attributes: dict[str, Any],
        *,
        parent: Node | None,
        kind: SpanKind = SpanKind.INTERNAL,
        lazy: bool = False,
        fixed_ids: tuple[int, int] | None = None,
        remote: Context | None = None,
    ) -> None:
        self._tracing = tracing
        self._name = name
        self._attributes = attributes
        self._parent = parent
        self._kind = kind
        self._fixed_ids = fixed_ids
        self._remote = remote
        self._start = time.time_ns()
        self._span: trace.Span | None = None
        self._token: contextvars.Token[Node | None] | None = None
        self._ended = False
        if not lazy:
            self._open()

    def _open(self) -> trace.Span:
        if self._span is None:
            parent = self._parent.context() if self._parent is not None else self._remote
            token = _fixed.set(self._fixed_ids) if self._fixed_ids is not None else None
            try:
                self._span = self._tracing.tracer.start_span(
                    self._name,
                    context=parent if parent is not None else Context(),
                    kind=self._kind,
                    attributes=self._attributes,
                    start_time=self._start,
                )
            finally:
                if token is not None:
                    _fixed.reset(token)
        return self._span

    def context(self) -> Context:
        return trace.set_span_in_context(self._open())

    # -- what callers see (`nodus_ray.tracing.Span`) ---------------------------------------
    def __enter__(self) -> Node:
        self._token = _parent.set(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            try:
                _parent.reset(self._token)
            except ValueError:  # ended in another context than it began: nothing to restore
                pass
            self._token = None
        if error is not None and self._span is not None:
            self._span.set_attribute("nodus.stopped_by", type(error).__name__)
            if self._kind == SpanKind.CLIENT:  # a model call that failed
                self._span.set_attribute("error.type", str(getattr(error, "reason", type(error).__name__)))
                self._span.set_status(Status(StatusCode.ERROR, str(getattr(error, "reason", ""))))
        self.end()

    def set(self, attributes: dict[str, Any]) -> None:
        if self._span is None:
            self._attributes.update(attributes)  # carried by the span if it is ever opened
        else:
            self._span.set_attributes(attributes)

    def reply(self, response: Any) -> None:
        self._open().set_attributes(model_response_attributes(response.to_dict()))

    def result(self, result: Any) -> None:
        self._open().set_attributes(command_result_attributes(result.to_dict()))

    def outcome(self, outcome: _Outcome) -> None:
        span = self._open()
        phase = str(getattr(outcome.phase, "value", outcome.phase))
        span.set_attributes({"nodus.run.phase": phase, "nodus.run.reason": str(outcome.reason or "")})
        if phase == "Failed":
            span.set_status(Status(StatusCode.ERROR, str(outcome.reason or "")))

    def failed(self, error: str) -> None:
        span = self._open()
        span.set_attribute("nodus.error", error)
        span.set_status(Status(StatusCode.ERROR, error))

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._span is not None:  # a lazy span nothing needed was never opened: nothing to end
            self._span.end()


class Tracing:
    """One process's tracer provider and exporter; see the module docstring."""

    def __init__(self, telemetry: Telemetry) -> None:
        env = dict(telemetry)
        # The SDK reads its documented variables itself (endpoint, headers, timeout, sampler,
        # batch sizes, resource attributes): this process is given them like any setting. A
        # sandbox never sees them: its environment is cleared (`nodus_ray.sandbox`).
        os.environ.update(env)
        named = "OTEL_SERVICE_NAME" in env or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
        resource = Resource.create({} if named else {"service.name": "nodus"})
        self.provider = TracerProvider(resource=resource, id_generator=_RunIds())
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("nodus_ray")
        self.default: Node | None = None  # the run's span: the parent of last resort

    def node(self, name: str, attributes: dict[str, Any], *, kind: SpanKind = SpanKind.INTERNAL) -> Node:
        return Node(self, name, attributes, parent=_parent.get() or self.default, kind=kind)

    def lazy(self, name: str, attributes: dict[str, Any]) -> Node:
        return Node(self, name, attributes, parent=_parent.get() or self.default, lazy=True)

    async def run(self, config: Any, attributes: dict[str, Any], program: Coroutine[Any, Any, Any]) -> Any:
        """The run's span around ``program`` (one actor's share of the run), then a flush."""
        uid = str(config.uid or "")
        if uid and int(config.attempt) > 1:
            # A later actor of the run: under the root span the first actor wrote, same trace.
            root = SpanContext(
                trace_id_of(uid),
                root_span_id_of(uid),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            node = Node(
                self,
                "nodus.run.resume",
                attributes,
                parent=None,
                remote=trace.set_span_in_context(NonRecordingSpan(root)),
            )
        else:
            fixed = (trace_id_of(uid), root_span_id_of(uid)) if uid else None
            node = Node(self, "nodus.run", attributes, parent=None, fixed_ids=fixed)
        self.default = node
        try:
            with node:
                outcome = await program
                node.outcome(outcome)
                return outcome
        finally:
            self.default = None
            await asyncio.to_thread(self.flush)

    def flush(self) -> None:
        self.provider.force_flush(_FLUSH_MILLIS)
