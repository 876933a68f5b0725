"""Batch records: what makes a batch of runs all-or-nothing and an ``Idempotency-Key`` safe.

A batch (``POST .../agentruns`` with an AgentRunList) writes a record *before* it writes any
run: ``Pending`` with the names it is about to create. Only when every run is stored does the
record become ``Done`` (with the answer, when the request carried an Idempotency-Key) or go away
(when it did not). The record is the commit point:

* a record found ``Pending`` when the control plane starts belongs to a batch that was never
  answered; its runs are removed (roll back) and the client's retry creates them afresh;
* a ``Done`` record answers a repeated Idempotency-Key with the first answer, creating nothing.

Keys are stored hashed, and records are kept ``RETENTION`` (at least the 24 hours promised).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import parse_timestamp, utc_now

__all__ = ["BatchRecords", "PendingBatch", "request_digest", "RETENTION"]

logger = logging.getLogger(__name__)

RETENTION = timedelta(days=7)


def request_digest(items: list[dict[str, Any]]) -> str:
    """A fingerprint of a batch's content: the same key with other content is refused."""
    return hashlib.sha256(json.dumps(items, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _record_id(idempotency_key: str) -> str:
    return hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:40]


@dataclass(frozen=True)
class PendingBatch:
    project: str
    record_id: str
    names: list[str]


class BatchRecords:
    """Batch records of each project, under ``projects/<project>/batches/``."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def _path(self, project: str, record_id: str) -> str:
        return f"projects/{project}/batches/{record_id}.json"

    def find(self, project: str, idempotency_key: str) -> dict[str, Any] | None:
        """The Done record of a key, or None. A Pending one is an unanswered batch: not an answer."""
        try:
            record = self.storage.read_json(self._path(project, _record_id(idempotency_key)))
        except FileNotFoundError:
            return None
        return record if record.get("state") == "Done" else None

    def begin(self, project: str, idempotency_key: str | None, digest: str, names: list[str]) -> str:
        record_id = _record_id(idempotency_key) if idempotency_key else f"anon-{uuid.uuid4().hex}"
        self.storage.write_json(
            self._path(project, record_id),
            {
                "state": "Pending",
                "digest": digest,
                "names": names,
                "createdAt": utc_now(),
            },
        )
        return record_id

    def commit(self, project: str, record_id: str, digest: str, items: list[dict[str, Any]] | None) -> None:
        """Done with the answer to replay (``items``), or gone when there is no key to replay."""
        if items is None:
            self.storage.delete(self._path(project, record_id))
            return
        self.storage.write_json(
            self._path(project, record_id),
            {
                "state": "Done",
                "digest": digest,
                "items": items,
                "createdAt": utc_now(),
            },
        )

    def abandon(self, project: str, record_id: str) -> None:
        self.storage.delete(self._path(project, record_id))

    def pending(self, project: str) -> list[PendingBatch]:
        """Unanswered batches (to roll back), pruning Done records past their retention."""
        found: list[PendingBatch] = []
        now = datetime.now(UTC)
        for entry in self.storage.list_dir(f"projects/{project}/batches"):
            record_id = entry.removesuffix(".json")
            try:
                record = self.storage.read_json(self._path(project, record_id))
            except Exception:  # noqa: BLE001 - a damaged record must not stop the service
                logger.exception("could not read batch record %s/%s", project, record_id)
                continue
            if record.get("state") == "Pending":
                found.append(PendingBatch(project, record_id, list(record.get("names") or [])))
            elif now - parse_timestamp(record["createdAt"]) > RETENTION:
                self.storage.delete(self._path(project, record_id))
        return found
