"""A run's journal records as JSON Lines: one record a line, as journaled, secrets masked.

The plain form, for people who load a run into their own tools (``pandas.read_json(...,
lines=True)``, ``jq``): every record of the run's current journal in seq order, with its step,
kind, state, attempt, cost, time and whole payload. A conversation's assistant message refers to
its model step (``{"contentOf": step}``) exactly as the journal does: nothing is rebuilt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.journal_log import JournalRecord
from nodus_ray.store.timestamps import format_timestamp

__all__ = ["record_line", "journal_lines"]


def record_line(record: JournalRecord, redact: Redactor) -> dict[str, Any]:
    """One record as its line's object."""
    line = {
        "seq": record.seq,
        "step": record.step_id,
        "kind": record.kind,
        "state": record.state,
        "attempt": record.attempt,
        "costUSD": record.cost_usd or "0",
        "at": format_timestamp(record.at),
        "payload": record.payload,
    }
    masked: dict[str, Any] = redact.tree(line)
    return masked


def journal_lines(records: Iterable[JournalRecord], redact: Redactor) -> Iterator[bytes]:
    """Each record as one line of UTF-8 JSON, newline-terminated."""
    for record in records:
        text = json.dumps(record_line(record, redact), ensure_ascii=False, separators=(",", ":"))
        yield (text + "\n").encode("utf-8")
