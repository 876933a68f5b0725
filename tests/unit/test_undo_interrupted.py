"""An interrupted command of a hermetic run is undone and runs again; other runs wait for a person."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from nodus_ray.durable.journal import Journal, JournalRecord
from nodus_ray.durable.steps import NeedsResolution, Steps
from nodus_ray.runtime.interrupted import command_attempts, undoable_command
from nodus_ray.sandbox.snapshots import NO_COMMAND
from nodus_ray.store.storage import Storage


def _record(seq: int, step: str, state: str, attempt: int = 1, kind: str = "command") -> JournalRecord:
    return JournalRecord(seq, step, kind, state, attempt, {}, "0", datetime.now(UTC))


def _undo(records: list[JournalRecord]) -> tuple[int, int] | None:
    return undoable_command(records, command_attempts(records))


def test_the_first_command_interrupted_is_undone_to_the_empty_workspace() -> None:
    records = [_record(0, "sandbox", "Completed", kind="sandbox"), _record(1, "c1", "Started")]
    assert _undo(records) == (1, NO_COMMAND)


def test_a_later_command_is_undone_to_the_state_after_the_last_completed_one() -> None:
    records = [
        _record(0, "c1", "Started"),
        _record(1, "c1", "Completed"),
        _record(2, "c2", "Started"),
        _record(3, "c2", "NoEffect"),  # undone once already
        _record(4, "c2", "Started", attempt=2),
    ]
    assert _undo(records) == (4, 0)


def test_nothing_to_undo_when_the_last_command_ended_or_waits_for_a_person() -> None:
    assert _undo([_record(0, "c1", "Started"), _record(1, "c1", "Completed")]) is None
    assert _undo([_record(0, "c1", "Started"), _record(1, "c1", "NeedsResolution")]) is None
    assert _undo([]) is None


def test_a_person_completed_command_since_the_last_snapshot_means_a_person_decides_again() -> None:
    records = [
        _record(0, "c1", "Started"),
        _record(1, "c1", "Resolved"),  # its workspace is in no snapshot
        _record(2, "c2", "Started"),
    ]
    assert _undo(records) is None


def _steps(tmp_path: Path) -> tuple[Journal, Steps]:
    journal = Journal(Storage(str(tmp_path)), "projects/p/agentruns/r/journal")
    journal.load()
    return journal, Steps(journal)


def test_an_undone_step_is_recorded_no_effect_and_runs_as_the_next_attempt(tmp_path: Path) -> None:
    journal, steps = _steps(tmp_path)
    journal.append("c1", "command", "Started", {"command": "echo"})
    ran: list[int] = []

    async def effect() -> dict[str, Any]:
        ran.append(1)
        return {"exit_code": 0}

    replay = Steps(journal)
    asked: list[int] = []

    def undone(record: JournalRecord) -> bool:
        asked.append(record.seq)
        return True

    result = asyncio.run(replay.run("c1", "command", effect, effect="external", retry_interrupted=undone))
    assert result == {"exit_code": 0} and ran == [1] and asked == [0]
    assert [(r.state, r.attempt) for r in journal.records] == [
        ("Started", 1),
        ("NoEffect", 1),
        ("Started", 2),
        ("Completed", 2),
    ]


def test_a_step_that_was_not_undone_waits_for_a_person(tmp_path: Path) -> None:
    journal, _ = _steps(tmp_path)
    journal.append("c1", "command", "Started", {"command": "curl"})

    async def effect() -> dict[str, Any]:
        raise AssertionError("an external step of unknown outcome must not run again by itself")

    with pytest.raises(NeedsResolution):
        asyncio.run(
            Steps(journal).run("c1", "command", effect, effect="external", retry_interrupted=lambda r: False)
        )
    assert [r.state for r in journal.records] == ["Started", "NeedsResolution"]
