"""A finished run's journal without its payloads: the skeleton retention leaves (decision 46).

After ``NODUS_PAYLOAD_RETENTION`` the recorded payloads of a run go (model requests and replies,
command output, step values, conversation messages); what stays is every record's skeleton: its
seq, step id, kind, state, attempt, time and cost, and of its payload only figures (token counts,
CPU seconds, exit codes, costs) and the names of the model and family that served it. The
steps listing and the events stream still show what the run did, when, and what it cost.

Journals are create-only, so the skeleton is not an overwrite: it is one new object,
``{first}-{last}.skeleton.arrow`` (`layout.journal_skeleton`), holding every record, written
create-only before the segments and chunks it replaces are deleted; a reader (`Journal`) prefers
it over whatever else covers its seqs. A crash before it is written leaves the journal as it
was; a crash after leaves the skeleton and some old objects, which readers skip and the next
`rewrite_skeleton` deletes. Only a finished run's journal is rewritten: no actor writes it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nodus_ray.durable.journal import (
    Journal,
    JournalRecord,
    decode_segment,
    encode_segment,
    journal_object_span,
    skeleton_span,
)
from nodus_ray.store import layout
from nodus_ray.store.storage import AlreadyExists, Storage

__all__ = ["skeleton_payload", "skeleton_record", "rewrite_skeleton", "EXPIRED"]

EXPIRED = "payloadExpired"  # the key a skeleton payload carries (True): its values were deleted
# Strings a skeleton keeps: which model served a call, and how it ended; never content.
_KEPT_STRINGS = frozenset({"model", "family", "routing", "stopReason", "decision", "resolvedAt", "outcome"})
_NESTED = frozenset({"result", "usage", "resolution"})  # objects whose figures are kept too


def _figures(payload: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key, value in payload.items():
        if isinstance(value, bool) or isinstance(value, int | float):
            kept[key] = value
        elif isinstance(value, str) and (key in _KEPT_STRINGS or key.endswith("USD")):
            kept[key] = value[:64] if key in _KEPT_STRINGS else value
        elif isinstance(value, dict) and key in _NESTED and depth == 0:
            nested = _figures(value, depth + 1)
            if nested:
                kept[key] = nested
    return kept


def skeleton_payload(payload: Any) -> dict[str, Any]:
    """What a record's payload keeps: figures and model names, marked `EXPIRED`."""
    kept = _figures(payload) if isinstance(payload, dict) else {}
    kept.pop("summary", None)
    return {**kept, EXPIRED: True}


def skeleton_record(record: JournalRecord) -> JournalRecord:
    """The record with its payload reduced to `skeleton_payload` (all else as it was)."""
    return replace(record, payload=skeleton_payload(record.payload))


def rewrite_skeleton(storage: Storage, prefix: str) -> int:
    """Replace the journal under ``prefix`` by its skeleton; how many old objects were deleted.

    Idempotent, and safe to stop anywhere: the skeleton is written create-only first (a second
    sweep finds it there), then every object it covers is deleted. An empty journal is left as
    it is. The caller makes sure the run is finished (nothing appends meanwhile).
    """
    names = storage.list_dir(prefix)
    skeletons = [(span, name) for name in names if (span := skeleton_span(name)) is not None]
    if not skeletons:
        records = Journal(storage, prefix).records_from(0)
        if not records:
            return 0
        first, last = records[0].seq, records[-1].seq
        key = layout.journal_skeleton(prefix, first, last)
        try:
            storage.create_bytes(key, encode_segment([skeleton_record(r) for r in records]))
        except AlreadyExists:
            pass  # written by a sweep that stopped before listing again: the same records
        names = storage.list_dir(prefix)
        skeletons = [(span, name) for name in names if (span := skeleton_span(name)) is not None]
    (first, last), keep = max(skeletons, key=lambda item: item[0][1] - item[0][0])
    deleted = 0
    for name in names:
        span = journal_object_span(name)
        if name == keep or span is None:
            continue
        if first <= span[0] and span[1] <= last:
            storage.delete(f"{prefix}/{name}")
            deleted += 1
    return deleted


def read_skeleton(storage: Storage, prefix: str) -> list[JournalRecord]:
    """The records of the skeleton under ``prefix`` (none when there is no skeleton); for tests."""
    for name in storage.list_dir(prefix):
        if skeleton_span(name) is not None:
            return decode_segment(storage.read_bytes(f"{prefix}/{name}"))
    return []
