"""A journal record, and the small framed format of a writer's hot log on a local disk.

A run's actor writes its records to a log of its own, ``{first}.log`` beside the journal's
segments (`durable.journal`): created create-only with its first record, then one ``write`` and
one ``fdatasync`` per append (`store.create_only.LocalLog`). An Arrow IPC segment costs about
1,170 bytes of schema and framing and ~0.1 ms of encoding per record, and a log is read whole
by every reader anyway; so the hot log is framed JSON, and compaction folds it into Arrow
chunks (typed, readable by any Arrow tool) when the actor parks or ends.

The file is ``MAGIC`` then frames: ``<length u32 LE><crc32 u32 LE><JSON>``, the JSON a list
``[seq, step_id, kind, state, attempt, payload, cost_usd, at_microseconds]``. A reader stops at
the first frame that is incomplete or whose checksum does not match: the end of a write that a
crash cut short, which its writer never acknowledged, so no one acted on it.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["JournalRecord", "MAGIC", "LOG_SUFFIX", "encode_frames", "decode_log"]

MAGIC = b"NJL1\n"
LOG_SUFFIX = ".log"
_HEADER = struct.Struct("<II")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class JournalRecord:
    seq: int
    step_id: str
    kind: str
    state: str
    attempt: int
    payload: Any
    cost_usd: str
    at: datetime

    def to_row(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "step_id": self.step_id,
            "kind": self.kind,
            "state": self.state,
            "attempt": self.attempt,
            "payload": json.dumps(self.payload, separators=(",", ":")),
            "cost_usd": self.cost_usd,
            "at": self.at,
        }


def _microseconds(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def encode_frames(records: list[JournalRecord]) -> bytes:
    """The frames of ``records``, to append to a log in one write."""
    out = bytearray()
    for r in records:
        row = [r.seq, r.step_id, r.kind, r.state, r.attempt, r.payload, r.cost_usd, _microseconds(r.at)]
        body = json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()
        out += _HEADER.pack(len(body), zlib.crc32(body))
        out += body
    return bytes(out)


def decode_log(data: bytes) -> list[JournalRecord]:
    """The whole frames of a log, in order, up to the first torn one."""
    if not data.startswith(MAGIC):
        return []  # not even its magic: nothing was acknowledged from it
    records = []
    at, end = len(MAGIC), len(data)
    while at + _HEADER.size <= end:
        length, crc = _HEADER.unpack_from(data, at)
        body = data[at + _HEADER.size : at + _HEADER.size + length]
        if len(body) != length or zlib.crc32(body) != crc:
            break
        seq, step_id, kind, state, attempt, payload, cost_usd, micros = json.loads(body)
        at_time = _EPOCH + timedelta(microseconds=micros)
        records.append(JournalRecord(seq, step_id, kind, state, attempt, payload, cost_usd or "0", at_time))
        at += _HEADER.size + length
    return records
