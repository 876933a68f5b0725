"""What a step in progress is doing, and for how long: the steps listing's view of a Started step.

A step that has begun and not ended has only its ``Started`` record, whose payload says what it
is about to do: a command's text (redacted before it was journaled, `runtime.conversation`), a
model call's model and family, a program step's name (its id), a sleep's wake time, the message
an inbox waits for. `in_progress` turns that into the step's ``summary`` (a finished step's
summary says what it did; this one says what it does) and ``runningSince``, the time its current
attempt started; `running_time` adds ``runningSeconds`` for a run that is Running, so a parked
run's interrupted step is not said to run. Nothing here reads anything but the journal, and a
payload retention has deleted leaves a summary of the step's kind alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nodus_ray.store.timestamps import format_timestamp, parse_timestamp

if TYPE_CHECKING:
    from nodus_ray.durable.journal import JournalRecord

__all__ = ["activity", "in_progress", "running_time"]

_COUNTED = re.compile(r"-\d+$")  # a program step's id is its name and a count: fetch-2


def _text(value: Any) -> str:
    return " ".join(str(value).split()) if value is not None else ""


def activity(kind: str, step_id: str, detail: dict[str, Any]) -> str:
    """What a step of ``kind`` with its Started ``detail`` is doing, in a few words."""
    if kind == "command":
        command = _text(detail.get("command"))
        return f"$ {command}" if command else "running a command"
    if kind == "model":
        model, family = _text(detail.get("model")), _text(detail.get("family"))
        if model and family and family not in model:
            return f"calling {model} ({family})"
        return f"calling {model}" if model else "calling the model"
    if kind == "step":
        return f"step {_COUNTED.sub('', step_id.rsplit('/', 1)[-1])}"
    if kind == "sleep":
        wake = _text(detail.get("wakeAt"))
        return f"sleeping until {wake}" if wake else "sleeping"
    if kind == "inbox":
        name = _text(detail.get("message"))
        return f"waiting for message {name!r}" if name else "waiting for a message"
    if kind == "route":
        return "choosing the model"
    if kind == "sandbox":
        return "opening the sandbox"
    return kind


def in_progress(views: list[dict[str, Any]], records: Iterable[JournalRecord]) -> list[dict[str, Any]]:
    """``views`` (`journal.step_views`) with each Started step's summary and ``runningSince``."""
    since: dict[str, datetime | None] = {}
    for record in records:
        if record.state == "Started":
            since[record.step_id] = record.at
    for view in views:
        if view.get("state") != "Started":
            continue
        detail = view.get("detail") if isinstance(view.get("detail"), dict) else {}
        view["summary"] = activity(str(view.get("kind") or ""), str(view.get("id") or ""), detail or {})
        moment = since.get(str(view.get("id")))
        view["runningSince"] = format_timestamp(moment) if moment else view.get("startedAt")
    return views


def running_time(views: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """Each Started step's ``runningSeconds`` at ``now`` (whole seconds, never negative)."""
    for view in views:
        since = view.get("runningSince")
        if view.get("state") == "Started" and since:
            try:
                seconds = (now - parse_timestamp(str(since))).total_seconds()
            except ValueError:
                continue
            view["runningSeconds"] = max(0, int(seconds))
    return views
