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
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.ipc as ipc

from nodus_ray import metrics, tracing
from nodus_ray.durable.fencing import JournalConflict
from nodus_ray.durable.journal_log import LOG_SUFFIX, MAGIC, JournalRecord, decode_log, encode_frames
from nodus_ray.durable.step_activity import activity, in_progress
from nodus_ray.store import layout
from nodus_ray.store.storage import AlreadyExists, LocalLog, Storage
from nodus_ray.store.timestamps import format_timestamp

__all__ = [
    "StepState",
    "Entry",
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
# One record to append: (step_id, kind, state, payload, attempt, cost_usd).
Entry = tuple[str, str, StepState, Any, int, str]

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

_COMPACT_SEGMENTS = 8  # records outside chunks that make a chunk
_MAX_CHUNKS = 16  # more chunks than this are merged into one


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
        self._log: LocalLog | None = None  # this writer's log on a local disk, once it appended

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
            self._close_log()  # a loaded journal's writer appends to a log of its own
        return list(records)

    def records_from(self, seq: int) -> list[JournalRecord]:
        """The records from ``seq`` on, reading only the objects that hold them (a reader that
        follows the journal, like the events stream, reads what is new). Changes nothing.

        A chunk holds the seqs its name says. A segment or log is named by its first seq only
        and holds the records up to the next object's first seq: a record past that belongs to
        the writer that began there (a zombie's log goes on after its replacement loaded it;
        what the replacement did not load does not count, see `append_many`).
        """
        for attempt in range(3):
            try:
                by_seq: dict[int, JournalRecord] = {}
                for name, first, last in _holding(self._storage.list_dir(self._prefix)):
                    if last < seq:
                        continue
                    for record in self._read(name):
                        if record.seq >= max(seq, first) and record.seq <= last:
                            by_seq.setdefault(record.seq, record)
                return [by_seq[key] for key in sorted(by_seq)]
            except FileNotFoundError:
                if attempt == 2:
                    raise
                # The writer compacted between our listing and our read: list again.
        return []

    def _read(self, name: str) -> list[JournalRecord]:
        data = self._storage.read_bytes(f"{self._prefix}/{name}")
        return decode_log(data) if name.endswith(LOG_SUFFIX) else _decode_segment(data)

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
        return self.append_many([(step_id, kind, state, payload, attempt, cost_usd)])[0]

    def append_many(self, entries: Sequence[Entry]) -> list[JournalRecord]:
        """Durably write consecutive records with one write (one fsync, or one object on S3).

        For records that need no durability point between them (a step's ``Completed`` and the
        message it produced). On a local disk they go to this writer's log (`journal_log`):
        the first append creates ``{seq}.log`` create-only, later ones are a write and an
        ``fdatasync``. Elsewhere (S3 cannot append) each call is one new object ``{seq}.arrow``
        named by its first record. Either way two writers that both believe ``seq`` is next
        collide on that name, and a writer's records past the first seq of a later writer's
        object are not read: so a zombie's late appends never count (`durable.fencing`).
        """
        with self._lock:
            now = datetime.now(UTC)
            records = [
                JournalRecord(
                    seq=self._next_seq + offset,
                    step_id=step_id,
                    kind=kind,
                    state=state,
                    attempt=attempt,
                    payload=payload,
                    cost_usd=cost_usd,
                    at=now,
                )
                for offset, (step_id, kind, state, payload, attempt, cost_usd) in enumerate(entries)
            ]
            if not records:
                return []
            first = records[0]
            self.check_fence(f"before writing record {first.seq}, {first.step_id} {first.state}")
            began = time.perf_counter()
            backend = "log" if self._storage.is_local else "object"
            try:
                with tracing.journal_write(first.seq, len(records), first.step_id, first.state, backend):
                    if self._log is not None:
                        self._log.append(encode_frames(records))
                    elif self._storage.is_local:
                        key = _log_key(self._segment_key(first.seq))
                        self._log = self._storage.create_log(key, MAGIC + encode_frames(records))
                    else:
                        self._storage.create_bytes(self._segment_key(first.seq), _encode_segment(records))
            except AlreadyExists:
                raise JournalConflict(self._prefix, first.seq) from None
            except BaseException:
                self._close_log()  # the next append starts a new log after what is known
                raise
            metrics.journal_write(time.perf_counter() - began)
            self._records.extend(records)
            self._next_seq += len(records)
            return records

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _segment_key(self, seq: int) -> str:
        return layout.journal_segment(self._prefix, seq)

    def compact(self) -> int:
        """Fold the segments and logs of records this writer holds into a chunk, and many chunks
        into one; return how many objects were replaced. Only the journal's writer calls this,
        when it appends no more; its next append starts a new log."""
        with self._lock:
            self.check_fence("before compacting")
            known = self._next_seq - 1
            spans = {
                name: span
                for name in self._storage.list_dir(self._prefix)
                if (span := _span(name)) is not None and span[0] <= known
            }
            singles = [name for name, (first, last) in spans.items() if first == last and "-" not in name]
            chunks = [name for name in spans if name not in singles]
            replaced = 0
            if singles:
                first = min(spans[name][0] for name in singles)
                # A chunk overlapping the new one's range is left over from a crash mid-compaction.
                inside = [c for c in chunks if spans[c][1] >= first]
                first = min([first] + [spans[c][0] for c in inside])
                if known - first + 1 >= _COMPACT_SEGMENTS:
                    self._close_log()
                    chunk = self._write_chunk(singles + inside, first, known)
                    if chunk is not None:
                        chunks = [c for c in chunks if c not in inside] + [chunk]
                        spans[chunk] = (first, known)
                        replaced += len(singles)
            if len(chunks) > _MAX_CHUNKS:
                first = min(spans[name][0] for name in chunks)
                last = max(spans[name][1] for name in chunks)
                if self._write_chunk(chunks, first, last) is not None:
                    replaced += len(chunks)
            return replaced

    def _write_chunk(self, names: list[str], first: int, last: int) -> str | None:
        """One object holding the records ``first``..``last`` (from memory), then ``names``
        deleted; None (nothing done) unless every record in that range is in memory."""
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


def _log_key(segment_key: str) -> str:
    """A writer's log beside the segments: ``{seq}.log`` for the segment key ``{seq}.arrow``."""
    return segment_key[: -len(".arrow")] + LOG_SUFFIX


def _holding(names: list[str]) -> list[tuple[str, int, int]]:
    """The objects to read (`_covering`) in seq order, each with the seqs it holds: a chunk's
    or skeleton's own range; a segment or log's from its first seq to the next object's."""
    chosen = sorted(
        ((name, *span) for name in _covering(names) if (span := journal_object_span(name)) is not None),
        key=lambda item: item[1],
    )
    held = []
    following = 2**62  # the first seq of the next object up, scanning down
    for name, first, last in reversed(chosen):
        if first == last and "-" not in name:
            last = following - 1
        held.append((name, first, last))
        following = min(following, first)
    return held[::-1]


def _span(name: str) -> tuple[int, int] | None:
    """The seqs an object's name gives: ``{seq}.arrow`` and ``{seq}.log`` (from ``seq``; where
    they end, `_holding` says) or a chunk ``{first}-{last}.arrow``."""
    if name.endswith(LOG_SUFFIX):
        stem = name[: -len(LOG_SUFFIX)]
        return (int(stem), int(stem)) if stem.isdigit() else None
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
