"""The journal's durable writes and bytes per step, beside SQLite doing the same inserts.

A run's journal writes records durably before the run acts on them. On a local disk an actor
appends to a log of its own (one ``write`` and one ``fdatasync`` per write, `durable.journal`);
on S3, which cannot append, each write is one create-only Arrow object. This measures what that
costs for a whole keep-alive conversation of ``--turns`` turns (default 100), and what SQLite
costs for the same records with the same guarantee, in the same run:

* **The writes** are what the real program writes. The real `Conversation` (over real `Steps`
  and a real `Journal` on local storage, no Ray) runs a keep-alive conversation of ``--turns``
  turns: the first prompt, then one inbox message per further turn. Its model is a seeded
  scripted provider with plausible sizes: per turn 0-2 rounds of ``bash`` tool calls (1-2
  commands each, a 60-250 byte preamble), then an answer of 300-800 bytes; usage follows the
  conversation's bytes (mostly cache reads). Commands run in a stand-in sandbox whose output is
  100-300 bytes. Routing is the real jev router (three families allowed). Each durable write
  (`Journal.append_many`: one record, or a step's ``Completed`` with the message it produced)
  is captured with its records.
* **Journal**: the captured writes made again, one by one, with `Journal.append_many` on a fresh
  `Storage` directory: the local log; the same with the epoch checked before each write, as a
  run actor does (`durable.fencing`); and one create-only Arrow object per write, as on S3.
* **SQLite** (the baseline), ``PRAGMA synchronous=FULL``, once with ``journal_mode=DELETE`` (the
  default) and once with ``WAL``: one table with the journal's columns (seq, step_id, kind,
  state, attempt, payload as JSON text, cost_usd, at), one database per run as the journal has
  one directory per run, one committed transaction per write (durable before the next, like
  `Journal.append_many`). The payload's ``json.dumps`` is inside the timing on both sides.
* **Reference row**: the same Arrow bytes written with `Storage.write_bytes`, one object per
  write, without encoding: what that I/O alone costs (a new file, its fsync, the rename, the
  directory's fsync).

**Durable overhead per step** is the time of all the writes over the steps (distinct non-message
step ids, as the API's ``steps`` lists them). Bytes per step: the total size of the run's files
(log or objects; database, plus the WAL file before it is checkpointed away) over the steps; "on
disk" is the allocated size (``st_blocks``). **Journal bytes after compaction / payload bytes**:
the journal compacted at the end of every turn (as a parked keep-alive run's actor does), its
objects' total size over the records' payloads as JSON (each message once). Load:
`Journal.load` on a fresh `Journal` beside a fresh SQLite connection selecting every row in seq
order and decoding each into the same `JournalRecord`; both from the page cache.

    .venv/bin/python benchmarks/journal.py
    .venv/bin/python benchmarks/journal.py --turns 100 --repeat 3 --dir /var/tmp/bench
    .venv/bin/python benchmarks/journal.py --recovery-runs 1000   # and a full restart's recovery

Prints a human summary to stderr and a Markdown table for benchmarks/RESULTS.md to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import words  # noqa: E402

from nodus_ray.durable.fencing import Epoch  # noqa: E402
from nodus_ray.durable.journal import Journal, JournalRecord, _encode_segment, step_views  # noqa: E402
from nodus_ray.durable.steps import Steps  # noqa: E402
from nodus_ray.models.base import ModelRequest, ModelResponse, Usage  # noqa: E402
from nodus_ray.money.billing import RunBudget  # noqa: E402
from nodus_ray.money.prices import DEFAULT_PRICE_TABLE  # noqa: E402
from nodus_ray.money.spend import RunSpend  # noqa: E402
from nodus_ray.runtime.conversation import AwaitingMessage, Conversation, ConversationSpec  # noqa: E402
from nodus_ray.runtime.router import JevRouter  # noqa: E402
from nodus_ray.sandbox import CommandResult  # noqa: E402
from nodus_ray.store.storage import Storage  # noqa: E402

PREFIX = "projects/default/agentruns/bench/journal"
_WORDS = (
    "the",
    "run",
    "journal",
    "step",
    "model",
    "answer",
    "sandbox",
    "token",
    "file",
    "output",
    "replay",
    "result",
    "command",
    "workspace",
    "build",
    "test",
    "error",
    "line",
    "we",
    "so",
    "because",
    "function",
    "returns",
    "value",
    "config",
    "directory",
    "passes",
    "fails",
)
_COMMANDS = (
    "ls -la",
    "pytest -q tests/test_api.py",
    "grep -rn TODO src",
    "cat setup.cfg",
    "git status",
    "python3 -c 'import sys; print(sys.version)'",
    "wc -l src/*.py",
    "make lint",
    "du -sh .",
)


def _words(rng: random.Random, low: int, high: int) -> str:
    return words(rng, rng.randint(low, high), _WORDS)


# --------------------------------------------------------------------------------------------
# The conversation: the real program, a scripted model and a stand-in sandbox


def _content_chars(messages: list[dict[str, Any]]) -> int:
    return len(json.dumps(messages, separators=(",", ":")))


class ScriptedProvider:
    """A seeded model with plausible sizes: 0-2 tool rounds per turn, then a 300-800 byte answer."""

    name = "scripted"

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.tool_ids = 0
        self._rounds_left: int | None = None

    def model_for_family(self, family: str) -> str:
        return DEFAULT_PRICE_TABLE.family_models[family]

    def complete(self, request: ModelRequest) -> ModelResponse:
        rng = self.rng
        last = request.messages[-1]
        new_prompt = last["role"] == "user" and isinstance(last["content"], str)
        if new_prompt:
            self._rounds_left = rng.choice((0, 1, 1, 1, 2))
        total_in = _content_chars(request.messages) // 4 + len(request.system) // 4 + 300
        read = int(total_in * rng.uniform(0.7, 0.95)) if len(request.messages) > 1 else 0
        creation = int((total_in - read) * rng.uniform(0.3, 0.9))
        if self._rounds_left:
            self._rounds_left -= 1
            content: list[dict[str, Any]] = [{"type": "text", "text": _words(rng, 60, 250)}]
            for _ in range(1 if rng.random() < 0.75 else 2):
                self.tool_ids += 1
                content.append(
                    {
                        "type": "tool_use",
                        "id": f"toolu_{self.tool_ids:024d}",
                        "name": "bash",
                        "input": {"command": rng.choice(_COMMANDS)},
                    }
                )
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": _words(rng, 300, 800)}]
            stop = "end_turn"
        output = _content_chars(content) // 4 + rng.randint(5, 40)
        usage = Usage(
            input_tokens=total_in - read - creation,
            output_tokens=output,
            cache_creation_input_tokens=creation,
            cache_read_input_tokens=read,
        )
        return ModelResponse(model=request.model, content=content, stop_reason=stop, usage=usage)


@dataclass
class StandInSandbox:
    """Commands "run" instantly and print 100-300 bytes; the journal only sees their results."""

    rng: random.Random
    workspace: Path
    backend: str = "bubblewrap"
    note: str | None = None

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        lines = []
        size, target = 0, self.rng.randint(100, 300)
        while size < target:
            line = _words(self.rng, 20, 70)
            lines.append(line)
            size += len(line) + 1
        output = "\n".join(lines)[:target]
        return CommandResult(
            exit_code=0 if self.rng.random() < 0.85 else 1,
            output=output,
            truncated=False,
            timed_out=False,
            cancelled=False,
            duration_seconds=round(self.rng.uniform(0.01, 2.0), 3),
            limit=None,
        )

    def cancel(self) -> None:
        return None

    def delete(self) -> None:
        return None


async def _nothing(*_args: Any) -> None:
    return None


Group = list[JournalRecord]  # the records of one durable write (`Journal.append_many`)


async def conversation_records(turns: int, seed: int, storage: Storage) -> tuple[list[Group], float]:
    """Run a keep-alive conversation of ``turns`` turns; its journal's writes (each the records
    it wrote together, `Journal.append_many`) and its seconds."""
    rng = random.Random(seed)
    prompts = [_words(rng, 40, 300) + "?" for _ in range(turns)]
    sandbox = StandInSandbox(random.Random(f"{seed}:sandbox"), Path("/tmp/workspace"))

    async def inbox(after: int) -> dict[str, Any] | None:
        if after + 1 >= turns:
            return None
        return {"seq": after + 1, "name": f"m-{after + 1}", "payload": prompts[after + 1], "messageKey": None}

    journal = Journal(storage, PREFIX)
    groups: list[Group] = []
    write = journal.append_many

    def captured(entries: Any) -> list[JournalRecord]:
        written = write(entries)
        groups.append(list(written))
        return written

    journal.append_many = captured  # type: ignore[method-assign]
    conversation = Conversation(
        steps=Steps(journal),
        provider=ScriptedProvider(random.Random(f"{seed}:model")),
        spec=ConversationSpec(
            system="You are a careful engineer. Use the bash tool when a command helps, "
            "and keep answers short.",
            families=["haiku", "sonnet", "opus"],
            model_name=None,
            max_tokens=4096,
            max_tool_calls=50,
            prompt=prompts[0],
            keep_alive=True,
        ),
        spend=RunSpend(DEFAULT_PRICE_TABLE, "Nodus", RunBudget(Decimal(1000)), reserve_credits=_nothing),
        router=JevRouter().route,
        open_sandbox=lambda: sandbox,
        on_progress=_nothing,
        next_message=inbox,
    )
    started = time.perf_counter()
    try:
        await conversation.run()
        raise RuntimeError("a keep-alive conversation should end waiting for a message")
    except AwaitingMessage as waiting:
        if waiting.turn != turns:
            raise RuntimeError(f"stopped after turn {waiting.turn}, not {turns}") from None
    if [r for g in groups for r in g] != journal.records:
        raise RuntimeError("a record was written outside Journal.append_many")
    return groups, time.perf_counter() - started


# --------------------------------------------------------------------------------------------
# The contenders: each appends every record durably, then loads them all back


@dataclass
class Trial:
    append_seconds: list[float]
    load_seconds: float
    bytes_apparent: int
    bytes_on_disk: int
    compacted_load_seconds: float = float("nan")
    compacted_objects: int = 0
    compact_seconds: float = float("nan")
    compacted_bytes: int = 0


def _sizes(paths: list[Path]) -> tuple[int, int]:
    stats = [path.stat() for path in paths if path.exists()]
    return sum(s.st_size for s in stats), sum(s.st_blocks * 512 for s in stats)


class ObjectStorage(Storage):
    """A local directory the journal writes as it writes S3: one create-only object per write
    (`Storage.create_bytes`), no log. The journal before issue 19 wrote one per record."""

    @property
    def is_local(self) -> bool:
        return False


def _entries(group: Group) -> list[Any]:
    return [(r.step_id, r.kind, r.state, r.payload, r.attempt, r.cost_usd) for r in group]


def journal_trial(groups: list[Group], root: Path, fenced: bool = False, objects: bool = False) -> Trial:
    """The journal as a run actor writes it, write by write (`Journal.append_many`); ``fenced``:
    with its epoch checked before every write (`durable.fencing`), as an actor does; ``objects``:
    one create-only object per write, as on S3, instead of the local log."""
    storage = (ObjectStorage if objects else Storage)(str(root))
    fence = None
    if fenced:
        epoch = Epoch(storage, PREFIX.rsplit("/", 1)[0], attempt=1)
        epoch.claim()
        fence = epoch.check
    journal = Journal(storage, PREFIX, fence=fence)
    times = []
    for group in groups:
        started = time.perf_counter()
        journal.append_many(_entries(group))
        times.append(time.perf_counter() - started)
    files = sorted((root / PREFIX).iterdir())
    assert len(files) == (len(groups) if objects else 1)
    apparent, on_disk = _sizes(files)
    started = time.perf_counter()
    loaded = Journal(Storage(str(root)), PREFIX).load()
    load = time.perf_counter() - started
    records = [r for g in groups for r in g]
    assert [(r.step_id, r.state, r.payload) for r in loaded] == [
        (r.step_id, r.state, r.payload) for r in records
    ]
    compacted, compact_seconds, count, size = compacted_trial(groups, root / "compacted", objects)
    return Trial(times, load, apparent, on_disk, compacted, count, compact_seconds, size)


def compacted_trial(groups: list[Group], root: Path, objects: bool = False) -> tuple[float, float, int, int]:
    """The same writes with `Journal.compact` at the end of every turn, as a keep-alive run's
    actor does when it parks for the next message: (load seconds, compaction seconds, objects,
    their bytes)."""
    journal = Journal((ObjectStorage if objects else Storage)(str(root)), PREFIX)
    compact_seconds = 0.0
    turn = None
    for group in groups:
        r = group[0]
        this_turn = r.step_id.split("/", 1)[0] if r.step_id.startswith("turn-") else turn
        if turn is not None and this_turn != turn:
            started = time.perf_counter()
            journal.compact()
            compact_seconds += time.perf_counter() - started
        turn = this_turn
        journal.append_many(_entries(group))
    journal.compact()
    files = sorted((root / PREFIX).iterdir())
    started = time.perf_counter()
    loaded = Journal(Storage(str(root)), PREFIX).load()
    load = time.perf_counter() - started
    assert [r.seq for r in loaded] == [r.seq for g in groups for r in g]
    return load, compact_seconds, len(files), _sizes(files)[0]


def bytes_trial(segments: list[bytes], root: Path) -> Trial:
    """One object per write through `Storage.write_bytes` (temporary file, fsync, rename, the
    directory's fsync), the bytes already encoded: that path's I/O alone."""
    storage = Storage(str(root))
    times = []
    for seq, data in enumerate(segments):
        started = time.perf_counter()
        storage.write_bytes(f"{PREFIX}/{seq:012d}.arrow", data)
        times.append(time.perf_counter() - started)
    apparent, on_disk = _sizes(sorted((root / PREFIX).glob("*.arrow")))
    return Trial(times, float("nan"), apparent, on_disk)


_SCHEMA = """CREATE TABLE journal (
    seq INTEGER PRIMARY KEY, step_id TEXT NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL,
    attempt INTEGER NOT NULL, payload TEXT, cost_usd TEXT, at INTEGER NOT NULL)"""


def sqlite_trial(groups: list[Group], root: Path, mode: str) -> Trial:
    """One committed transaction per write of the journal (its records, one row each)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "journal.db"
    # Autocommit off in the module's sense: each `with db:` is one transaction, committed at its end.
    db = sqlite3.connect(path, isolation_level="DEFERRED")
    db.execute(f"PRAGMA journal_mode={mode}")
    db.execute("PRAGMA synchronous=FULL")
    with db:
        db.execute(_SCHEMA)
    times = []
    records = [r for g in groups for r in g]
    seq = 0
    for group in groups:
        started = time.perf_counter()
        at = datetime.now(UTC)
        with db:
            for r in group:
                db.execute(
                    "INSERT INTO journal VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        seq,
                        r.step_id,
                        r.kind,
                        r.state,
                        r.attempt,
                        json.dumps(r.payload, separators=(",", ":")),
                        r.cost_usd,
                        int(at.timestamp() * 1_000_000),
                    ),
                )
                seq += 1
        times.append(time.perf_counter() - started)
    apparent, on_disk = _sizes([path, root / "journal.db-wal"])  # before close checkpoints the WAL away
    db.close()
    started = time.perf_counter()
    reader = sqlite3.connect(path)
    rows = reader.execute(
        "SELECT seq, step_id, kind, state, attempt, payload, cost_usd, at FROM journal ORDER BY seq"
    ).fetchall()
    loaded = [
        JournalRecord(
            seq=row[0],
            step_id=row[1],
            kind=row[2],
            state=row[3],
            attempt=row[4],
            payload=json.loads(row[5]) if row[5] is not None else None,
            cost_usd=row[6] or "0",
            at=datetime.fromtimestamp(row[7] / 1_000_000, UTC),
        )
        for row in rows
    ]
    load = time.perf_counter() - started
    reader.close()
    assert [(r.step_id, r.state, r.payload) for r in loaded] == [
        (r.step_id, r.state, r.payload) for r in records
    ]
    return Trial(times, load, apparent, on_disk)


# --------------------------------------------------------------------------------------------
# Report


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Row:
    name: str
    appends_per_second: float
    p50_ms: float
    p99_ms: float
    total_seconds: float
    bytes_apparent: int
    bytes_on_disk: int
    load_ms: float
    compacted_load_ms: float = float("nan")
    compacted_objects: int = 0
    compact_ms: float = float("nan")
    compacted_bytes: int = 0


def summarize(name: str, trials: list[Trial]) -> Row:
    """Medians over the repeats (each trial's own rate and percentiles, then the median of those)."""

    def med(f: Callable[[Trial], float]) -> float:
        return statistics.median(f(t) for t in trials)

    return Row(
        name=name,
        appends_per_second=med(lambda t: len(t.append_seconds) / sum(t.append_seconds)),
        p50_ms=med(lambda t: statistics.median(t.append_seconds) * 1000),
        p99_ms=med(lambda t: _pct(t.append_seconds, 0.99) * 1000),
        total_seconds=med(lambda t: sum(t.append_seconds)),
        bytes_apparent=int(med(lambda t: t.bytes_apparent)),
        bytes_on_disk=int(med(lambda t: t.bytes_on_disk)),
        load_ms=med(lambda t: t.load_seconds * 1000),
        compacted_load_ms=med(lambda t: t.compacted_load_seconds * 1000),
        compacted_objects=int(med(lambda t: t.compacted_objects)),
        compact_ms=med(lambda t: t.compact_seconds * 1000),
        compacted_bytes=int(med(lambda t: t.compacted_bytes)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="trials per contender; the median is reported")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--dir", help="where the files go (default: a temporary directory under /tmp, removed)"
    )
    parser.add_argument(
        "--recovery-runs",
        type=int,
        default=0,
        help="also time a full restart with this many unfinished runs (benchmarks/recovery.py; "
        "starts and stops its own Ray cluster)",
    )
    args = parser.parse_args()
    if args.turns < 1 or args.repeat < 1:
        parser.error("--turns and --repeat must be at least 1")

    base = Path(tempfile.mkdtemp(prefix="nodus-bench-journal-", dir=args.dir))
    wall = time.perf_counter()
    try:
        groups, conversation_seconds = asyncio.run(
            conversation_records(args.turns, args.seed, Storage(str(base / "conversation")))
        )
        records = [r for g in groups for r in g]
        steps = len(step_views(records))
        segments = [_encode_segment(g) for g in groups]
        trials: dict[str, list[Trial]] = {
            name: []
            for name in (
                "nodus journal (local log, one fdatasync per write)",
                "nodus journal, fenced (epoch checked per write)",
                "nodus journal, one Arrow object per write (as on S3)",
                "SQLite FULL, journal_mode=DELETE",
                "SQLite FULL, journal_mode=WAL",
                "ref: same bytes, no encoding, object per write",
            )
        }
        names = list(trials)
        for attempt in range(args.repeat):  # interleaved, so drift in the disk hits all alike
            trials[names[0]].append(journal_trial(groups, base / f"journal-{attempt}"))
            trials[names[1]].append(journal_trial(groups, base / f"fenced-{attempt}", fenced=True))
            trials[names[2]].append(journal_trial(groups, base / f"objects-{attempt}", objects=True))
            trials[names[3]].append(sqlite_trial(groups, base / f"sqlite-delete-{attempt}", "DELETE"))
            trials[names[4]].append(sqlite_trial(groups, base / f"sqlite-wal-{attempt}", "WAL"))
            trials[names[5]].append(bytes_trial(segments, base / f"bytes-{attempt}"))
            for leftover in base.glob(f"*-{attempt}"):
                shutil.rmtree(leftover, ignore_errors=True)
        rows = [summarize(name, found) for name, found in trials.items()]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    wall = time.perf_counter() - wall

    kinds = Counter(f"{r.kind}/{r.state}" for r in records)
    payload = [len(json.dumps(r.payload, separators=(",", ":"))) for r in records]
    payload_bytes = sum(payload)
    out = sys.stderr
    print(
        f"{args.turns} turns (seed {args.seed}): {len(records)} records in {len(groups)} writes, {steps} steps, "
        f"{len(records) / args.turns:.1f} records and {len(groups) / args.turns:.1f} writes per turn; "
        f"conversation with its durable journal {conversation_seconds:.2f} s; whole benchmark {wall:.1f} s, "
        f"{os.cpu_count()} cores",
        file=out,
    )
    print("  records: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())), file=out)
    print(
        f"  payload JSON bytes per record: median {statistics.median(payload):.0f}, max {max(payload)}, "
        f"total {payload_bytes}; Arrow object bytes per write: median {statistics.median(map(len, segments)):.0f}",
        file=out,
    )
    journal_row = rows[0]
    for row in rows:
        print(
            f"  {row.name}: {row.appends_per_second:,.0f} writes/s (p50 {row.p50_ms:.2f} ms, p99 "
            f"{row.p99_ms:.2f} ms), {row.total_seconds:.2f} s for the conversation, durable overhead "
            f"{row.total_seconds * 1000 / steps:.3f} ms per step, "
            f"{row.bytes_apparent / steps / 1024:.2f} KiB/step ({row.bytes_on_disk / steps / 1024:.2f} on disk)"
            + (f", load {row.load_ms:.1f} ms" if row.load_ms == row.load_ms else ""),
            file=out,
        )
    print(
        f"  journal / SQLite DELETE, writes per second: "
        f"{journal_row.appends_per_second / rows[3].appends_per_second:.2f}x; journal / WAL: "
        f"{journal_row.appends_per_second / rows[4].appends_per_second:.2f}x; fenced / unfenced: "
        f"{rows[1].appends_per_second / journal_row.appends_per_second:.2f}x",
        file=out,
    )

    print(
        f"| date | turns (records, writes, steps) | store | durable writes/s | write p50 / p99 | all {len(groups)} writes "
        "| durable overhead per step | bytes / step (on disk) | load all |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        load = f"{row.load_ms:.1f} ms" if row.load_ms == row.load_ms else "-"
        print(
            f"| {time.strftime('%Y-%m-%d')} | {args.turns} ({len(records)}, {len(groups)}, {steps}) | {row.name} "
            f"| {row.appends_per_second:,.0f} | {row.p50_ms:.2f} / {row.p99_ms:.2f} ms | {row.total_seconds:.2f} s "
            f"| {row.total_seconds * 1000 / steps:.3f} ms "
            f"| {row.bytes_apparent / steps:,.0f} ({row.bytes_on_disk / steps:,.0f}) | {load} |"
        )
    for row in rows[:3:2]:
        print(
            f"\n{row.name}, compacted at the end of every turn (as a parked keep-alive run's actor does): "
            f"{row.compacted_objects} objects; load all {row.compacted_load_ms:.1f} ms instead of "
            f"{row.load_ms:.1f} ms; compaction {row.compact_ms / args.turns:.1f} ms a turn; "
            f"**journal bytes after compaction / payload bytes: {row.compacted_bytes:,} / {payload_bytes:,} "
            f"= {row.compacted_bytes / payload_bytes:.2f}x** ({row.compacted_bytes / steps:,.0f} bytes a step)."
        )
    print(
        f"\n**Durable overhead per step** (all writes' time / {steps} steps): "
        + "; ".join(f"{row.name} {row.total_seconds * 1000 / steps:.3f} ms" for row in rows)
        + "."
    )
    if args.recovery_runs > 0:
        from recovery import main as recovery_main  # benchmarks/recovery.py, beside this file

        sys.argv = [sys.argv[0], "--runs", str(args.recovery_runs)]
        recovery_main()


if __name__ == "__main__":
    main()
