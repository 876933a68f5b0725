"""The grader without Ray: which workspace it grades, and what a failing grader turns into."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nodus_ray.environments import GraderError, resolve
from nodus_ray.runtime.grader import Grader
from nodus_ray.sandbox.snapshots import UnsafeManifest, WorkspaceSnapshots, pack_files, seed_key
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

PREFIX = "projects/p/agentruns/r"


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage(str(tmp_path / "storage"))


def _grader(storage: Storage, tmp_path: Path) -> Grader:
    return Grader("p", "g", storage, str(tmp_path / "grading"), ())


def _case(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "runPrefix": PREFIX,
        "localWorkspace": str(tmp_path / "sandboxes" / "r"),
        "run": "r",
        "commands": 0,
        **extra,
    }


def _snapshot(storage: Storage, tmp_path: Path, seq: int, text: str) -> None:
    source = tmp_path / f"snap-{seq}"
    source.mkdir()
    (source / "out.txt").write_text(text)
    WorkspaceSnapshots(storage, PREFIX, source).after_command(seq)


def _local(tmp_path: Path, seq: int | None, text: str) -> Path:
    workspace = tmp_path / "sandboxes" / "r"
    workspace.mkdir(parents=True)
    (workspace / "out.txt").write_text(text)
    if seq is not None:
        WorkspaceSnapshots.marker_of(workspace).write_text(str(seq))
    return workspace


def test_the_local_workspace_wins_when_it_holds_the_later_command(storage: Storage, tmp_path: Path) -> None:
    _snapshot(storage, tmp_path, 3, "from the snapshot")
    _local(tmp_path, 5, "from this node")
    copy = _grader(storage, tmp_path)._workspace(_case(tmp_path, commands=2), tmp_path / "copy")
    assert copy.read_text("out.txt") == "from this node"


def test_a_stale_local_workspace_loses_to_the_snapshot(storage: Storage, tmp_path: Path) -> None:
    _snapshot(storage, tmp_path, 4, "from the snapshot")
    _local(tmp_path, 2, "left by an earlier attempt")
    copy = _grader(storage, tmp_path)._workspace(_case(tmp_path, commands=3), tmp_path / "copy")
    assert copy.read_text("out.txt") == "from the snapshot"


def test_a_run_without_commands_is_graded_on_its_seed(storage: Storage, tmp_path: Path) -> None:
    storage.write_bytes(seed_key(PREFIX), pack_files({"calc.py": "x = 1\n"}))
    copy = _grader(storage, tmp_path)._workspace(_case(tmp_path), tmp_path / "copy")
    assert copy.read_text("calc.py") == "x = 1\n"


def test_a_workspace_that_is_nowhere_fails_grading_that_reads_it(storage: Storage, tmp_path: Path) -> None:
    copy = _grader(storage, tmp_path)._workspace(_case(tmp_path, commands=1), tmp_path / "copy")
    with pytest.raises(GraderError, match="not available"):
        copy.read_text("out.txt")


def test_a_fifo_the_agent_left_is_not_copied(storage: Storage, tmp_path: Path) -> None:
    workspace = _local(tmp_path, 1, "kept")
    os.mkfifo(workspace / "trap")
    copy = _grader(storage, tmp_path)._workspace(_case(tmp_path, commands=1), tmp_path / "copy")
    assert copy.read_text("out.txt") == "kept" and not (tmp_path / "copy" / "trap").exists()


def test_grading_an_answer_scores_it_and_cleans_up(storage: Storage, tmp_path: Path) -> None:
    task = resolve("nodus/arithmetic-v2@2.0.0").tasks("test", 42, 1)[0]
    case = _case(
        tmp_path,
        environment="nodus/arithmetic-v2@2.0.0",
        split="test",
        seed=42,
        tasks=1,
        taskIndex=0,
        answer=f"It is {task.answer}.",
    )
    outcome = _grader(storage, tmp_path)._grade(case)
    assert (outcome["outcome"], outcome["verdict"], outcome["reward"]) == ("scored", "pass", 1.0)
    assert not (tmp_path / "grading" / "p" / "g" / "r").exists()


def test_a_crashing_grader_is_a_failure_that_names_only_the_error_type(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = resolve("nodus/arithmetic-v2@2.0.0")

    def crash(*_: Any) -> Any:
        raise ValueError("expected 42 but got 41")  # a message that quotes the hidden answer

    monkeypatch.setattr(type(environment), "grade", crash)
    case = _case(
        tmp_path, environment=environment.ref, split="test", seed=1, tasks=1, taskIndex=0, answer="41"
    )
    outcome = _grader(storage, tmp_path)._grade(case)
    assert outcome == {
        "outcome": "failed",
        "evidence": "the grader failed (ValueError)",
        "seconds": outcome["seconds"],
        "cpuSeconds": 0.0,  # no sandboxed command ran: nothing billed to the group
    }


def test_a_snapshot_stored_as_a_tar_gz_before_manifests_is_graded(storage: Storage, tmp_path: Path) -> None:
    storage.write_bytes(layout.workspace_snapshot(PREFIX, 4), pack_files({"out.txt": "from the old format"}))
    copy = _grader(storage, tmp_path)._workspace(_case(tmp_path, commands=1), tmp_path / "copy")
    assert copy.read_text("out.txt") == "from the old format"


def test_the_newest_snapshot_is_graded_with_its_symlinks_and_nothing_outside(
    storage: Storage, tmp_path: Path
) -> None:
    source = tmp_path / "snap"
    (source / "src").mkdir(parents=True)
    (source / "src" / "out.txt").write_text("linked")
    (source / "out.txt").symlink_to("src/out.txt")
    WorkspaceSnapshots(storage, PREFIX, source).after_command(6)
    copy = _grader(storage, tmp_path)._workspace(_case(tmp_path, commands=1), tmp_path / "copy")
    assert copy.read_text("out.txt") == "linked"
    (source / "escape").symlink_to("/etc/passwd")
    WorkspaceSnapshots(storage, PREFIX, source).after_command(7)
    with pytest.raises(UnsafeManifest, match="absolute"):
        _grader(storage, tmp_path)._workspace(_case(tmp_path, commands=2), tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
