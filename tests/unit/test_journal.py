"""The journal and the replay rules of durable steps, on real storage (a local directory)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow.ipc as ipc
import pytest

from nodus_ray.durable.fencing import JournalConflict
from nodus_ray.durable.journal import JOURNAL_SCHEMA, Journal, step_views
from nodus_ray.durable.steps import NeedsResolution, StepFailed, Steps
from nodus_ray.store.storage import Storage


def journal_at(root: Path | str) -> Journal:
    """A journal on a directory (``tmp_path``) or on any storage URI (the ``storage_uri`` fixture)."""
    uri = root if isinstance(root, str) else str(root / "store")
    journal = Journal(Storage(uri), "projects/p/agentruns/r/journal")
    journal.load()
    return journal


def test_records_survive_a_reload_in_order(storage_uri: str) -> None:
    tmp_path = storage_uri
    journal = journal_at(tmp_path)
    journal.append("a", "route", "Started", {"x": 1})
    journal.append("a", "route", "Completed", {"result": {"family": "haiku"}}, cost_usd="0.01")
    reloaded = journal_at(tmp_path)
    assert [(r.seq, r.step_id, r.state) for r in reloaded.records] == [
        (0, "a", "Started"),
        (1, "a", "Completed"),
    ]
    assert reloaded.records[1].payload == {"result": {"family": "haiku"}}
    assert reloaded.records[1].cost_usd == "0.01"
    # The writer continues after the last record instead of overwriting it.
    assert reloaded.append("b", "model", "Started").seq == 2


def test_compacted_chunks_are_arrow_ipc_streams_any_tool_can_read(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    for i in range(8):
        journal.append(f"a{i}", "command", "Started", {"command": "ls"})
    folder = tmp_path / "store" / "projects/p/agentruns/r/journal"
    assert [path.name for path in folder.iterdir()] == ["000000000000.log"], "a writer's hot log"
    journal.compact()
    [chunk] = sorted(folder.glob("*.arrow"))
    table = ipc.open_stream(chunk.read_bytes()).read_all()
    assert table.schema.equals(JOURNAL_SCHEMA)
    assert table.column("step_id").to_pylist() == [f"a{i}" for i in range(8)]


def test_a_local_writer_appends_to_one_log_and_a_torn_tail_is_not_read(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    journal.append("a", "command", "Started", {"command": "ls"})
    journal.append_many(
        [("a", "command", "Completed", {"result": 1}, 1, "0"), ("m", "message", "Completed", {}, 1, "0")]
    )
    log = tmp_path / "store" / PREFIX / "000000000000.log"
    assert [path.name for path in log.parent.iterdir()] == [log.name]
    whole = log.read_bytes()
    log.write_bytes(whole + whole[-30:])  # a crash in the middle of the next append
    assert [(r.seq, r.step_id, r.state) for r in journal_at(tmp_path).records] == [
        (0, "a", "Started"),
        (1, "a", "Completed"),
        (2, "m", "Completed"),
    ]


def test_a_zombies_appends_past_where_its_replacement_began_do_not_count(storage_uri: str) -> None:
    """Two writers that both believe seq N is next collide on its name on S3 (one object per
    append); on a local disk each has its log, and a log is not read past the first seq of a
    later writer's log (`Journal.append_many`): the replacement's records win."""
    local = Storage(storage_uri).is_local
    zombie = journal_at(storage_uri)
    zombie.append("s0", "step", "Completed", {"by": "zombie"})
    replacement = journal_at(storage_uri)  # loaded seq 0
    zombie.append("s1", "step", "Started", {"by": "zombie"})  # after the replacement loaded
    if local:
        assert replacement.append("s1", "step", "Completed", {"by": "replacement"}).seq == 1
        zombie.append("late", "step", "Started", {"by": "zombie"})  # its log goes on, unread
        expected = [(0, "s0", "zombie"), (1, "s1", "replacement")]
    else:
        with pytest.raises(JournalConflict):
            replacement.append("s1", "step", "Completed", {"by": "replacement"})
        expected = [(0, "s0", "zombie"), (1, "s1", "zombie")]
    assert [(r.seq, r.step_id, r.payload["by"]) for r in journal_at(storage_uri).records] == expected
    assert [(r.seq, r.step_id) for r in Journal(Storage(storage_uri), PREFIX).records_from(1)] == [(1, "s1")]


def test_step_views_fold_records_and_hide_messages(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    journal.append("message-0", "message", "Completed", {"role": "user", "content": "hi"})
    journal.append("turn-1/model-1", "model", "Started", {"model": "m"})
    journal.append("turn-1/model-1", "model", "Started", {"model": "m"}, attempt=2)
    journal.append("turn-1/model-1", "model", "Completed", {"result": {}, "summary": "ok"}, attempt=2)
    views = step_views(journal.records)
    assert [v["id"] for v in views] == ["turn-1/model-1"]
    assert views[0]["attempts"] == 2
    assert views[0]["state"] == "Completed"
    assert views[0]["summary"] == "ok"


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        return {"n": self.calls}


def test_a_completed_step_is_not_executed_again(storage_uri: str) -> None:
    tmp_path = storage_uri
    counter = Counter()
    first = asyncio.run(Steps(journal_at(tmp_path)).run("s", "command", counter, effect="external"))
    replayed = asyncio.run(Steps(journal_at(tmp_path)).run("s", "command", counter, effect="external"))
    assert counter.calls == 1
    assert first == replayed == {"n": 1}


def test_a_failed_step_fails_again_on_replay_without_executing(tmp_path: Path) -> None:
    calls = []

    async def failing() -> dict[str, Any]:
        calls.append(1)
        raise StepFailed("s", {"message": "boom"})

    with pytest.raises(StepFailed):
        asyncio.run(Steps(journal_at(tmp_path)).run("s", "model", failing))
    with pytest.raises(StepFailed) as caught:
        asyncio.run(Steps(journal_at(tmp_path)).run("s", "model", failing))
    assert len(calls) == 1
    assert caught.value.error["message"] == "boom"


def test_an_interrupted_idempotent_step_runs_again_as_a_new_attempt(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    journal.append("m", "model", "Started", {})
    counter = Counter()
    result = asyncio.run(Steps(journal_at(tmp_path)).run("m", "model", counter))
    assert result == {"n": 1}
    states = [(r.state, r.attempt) for r in journal_at(tmp_path).records]
    assert states == [("Started", 1), ("Started", 2), ("Completed", 2)]


def test_an_interrupted_external_step_needs_resolution_and_is_not_run(storage_uri: str) -> None:
    tmp_path = storage_uri
    journal = journal_at(tmp_path)
    journal.append("c", "command", "Started", {"command": "rm -rf data"})
    counter = Counter()
    with pytest.raises(NeedsResolution) as caught:
        asyncio.run(Steps(journal_at(tmp_path)).run("c", "command", counter, effect="external"))
    assert caught.value.step_id == "c"
    assert counter.calls == 0
    assert journal_at(tmp_path).records[-1].state == "NeedsResolution"
    # Asking again does not pile up records.
    with pytest.raises(NeedsResolution):
        asyncio.run(Steps(journal_at(tmp_path)).run("c", "command", counter, effect="external"))
    assert len(journal_at(tmp_path).records) == 2


def test_messages_are_stored_once(tmp_path: Path) -> None:
    steps = Steps(journal_at(tmp_path))
    asyncio.run(steps.record_message(0, {"role": "user", "content": "hi"}))
    again = Steps(journal_at(tmp_path))
    asyncio.run(again.record_message(0, {"role": "user", "content": "hi"}))
    assert again.messages() == [{"role": "user", "content": "hi"}]
    assert len(journal_at(tmp_path).records) == 1


PREFIX = "projects/p/agentruns/r/journal"


def test_compaction_makes_one_object_of_many_and_a_reload_reads_each_record_once(storage_uri: str) -> None:
    journal = journal_at(storage_uri)
    for i in range(20):
        journal.append(f"s{i}", "route", "Completed", {"i": i})
    storage = Storage(storage_uri)
    objects = len(storage.list_dir(PREFIX))  # a log on a local disk, 20 objects on S3
    assert objects == (1 if storage.is_local else 20)
    assert journal.compact() == objects
    assert storage.list_dir(PREFIX) == ["000000000000-000000000019.arrow"]
    reloaded = journal_at(storage_uri)
    assert [(r.seq, r.payload) for r in reloaded.records] == [(i, {"i": i}) for i in range(20)]
    for i in range(20, 28):
        assert reloaded.append(f"s{i}", "route", "Completed", {"i": i}).seq == i
    assert reloaded.compact() == (1 if storage.is_local else 8)
    assert storage.list_dir(PREFIX) == ["000000000000-000000000019.arrow", "000000000020-000000000027.arrow"]
    assert [r.seq for r in journal_at(storage_uri).records] == list(range(28))
    assert journal_at(storage_uri).compact() == 0, "a few new records are left as they are"


def test_a_crash_between_writing_a_chunk_and_deleting_its_segments_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    from nodus_ray.durable.journal import _encode_segment

    journal = journal_at(tmp_path)
    for i in range(10):
        journal.append(f"s{i}", "command", "Started", {"i": i})
    storage = Storage(str(tmp_path / "store"))
    # The chunk is written and the process dies before deleting what it replaces.
    storage.write_bytes(f"{PREFIX}/000000000000-000000000009.arrow", _encode_segment(journal.records))
    reloaded = journal_at(tmp_path)
    assert [r.seq for r in reloaded.records] == list(range(10))
    assert reloaded.append("next", "command", "Started").seq == 10
    reloaded.compact()
    assert storage.list_dir(PREFIX) == ["000000000000-000000000010.arrow"]
    assert [r.seq for r in journal_at(tmp_path).records] == list(range(11))


def test_many_chunks_are_merged_into_one(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    for round_ in range(17):
        for i in range(8):
            journal.append(f"s{round_}-{i}", "route", "Completed", {})
        journal.compact()
    storage = Storage(str(tmp_path / "store"))
    assert storage.list_dir(PREFIX) == ["000000000000-000000000135.arrow"]
    assert len(journal_at(tmp_path).records) == 136


def test_a_journal_missing_records_of_a_range_is_not_compacted_over_them(tmp_path: Path) -> None:
    writer = journal_at(tmp_path)
    for i in range(9):
        writer.append(f"s{i}", "route", "Completed", {})
    other = journal_at(tmp_path)  # another writer appended after this one loaded
    other.append("late", "resolution", "Resolved", {})
    assert writer.compact() == 1, "the writer folds the records it holds, 0-8, into a chunk"
    storage = Storage(str(tmp_path / "store"))
    assert storage.list_dir(PREFIX) == ["000000000000-000000000008.arrow", "000000000009.log"]
    assert len(journal_at(tmp_path).records) == 10
