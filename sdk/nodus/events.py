"""Reading a run's events stream (``GET .../agentruns/NAME/events``, server-sent events).

`follow_events` (sync, the CLI's ``agentrun logs -f``) and `afollow_events` (async,
`AgentRun.logs`) yield `RunEvent`s and reconnect by themselves with ``Last-Event-ID`` when the
connection drops (a server restart), so a follower sees every event once. `log_line` is how
the CLI and ``logs()`` print one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse, connect_sse

from .errors import Unavailable, error_from_response

__all__ = ["RunEvent", "follow_events", "afollow_events", "log_line"]

_RECONNECT_GRACE_SECONDS = 60.0
_RECONNECT_DELAY_SECONDS = 1.0
_STREAM_TIMEOUT = httpx.Timeout(30.0, connect=5.0, read=60.0)  # the server sends a heartbeat every 15 s


@dataclass(frozen=True)
class RunEvent:
    id: str
    kind: str  # step, phase, turn, answer, end
    data: dict[str, Any]


def _headers(last_event_id: str | None) -> dict[str, str]:
    headers = {"Accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    return headers


def _event(sse: ServerSentEvent) -> RunEvent:
    return RunEvent(sse.id, sse.event, json.loads(sse.data) if sse.data else {})


def _lost(since: float | None, exc: Exception) -> float:
    """When the connection was first lost; raises once it has been lost too long to resume."""
    since = since or time.monotonic()
    if time.monotonic() - since > _RECONNECT_GRACE_SECONDS:
        raise Unavailable(f"the events stream was lost and could not be resumed: {exc}") from None
    return since


def _check(response: httpx.Response) -> None:
    if response.is_success:
        return
    response.read()
    try:
        body = response.json()
    except ValueError:
        body = None
    raise error_from_response(response.status_code, body)


def follow_events(
    http: httpx.Client, path: str, *, follow: bool = True, last_event_id: str | None = None
) -> Iterator[RunEvent]:
    """The events at ``path``, reconnecting after a dropped connection; ends with the stream."""
    lost_since: float | None = None
    while True:
        try:
            with connect_sse(
                http,
                "GET",
                path,
                params={"follow": str(follow).lower()},
                headers=_headers(last_event_id),
                timeout=_STREAM_TIMEOUT,
            ) as source:
                _check(source.response)
                lost_since = None
                for sse in source.iter_sse():
                    last_event_id = sse.id or last_event_id
                    event = _event(sse)
                    yield event
                    if event.kind == "end":
                        return
                return  # the server closed a finished (or, without follow, caught-up) stream
        except httpx.TransportError as exc:
            lost_since = _lost(lost_since, exc)
            time.sleep(_RECONNECT_DELAY_SECONDS)


async def afollow_events(
    http: httpx.AsyncClient, path: str, *, follow: bool = True, last_event_id: str | None = None
) -> AsyncIterator[RunEvent]:
    """`follow_events` for asyncio."""
    lost_since: float | None = None
    while True:
        try:
            async with aconnect_sse(
                http,
                "GET",
                path,
                params={"follow": str(follow).lower()},
                headers=_headers(last_event_id),
                timeout=_STREAM_TIMEOUT,
            ) as source:
                if not source.response.is_success:
                    await source.response.aread()
                    _check(source.response)
                lost_since = None
                async for sse in source.aiter_sse():
                    last_event_id = sse.id or last_event_id
                    event = _event(sse)
                    yield event
                    if event.kind == "end":
                        return
                return
        except httpx.TransportError as exc:
            lost_since = _lost(lost_since, exc)
            await asyncio.sleep(_RECONNECT_DELAY_SECONDS)


def log_line(event: RunEvent) -> str | None:
    """One event as a log line; None for events a log does not show on their own."""
    data = event.data
    if event.kind == "step":
        at = str(data.get("at") or "")[11:19]
        summary = f"  {data['summary']}" if data.get("summary") else ""
        attempt = f" (attempt {data['attempt']})" if int(data.get("attempt") or 1) > 1 else ""
        return f"{at} {data.get('step')} {data.get('state')}{attempt}{summary}"
    if event.kind == "phase":
        reason = f" ({data['reason']})" if data.get("reason") else ""
        message = f": {data['message']}" if data.get("message") else ""
        return f"phase {data.get('phase')}{reason}{message}"
    if event.kind == "turn":
        if not data.get("finishedAt"):
            return f"turn {data.get('index')} on {data.get('model')} ({data.get('routing')})"
        return (
            f"turn {data.get('index')} done: {data.get('inputTokens')} in / {data.get('outputTokens')} out, "
            f"${data.get('costUSD')}"
        )
    if event.kind == "egress":
        reason = f" ({data['reason']})" if data.get("reason") else ""
        return (
            f"egress {data.get('method')} {data.get('host')}:{data.get('port')} {data.get('outcome')}{reason}, "
            f"{data.get('bytesUp')} B up / {data.get('bytesDown')} B down"
        )
    if event.kind == "answer":  # chunks of one answer: the first says so, the rest continue it
        return ("answer:\n" if not data.get("offset") else "") + str(data.get("text") or "")
    return None
