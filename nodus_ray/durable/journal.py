"""A run's append-only journal, as Arrow IPC segments in storage.

Each append writes one new object (a segment) named by its sequence number, so the journal
works the same on a local disk and on S3, which cannot append. A segment is an Arrow IPC
stream: typed, and readable by any Arrow tool (``pyarrow.ipc.open_stream``) for analysis.

A run's journal would otherwise be as many objects as records (about 14 a turn), and every
replay reads them all: 1,400 GETs on S3 for a 100-turn conversation, for each message a
keep-alive run answers. So when a run's actor is done appending (it parks or ends), `compact`
merges the single-record segments into one *chunk* named by its range (``{first}-{last}``),
and merges the chunks into one when there are many. A chunk is written before the segments it
replaces are deleted, so a crash in between leaves both, and `load` reads each seq once.

Segments are written create-only (`Storage.create_bytes`): a seq is written once, by one
writer, and a second writer of it gets `JournalConflict` instead of replacing the first. With
the epoch the writer is given (``fence``, see `durable.fencing`) checked before each write, a
zombie actor of the run stops at its next write and never overwrites the live actor's records.

Records are facts about steps: ``Started`` before an external effect, ``Completed`` or
``Failed`` with its result after, ``NeedsResolution`` when a restart found a step started
and never ended. Conversation messages are records of their own (kind ``message``), each
written once; a model call refers to the conversation by its length instead of copying it,
so a long conversation costs linear, not quadratic, journal space.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.ipc as ipc

from nodus_ray import metrics
from nodus_ray.durable.fencing import JournalConflict
from nodus_ray.durable.step_activity import activity, in_progress
from nodus_ray.store import layout
from nodus_ray.store.storage import AlreadyExists, Storage
from nodus_ray.store.timestamps import format_timestamp

__all__ = [
    "StepState",
    "JournalRecord",
    "Journal",
    "JOURNAL_SCHEMA",
    "record_view",
    "step_views",
    "encode_segment",
    "decode_segment",
    "skeleton_span",
    "journal_object_span",
]

StepState = Literal["Started", "Completed", "Failed", "NeedsResolution", "Resolved", "NoEffect"]

JOURNAL_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("step_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("payload", pa.large_string()),
        pa.field("cost_usd", pa.string()),
        pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

_COMPACT_SEGMENTS = 8  # single-record segments that make a chunk
_MAX_CHUNKS = 16  # more chunks than this are merged into one


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


class Journal:
    """One writer per run (its actor); any number of readers (the control plane's ``steps``).

    ``fence`` raises when this writer may no longer write (`durable.fencing.Epoch.check`); it
    is called before every write, and by `check_fence` before a step's effect. ``first_seq``
    is the seq an empty journal starts at: a run's later generation (``continue_as_new``)
    goes on from its previous one's seqs, so seqs stay increasing over the whole run (the
    events stream follows them, workspace snapshots are named by them).
    """

    def __init__(
        self,
        storage: Storage,
        prefix: str,
        fence: Callable[[str], None] | None = None,
        *,
        first_seq: int = 0,
    ):
        self._storage = storage
        self._prefix = prefix.rstrip("/")
        self._records: list[JournalRecord] = []
        self._first_seq = first_seq
        self._next_seq = first_seq
        self._lock = threading.Lock()
        self._fence = fence

    def check_fence(self, where: str = "") -> None:
        """Raise (`durable.fencing.Fenced`) when a newer actor of the run has taken over."""
        if self._fence is not None:
            self._fence(where)

    @property
    def prefix(self) -> str:
        """Where the segments live in storage (``projects/<project>/agentruns/<run>/journal``)."""
        return self._prefix

    @property
    def is_local(self) -> bool:
        """Whether an append is a local file (well under a millisecond) rather than a request."""
        return self._storage.is_local

    @property
    def records(self) -> list[JournalRecord]:
        return list(self._records)

    def load(self) -> list[JournalRecord]:
        """Read every segment in order; the writer continues after the last one."""
        records = self.records_from(0)
        with self._lock:
            self._records = records
            self._next_seq = records[-1].seq + 1 if records else self._first_seq
        return list(records)

    def records_from(self, seq: int) -> list[JournalRecord]:
        """The records from ``seq`` on, reading only the objects that hold them (a reader that
        follows the journal, like the events stream, reads what is new). Changes nothing."""
        for attempt in range(3):
            try:
                by_seq: dict[int, JournalRecord] = {}
                for name in _covering(self._storage.list_dir(self._prefix)):
                    span = journal_object_span(name)
                    if span is None or span[1] < seq:
                        continue
                    for record in _decode_segment(self._storage.read_bytes(f"{self._prefix}/{name}")):
                        if record.seq >= seq:
                            by_seq.setdefault(record.seq, record)
                return [by_seq[key] for key in sorted(by_seq)]
            except FileNotFoundError:
                if attempt == 2:
                    raise
                # The writer compacted between our listing and our read: list again.
        return []

    def append(
        self,
        step_id: str,
        kind: str,
        state: StepState,
        payload: Any = None,
        *,
        attempt: int = 1,
        cost_usd: str = "0",
    ) -> JournalRecord:
        """Durably write one record before returning it: the caller may act on it at once."""
        with self._lock:
            record = JournalRecord(
                seq=self._next_seq,
                step_id=step_id,
                kind=kind,
                state=state,
                attempt=attempt,
                payload=payload,
                cost_usd=cost_usd,
                at=datetime.now(UTC),
            )
            self.check_fence(f"before writing record {record.seq}, {step_id} {state}")
            began = time.perf_counter()
            try:
                self._storage.create_bytes(self._segment_key(record.seq), _encode_segment([record]))
            except AlreadyExists:
                raise JournalConflict(self._prefix, record.seq) from None
            metrics.journal_write(time.perf_counter() - began)
            self._records.append(record)
            self._next_seq += 1
            return record

    def _segment_key(self, seq: int) -> str:
        return layout.journal_segment(self._prefix, seq)

    def compact(self) -> int:
        """Merge single-record segments into a chunk, and many chunks into one; return how many
        objects were replaced. Only the journal's writer calls this, when it appends no more."""
        with self._lock:
            self.check_fence("before compacting")
            spans = {
                name: span
                for name in self._storage.list_dir(self._prefix)
                if (span := _span(name)) is not None
            }
            singles = [name for name, (first, last) in spans.items() if first == last and "-" not in name]
            chunks = [name for name in spans if name not in singles]
            replaced = 0
            if len(singles) >= _COMPACT_SEGMENTS:
                first = min(spans[name][0] for name in singles)
                last = max(spans[name][1] for name in singles)
                # A chunk inside the new one's range is left over from a crash mid-compaction.
                inside = [c for c in chunks if first <= spans[c][0] and spans[c][1] <= last]
                chunk = self._write_chunk(singles + inside, spans)
                if chunk is not None:
                    chunks = [c for c in chunks if c not in inside] + [chunk]
                    spans[chunk] = (first, last)
                    replaced += len(singles)
            if len(chunks) > _MAX_CHUNKS and self._write_chunk(chunks, spans) is not None:
                replaced += len(chunks)
            return replaced

    def _write_chunk(self, names: list[str], spans: dict[str, tuple[int, int]]) -> str | None:
        """One object holding the records of ``names`` (from memory), then the old ones deleted;
        None (nothing done) unless every record in their range is in memory."""
        first = min(spans[name][0] for name in names)
        last = max(spans[name][1] for name in names)
        records = [record for record in self._records if first <= record.seq <= last]
        if [record.seq for record in records] != list(range(first, last + 1)):
            return None
        key = layout.journal_chunk(self._prefix, first, last)
        name = key.rsplit("/", 1)[-1]
        try:
            self._storage.create_bytes(key, _encode_segment(records))
        except AlreadyExists:
            pass  # left by a compaction that crashed before its deletes: the same records
        for old in names:
            if old != name:
                self._storage.delete(f"{self._prefix}/{old}")
        return name


def _span(name: str) -> tuple[int, int] | None:
    """The seq range an object holds: ``{seq}.arrow`` or a chunk ``{first}-{last}.arrow``."""
    if not name.endswith(".arrow"):
        return None
    stem = name[: -len(".arrow")]
    first, _, last = stem.partition("-")
    if not first.isdigit() or (last and not last.isdigit()):
        return None
    return int(first), int(last or first)


_SKELETON_SUFFIX = ".skeleton.arrow"


def skeleton_span(name: str) -> tuple[int, int] | None:
    """The seq range of a finished run's skeleton ``{first}-{last}.skeleton.arrow``
    (`durable.skeleton`): its records without payloads, preferred over anything else."""
    if not name.endswith(_SKELETON_SUFFIX):
        return None
    return _span(name[: -len(_SKELETON_SUFFIX)] + ".arrow")


def journal_object_span(name: str) -> tuple[int, int] | None:
    """The seq range of any journal object: a segment, a chunk or a skeleton."""
    return _span(name) or skeleton_span(name)


def _covering(names: list[str]) -> list[str]:
    """The objects to read: a skeleton first (retention, `durable.skeleton`), then the widest
    chunks, then whatever they do not cover (after a crash mid-compaction or mid-rewrite an
    object and the ones it replaced both exist)."""
    spans = sorted(
        ((span, name) for name in names if (span := journal_object_span(name)) is not None),
        key=lambda item: (skeleton_span(item[1]) is None, item[0][0] - item[0][1], item[0][0]),
    )
    chosen: list[str] = []
    covered: list[tuple[int, int]] = []
    for (first, last), name in spans:
        if not any(a <= first and last <= b for a, b in covered):
            chosen.append(name)
            covered.append((first, last))
    return chosen


def _encode_segment(records: list[JournalRecord]) -> bytes:
    table = pa.Table.from_pylist([record.to_row() for record in records], schema=JOURNAL_SCHEMA)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, JOURNAL_SCHEMA) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()  # pyarrow is untyped
    return data


def _decode_segment(data: bytes) -> list[JournalRecord]:
    table = ipc.open_stream(pa.BufferReader(data)).read_all()
    return [
        JournalRecord(
            seq=row["seq"],
            step_id=row["step_id"],
            kind=row["kind"],
            state=row["state"],
            attempt=row["attempt"],
            payload=json.loads(row["payload"]) if row["payload"] is not None else None,
            cost_usd=row["cost_usd"] or "0",
            at=row["at"],
        )
        for row in table.to_pylist()
    ]


encode_segment = _encode_segment  # one Arrow IPC stream of records (what `durable.skeleton` writes)
decode_segment = _decode_segment


def _iso(moment: datetime | None) -> str | None:
    return format_timestamp(moment) if moment else None


def record_view(record: JournalRecord) -> dict[str, Any]:
    """One record as the events stream shows it: what happened to which step, never content
    (a message's text, a command's output stay in ``steps`` and ``answer``)."""
    payload = record.payload if isinstance(record.payload, dict) else {}
    summary = payload.get("summary") or ""
    if not summary and record.state == "Started":  # what it is about to do (`step_activity`)
        summary = activity(record.kind, record.step_id, payload)
    view = {
        "seq": record.seq,
        "step": record.step_id,
        "kind": record.kind,
        "state": record.state,
        "attempt": record.attempt,
        "summary": summary,
        "costUSD": record.cost_usd,
        "at": _iso(record.at),
    }
    result = payload.get("result")
    if record.kind == "command" and isinstance(result, dict) and result.get("egress"):
        view["egress"] = result["egress"]  # host, port, outcome, reason, bytes: never content
    return view


def step_views(records: list[JournalRecord]) -> list[dict[str, Any]]:
    """Fold records into one view per step, in the order the steps began (the API's Steps).

    Messages are conversation content, not actions, and are left out: ``steps`` says what
    the run did, not what was said.
    """
    views: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.kind == "message":
            continue
        view = views.get(record.step_id)
        if view is None:
            view = views[record.step_id] = {
                "id": record.step_id,
                "kind": record.kind,
                "seq": record.seq,
                "state": record.state,
                "attempts": 0,
                "startedAt": _iso(record.at),
                "finishedAt": None,
                "summary": "",
                "costUSD": "0",
                "detail": {},
            }
        if record.state == "Started":
            view["attempts"] += 1
            view["startedAt"] = view["startedAt"] or _iso(record.at)
        else:
            view["finishedAt"] = _iso(record.at)
            view["attempts"] = max(view["attempts"], 1)
        view["state"] = record.state
        if record.cost_usd and record.cost_usd != "0":
            view["costUSD"] = record.cost_usd
        payload = record.payload if isinstance(record.payload, dict) else {}
        if payload.get("summary"):
            view["summary"] = payload["summary"]
        view["detail"].update({k: v for k, v in payload.items() if k != "summary"})
    return in_progress(list(views.values()), records)  # a Started step: what it does, since when
