"""The end events a restarted control plane owes: ends it wrote but recorded no delivery for.

A run's end is written to storage first and its delivery record a moment later, by a task; a
control plane that dies between the two leaves an end with no record, and the live path never
sees that change again (recovery notes each run's state as it is). So recovery compares instead:
every run and group that ended while a Webhook was subscribed, and of which the Webhook holds no
record, is an event owed now. Only ends are caught up: they happen once for a resource, so
"no record of this uid and event type" says exactly what is missing. A wait for a person is not
(a keep-alive run waits many times, and a wait the run has left is no longer news).

"While subscribed" is from the Webhook's ``status.subscribedSince`` (its creation, or its last
change of spec: an end that came while it was paused, or before it asked for that event type,
was never owed). Records are pruned to `KEPT_FINISHED` a Webhook; when that many are kept, ends
older than the oldest record may have had a record that is gone, so those are not owed again.

Pure: resources and records in, events out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from nodus_ray.store.timestamps import parse_timestamp
from nodus_ray.webhooks.events import Event, group_event, run_event, subscribed
from nodus_ray.webhooks.records import KEPT_FINISHED, DeliveryRecord, DeliveryState

__all__ = ["missed_end_events", "subscribed_since"]

_END_TYPES = frozenset(
    {"run.succeeded", "run.failed", "run.cancelled", "group.succeeded", "group.failed", "group.cancelled"}
)


def subscribed_since(webhook: Mapping[str, Any]) -> str | None:
    """When the Webhook's current subscription began (a Webhook stored before this field: its
    creation)."""
    status = webhook.get("status") or {}
    return status.get("subscribedSince") or (webhook.get("metadata") or {}).get("creationTimestamp")


def missed_end_events(
    project: str,
    webhook: Mapping[str, Any],
    records: Iterable[DeliveryRecord],
    runs: Iterable[Mapping[str, Any]],
    groups: Iterable[Mapping[str, Any]],
) -> list[Event]:
    """The end events of ``project``'s runs and groups the Webhook is owed and has no record of."""
    spec = webhook.get("spec") or {}
    kept = list(records)
    horizon = _horizon(webhook, kept)
    if horizon is None or spec.get("paused"):
        return []
    if spec.get("group"):  # a group's Webhook: only that group's runs and the group itself
        runs = [run for run in runs if (run.get("spec") or {}).get("group") == spec["group"]]
        groups = [group for group in groups if (group.get("metadata") or {}).get("name") == spec["group"]]
    recorded = {_recorded(record) for record in kept}
    owed: list[Event] = []
    for uid, event in _ends(project, runs, groups, horizon):
        if subscribed(spec, event) and (uid, event.type) not in recorded:
            owed.append(event)
    return owed


def _horizon(webhook: Mapping[str, Any], records: list[DeliveryRecord]) -> datetime | None:
    since = _moment(subscribed_since(webhook))
    if since is None:
        return None
    finished = [r for r in records if r.state != DeliveryState.PENDING]
    created = [m for m in (_moment(r.createdAt) for r in records) if m is not None]
    if len(finished) >= KEPT_FINISHED and created:
        since = max(since, min(created))
    return since


def _ends(
    project: str, runs: Iterable[Mapping[str, Any]], groups: Iterable[Mapping[str, Any]], horizon: datetime
) -> Iterator[tuple[str, Event]]:
    """Each end at or after ``horizon`` with the uid of its resource: what names an end whatever
    write carried it (the event id hashes the write, which a later label change moves on)."""
    for run in runs:
        finished = _finished_at(run, horizon)
        if finished is not None:
            event = run_event(project, run, None, finished)
            if event is not None and event.type in _END_TYPES:
                yield _uid(run), event
    for group in groups:
        finished = _finished_at(group, horizon)
        if finished is not None:
            event = group_event(project, group, finished)
            if event is not None:
                yield _uid(group), event


def _finished_at(resource: Mapping[str, Any], horizon: datetime) -> str | None:
    """The resource's ``status.finishedAt`` if it is at or after ``horizon``."""
    finished = (resource.get("status") or {}).get("finishedAt")
    moment = _moment(finished)
    return finished if moment is not None and moment >= horizon else None


def _uid(resource: Mapping[str, Any]) -> str:
    return str((resource.get("metadata") or {}).get("uid") or "")


def _recorded(record: DeliveryRecord) -> tuple[str, str]:
    try:
        data = json.loads(record.body).get("data") or {}
    except ValueError:
        data = {}
    return (str(data.get("uid") or ""), record.eventType)


def _moment(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_timestamp(value)
    except ValueError:
        return None
