"""A run's events as server-sent events: its steps, turns, phase changes and answer, live.

``GET .../agentruns/NAME/events`` streams, in order:

* ``step``: a journal record (a step started, completed, failed, needs resolution...), never
  content (messages and command output stay in ``steps`` and ``answer``);
* ``egress``: a connection a command made through the egress proxy, after that command's
  ``step``: host, port, method, outcome (``allowed``, ``refused``, ``failed``), reason, bytes
  up and down, duration;
* ``phase``: the run's phase and reason changed;
* ``turn``: a turn began or ended (model, tokens, cost);
* ``answer``: the answer, in chunks (``{"offset", "text"}``), each time it is (re)written;
* ``end``: the run finished and everything was sent; the stream closes.

Every event's id is a cursor ``<next journal seq>.<resourceVersion sent>``; a client that
reconnects with ``Last-Event-ID`` gets the steps after the cursor and the status only if it
changed since, so nothing is lost and nothing sent twice. ``?follow=false`` sends what there is
and closes instead of waiting for more. The stream is fed by polling the control plane (every
half second, one call): the control plane stays the only place that reads storage.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from nodus.errors import Conflict
from nodus.lifecycle import RUN_TERMINAL_PHASES

__all__ = ["RunEventsSource", "parse_cursor", "run_events"]

_POLL_SECONDS = 0.5
_HEARTBEAT_SECONDS = 15.0
_ANSWER_CHUNK = 8192


class RunEventsSource(Protocol):
    """What the stream reads from the control plane (`ControlPlaneClient` is one)."""

    async def run_events(self, project: str, name: str, after_seq: int) -> dict[str, Any]: ...

    async def run_answer(self, project: str, name: str) -> dict[str, Any]: ...


def parse_cursor(last_event_id: str | None) -> tuple[int, int]:
    """``"12.7"`` -> (12, 7); a missing or foreign id starts from the beginning."""
    try:
        seq, _, version = (last_event_id or "").partition(".")
        return max(0, int(seq)), int(version)
    except ValueError:
        return 0, -1


def _event(kind: str, data: Any, cursor: tuple[int, int]) -> str:
    return f"id: {cursor[0]}.{cursor[1]}\nevent: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _turn_view(turn: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "index",
        "family",
        "model",
        "routing",
        "inputTokens",
        "outputTokens",
        "toolCalls",
        "costUSD",
        "stopReason",
        "startedAt",
        "finishedAt",
    )
    return {key: turn.get(key) for key in keys}


async def run_events(
    source: RunEventsSource, project: str, name: str, cursor: tuple[int, int], follow: bool = True
) -> AsyncIterator[str]:
    """The event stream of one run from ``cursor`` on (see the module)."""
    seq, version = cursor
    phase: tuple[Any, Any] | None = None
    turns: dict[int, Any] = {}
    answer_bytes: int | None = None
    last_sent = time.monotonic()
    while True:
        got = await source.run_events(project, name, seq)
        run, records = got["run"], got["records"]
        for record in records:
            seq = record["seq"] + 1
            connections = record.pop("egress", None) or []
            yield _event("step", record, (seq, version))
            for connection in connections:  # each connection the command made (`run_egress`)
                yield _event("egress", {"step": record["step"], **connection}, (seq, version))
        status = run.get("status") or {}
        current = int((run.get("metadata") or {}).get("resourceVersion") or 0)
        if current != version:
            version = current
            now_phase = (status.get("phase"), status.get("reason"))
            if now_phase != phase:
                phase = now_phase
                yield _event(
                    "phase",
                    {
                        "phase": now_phase[0],
                        "reason": now_phase[1],
                        "message": status.get("message"),
                        "resourceVersion": version,
                    },
                    (seq, version),
                )
            for turn in status.get("turns") or []:
                view = _turn_view(turn)
                if turns.get(view["index"]) != view:
                    turns[view["index"]] = view
                    yield _event("turn", view, (seq, version))
            size = (status.get("answer") or {}).get("bytes")
            if size is not None and size != answer_bytes:
                answer_bytes = size
                try:
                    text = (await source.run_answer(project, name))["answer"]
                except Conflict:
                    text = ""
                for offset in range(0, len(text), _ANSWER_CHUNK):
                    yield _event(
                        "answer",
                        {
                            "offset": offset,
                            "text": text[offset : offset + _ANSWER_CHUNK],
                            "final": offset + _ANSWER_CHUNK >= len(text),
                        },
                        (seq, version),
                    )
            last_sent = time.monotonic()
        if status.get("phase") in RUN_TERMINAL_PHASES and not records:
            yield _event(
                "end", {"phase": status.get("phase"), "reason": status.get("reason")}, (seq, version)
            )
            return
        if not follow and not records:
            return
        if records:
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent > _HEARTBEAT_SECONDS:
            yield ": still there\n\n"  # a comment: keeps proxies from closing an idle stream
            last_sent = time.monotonic()
        await asyncio.sleep(_POLL_SECONDS)
