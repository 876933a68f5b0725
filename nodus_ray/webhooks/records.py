"""Delivery records: one storage object per event and Webhook, written before the first attempt
and after each one, so a restarted control plane finds what it still owes and the API can show
every attempt (``GET .../webhooks/{name}/deliveries``).

A record is named ``{ms:013d}-{event id}`` (its creation in milliseconds first, so the names sort
by age). The finished ones of a Webhook are kept up to `KEPT_FINISHED`, the oldest removed first;
a pending one is never removed but with its Webhook.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from nodus_ray.webhooks.events import Event

__all__ = ["DeliveryState", "Attempt", "DeliveryRecord", "DeliveryRecords", "KEPT_FINISHED"]

KEPT_FINISHED = 200


class DeliveryState(StrEnum):
    PENDING = "Pending"  # not delivered yet; ``nextAttemptAt`` says when it is tried
    DELIVERED = "Delivered"  # a 2xx answered
    FAILED = "Failed"  # every attempt of the schedule failed (or the Webhook's Secret is gone)


@dataclass
class Attempt:
    """One attempt: its number (from 1), when, the status code (None: no answer), its time and
    what went wrong (None: a 2xx)."""

    attempt: int
    at: str
    statusCode: int | None
    durationMs: int
    error: str | None


@dataclass
class DeliveryRecord:
    """One event owed to one Webhook. ``body`` is sent byte for byte on every attempt; only
    ``webhook-timestamp`` and the signature are new each time (a receiver refuses old ones)."""

    id: str
    project: str
    webhook: str
    eventId: str
    eventType: str
    createdAt: str
    body: str
    state: DeliveryState = DeliveryState.PENDING
    nextAttemptAt: str | None = None
    attempts: list[Attempt] = field(default_factory=list)

    @classmethod
    def new(cls, project: str, webhook: str, event: Event, now: str) -> DeliveryRecord:
        ms = int(time.time() * 1000)
        return cls(
            id=f"{ms:013d}-{event.id}",
            project=project,
            webhook=webhook,
            eventId=event.id,
            eventType=event.type,
            createdAt=now,
            body=event.body.decode("utf-8"),
            nextAttemptAt=now,
        )

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["state"] = self.state.value
        return document

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> DeliveryRecord:
        attempts = [Attempt(**attempt) for attempt in document.get("attempts") or []]
        return cls(**{**document, "state": DeliveryState(document["state"]), "attempts": attempts})

    def view(self) -> dict[str, Any]:
        """What the API shows: the record, its body as the JSON it is (``payload``)."""
        document = self.to_json()
        document["payload"] = json.loads(document.pop("body"))
        return document


class DeliveryRecords:
    """Reads and writes the records (blocking: callers run these in a thread)."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def write(self, record: DeliveryRecord) -> None:
        self._storage.write_json(
            layout.webhook_delivery(record.project, record.webhook, record.id), record.to_json()
        )

    def load(self, project: str, webhook: str) -> list[DeliveryRecord]:
        """Every record of the Webhook, oldest first; a damaged one is skipped."""
        folder = layout.webhook_deliveries_folder(project, webhook)
        records = []
        for file in sorted(self._storage.list_dir(folder)):
            if not file.endswith(".json"):
                continue
            try:
                records.append(DeliveryRecord.from_json(self._storage.read_json(f"{folder}/{file}")))
            except (KeyError, TypeError, ValueError, FileNotFoundError):
                continue
        return records

    def delete(self, project: str, webhook: str, delivery: str) -> None:
        self._storage.delete(layout.webhook_delivery(project, webhook, delivery))
