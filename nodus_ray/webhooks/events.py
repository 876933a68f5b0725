"""Which change of a run or group is an event, what its payload says, and which Webhooks get it.

Pure: a resource (as the registry holds it) in, an `Event` out. A run's change is an event when
it reaches a new state that a person may want to hear of: it finished (``run.succeeded``,
``run.failed``, ``run.cancelled``) or started to wait for a person (``run.waiting``: a decision
on an interrupted step, ``NeedsResolution``, or a message, ``AwaitingMessage``). A group's is
when it finished. The caller compares a run's state with the one it last saw (`run_state`), so a
progress report (a cost change) is no event and a keep-alive run that waits again after each
message is one event per wait.

The event's id is derived from the resource's uid and the write that made the change
(``resourceVersion`` of a run, ``finishedAt`` of a group): the same change gives the same id,
which is ``webhook-id`` for every retry (the receiver drops duplicates by it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodus.lifecycle import GroupPhase, RunPhase, RunReason
from nodus.schema_webhook import WebhookEvent

__all__ = [
    "Event",
    "WAITING_FOR_PERSON",
    "RunState",
    "run_state",
    "run_event",
    "group_event",
    "subscribed",
    "test_event",
    "TEST_EVENT",
]

TEST_EVENT = "webhook.test"

# The reasons of a Waiting run that need a person: an interrupted step to decide, a message.
WAITING_FOR_PERSON: frozenset[str] = frozenset({RunReason.NEEDS_RESOLUTION, RunReason.AWAITING_MESSAGE})

_RUN_ENDS = {
    RunPhase.SUCCEEDED: WebhookEvent.RUN_SUCCEEDED,
    RunPhase.FAILED: WebhookEvent.RUN_FAILED,
    RunPhase.CANCELLED: WebhookEvent.RUN_CANCELLED,
}
_GROUP_ENDS = {
    GroupPhase.SUCCEEDED: WebhookEvent.GROUP_SUCCEEDED,
    GroupPhase.FAILED: WebhookEvent.GROUP_FAILED,
    GroupPhase.CANCELLED: WebhookEvent.GROUP_CANCELLED,
}

RunState = tuple[str, str | None]  # (phase, reason)


@dataclass(frozen=True)
class Event:
    """One event: its id (``webhook-id``), type, project, the group it belongs to (a run's
    ``spec.group``, or the group itself), when it happened, and the JSON body sent."""

    id: str
    type: str  # a `WebhookEvent`, or ``webhook.test``
    project: str
    group: str | None
    timestamp: str
    body: bytes


def run_state(run: Mapping[str, Any]) -> RunState:
    status = run.get("status") or {}
    return (str(status.get("phase") or RunPhase.PENDING), status.get("reason"))


def _event_type_of_run(state: RunState) -> WebhookEvent | None:
    phase, reason = state
    if phase in _RUN_ENDS:
        return _RUN_ENDS[RunPhase(phase)]
    if phase == RunPhase.WAITING and reason in WAITING_FOR_PERSON:
        return WebhookEvent.RUN_WAITING
    return None


def _event_id(*parts: object) -> str:
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).hexdigest()
    return f"msg_{digest[:32]}"


def _body(event_type: WebhookEvent, timestamp: str, data: dict[str, Any]) -> bytes:
    document = {"type": event_type.value, "timestamp": timestamp, "data": data}
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def _cost(status: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    cost = status.get("cost") or {}
    return {field: cost[field] for field in fields if cost.get(field) is not None}


def run_event(project: str, run: Mapping[str, Any], previous: RunState | None, at: str) -> Event | None:
    """The event of a run that changed from ``previous`` to its current state, or None."""
    state = run_state(run)
    if state == previous:
        return None
    event_type = _event_type_of_run(state)
    if event_type is None:
        return None
    metadata, spec, status = run.get("metadata") or {}, run.get("spec") or {}, run.get("status") or {}
    data: dict[str, Any] = {
        "kind": "AgentRun",
        "project": project,
        "name": metadata.get("name"),
        "uid": metadata.get("uid"),
        "agent": spec.get("agent"),
        "group": spec.get("group"),
        "phase": state[0],
        "reason": state[1],
        "message": status.get("message"),
        "cost": _cost(status, ("totalUSD", "sandboxUSD", "billedUSD")),
        "createdAt": status.get("createdAt") or metadata.get("creationTimestamp"),
        "finishedAt": status.get("finishedAt"),
        "labels": metadata.get("labels") or {},
    }
    marker = metadata.get("resourceVersion") or at
    return Event(
        id=_event_id("run", metadata.get("uid"), marker, event_type.value),
        type=event_type.value,
        project=project,
        group=spec.get("group"),
        timestamp=at,
        body=_body(event_type, at, data),
    )


def group_event(project: str, group: Mapping[str, Any], at: str) -> Event | None:
    """The event of a group that has just finished, or None for any other phase."""
    metadata, spec, status = group.get("metadata") or {}, group.get("spec") or {}, group.get("status") or {}
    phase = status.get("phase")
    if phase not in _GROUP_ENDS:
        return None
    event_type = _GROUP_ENDS[GroupPhase(phase)]
    data: dict[str, Any] = {
        "kind": "AgentGroup",
        "project": project,
        "name": metadata.get("name"),
        "uid": metadata.get("uid"),
        "agent": spec.get("agent"),
        "phase": phase,
        "reason": status.get("reason"),
        "message": status.get("message"),
        "counts": dict(status.get("counts") or {}),
        "cost": _cost(status, ("totalUSD", "sandboxUSD", "gradingUSD")),
        "finishedAt": status.get("finishedAt"),
        "labels": metadata.get("labels") or {},
    }
    return Event(
        id=_event_id("group", metadata.get("uid"), status.get("finishedAt") or at, event_type.value),
        type=event_type.value,
        project=project,
        group=metadata.get("name"),
        timestamp=at,
        body=_body(event_type, at, data),
    )


def subscribed(spec: Mapping[str, Any], event: Event) -> bool:
    """Whether a Webhook of this spec gets the event: its type, its group (if it names one)."""
    if spec.get("paused"):
        return False
    if event.type not in (spec.get("events") or ()):
        return False
    return not spec.get("group") or spec["group"] == event.group


def test_event(project: str, webhook: str, nonce: str, at: str) -> Event:
    """A ``webhook.test`` event for `WebhookService.send_test`: proves the URL and the signature."""
    data = {"kind": "Webhook", "project": project, "name": webhook, "message": "a test event from nodus"}
    document = {"type": TEST_EVENT, "timestamp": at, "data": data}
    return Event(
        id=_event_id("test", project, webhook, nonce),
        type=TEST_EVENT,
        project=project,
        group=None,
        timestamp=at,
        body=json.dumps(document, separators=(",", ":"), sort_keys=True).encode(),
    )
