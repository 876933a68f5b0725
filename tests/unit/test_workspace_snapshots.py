"""A workspace follows its run: snapshots after commands, restore on another node, or refuse."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from nodus_ray.sandbox.snapshots import NO_COMMAND, WorkspaceLost, WorkspaceSnapshots, accepted_states
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _blobs(snapshots: WorkspaceSnapshots) -> set[str]:
    return set(snapshots.storage.list_dir(layout.workspace_blobs_folder(snapshots.prefix)))


def _snapshots(tmp_path: Path, node: str, **options: object) -> WorkspaceSnapshots:
    storage = Storage(str(tmp_path / "storage"))
    return WorkspaceSnapshots(storage, "projects/p/agentruns/r", tmp_path / node / "r", **options)  # type: ignore[arg-type]


def test_a_run_moved_to_a_node_without_its_workspace_gets_the_snapshot_of_its_last_command(
    tmp_path: Path,
) -> None:
    first = _snapshots(tmp_path, "node-a")
    first.workspace.mkdir(parents=True)
    (first.workspace / "notes").mkdir()
    (first.workspace / "notes" / "a.txt").write_text("one\n")
    first.after_command(7)
    (first.workspace / "notes" / "a.txt").write_text("one\ntwo\n")
    first.after_command(12)
    assert first.stored_seq() == 12
    # The one before the newest stays, so an interrupted next command can be undone.
    assert first.storage.list_dir("projects/p/agentruns/r/workspace") == [
        "000000000007.manifest.json",
        "000000000012.manifest.json",
        "blobs",
    ]

    moved = _snapshots(tmp_path, "node-b")
    assert moved.ensure(accepted_states([(7, True), (12, True)])) == "restored"
    assert (moved.workspace / "notes" / "a.txt").read_text() == "one\ntwo\n"
    assert moved.local_seq() == 12
    # The node it came from still has the same state: nothing to restore there.
    assert first.ensure((12,)) == "local"


def test_a_stale_or_missing_workspace_without_a_fitting_snapshot_fails_with_a_reason(tmp_path: Path) -> None:
    here = _snapshots(tmp_path, "node-a", enabled=False)
    here.workspace.mkdir(parents=True)
    here.after_command(3)
    elsewhere = _snapshots(tmp_path, "node-b", enabled=False)
    with pytest.raises(WorkspaceLost, match="snapshots are off"):
        elsewhere.ensure((3,))
    assert not elsewhere.workspace.exists()
    with pytest.raises(WorkspaceLost, match="seq 9"):
        here.ensure((9,))  # the local directory is older than the journal


def test_an_interrupted_last_command_accepts_the_state_before_it(tmp_path: Path) -> None:
    assert accepted_states([]) == ()
    assert accepted_states([(4, True)]) == (4,)
    assert accepted_states([(4, False)]) == (4, NO_COMMAND)
    assert accepted_states([(4, True), (9, False)]) == (9, 4)
    fresh = _snapshots(tmp_path, "node-a")
    assert fresh.ensure(accepted_states([(4, False)])) == "local", "the first command may not have run"


def test_a_workspace_over_the_limit_is_not_snapshotted_and_a_move_says_so(tmp_path: Path) -> None:
    big = _snapshots(tmp_path, "node-a", limit_bytes=1024)
    big.workspace.mkdir(parents=True)
    (big.workspace / "blob").write_bytes(b"x" * 4096)
    big.after_command(5)
    assert big.skipped_for_size and big.stored_seq() is None
    assert big.ensure((5,)) == "local"
    with pytest.raises(WorkspaceLost, match="no snapshot"):
        _snapshots(tmp_path, "node-b", limit_bytes=1024).ensure((5,))


def test_a_snapshot_cannot_write_outside_the_workspace_when_restored(tmp_path: Path) -> None:
    source = _snapshots(tmp_path, "node-a")
    source.workspace.mkdir(parents=True)
    (source.workspace / "escape").symlink_to("/etc/passwd")
    source.after_command(1)
    target = _snapshots(tmp_path, "node-b")
    with pytest.raises(Exception, match="outside|absolute|link"):
        target.ensure((1,))


def test_forget_removes_the_marker_and_the_snapshots(tmp_path: Path) -> None:
    snapshots = _snapshots(tmp_path, "node-a")
    snapshots.workspace.mkdir(parents=True)
    snapshots.after_command(2)
    snapshots.forget()
    assert snapshots.stored_seq() is None
    assert not WorkspaceSnapshots.marker_of(snapshots.workspace).exists()


def test_an_interrupted_command_is_undone_from_storage_not_from_the_half_changed_local_copy(
    tmp_path: Path,
) -> None:
    here = _snapshots(tmp_path, "node-a")
    here.workspace.mkdir(parents=True)
    (here.workspace / "a.txt").write_text("one\n")
    here.after_command(7)
    (here.workspace / "a.txt").write_text("one\ntwo\n")
    here.after_command(12)
    (here.workspace / "a.txt").write_text("one\ntwo\nthr")  # command 15, interrupted mid-write
    (here.workspace / "b.txt").write_text("half")
    here.after_command(15)  # it even got as far as its snapshot, then died before Completed
    assert here.storage.list_dir("projects/p/agentruns/r/workspace") == [
        "000000000012.manifest.json",
        "000000000015.manifest.json",
        "blobs",
    ], "all but the newest two go"

    assert here.restore_state(12) is True
    assert sorted(p.name for p in here.workspace.iterdir()) == ["a.txt"]
    assert (here.workspace / "a.txt").read_text() == "one\ntwo\n"
    assert here.local_seq() == 12
    assert here.stored_seq() == 12, "the undone command's snapshot is gone"
    here.after_command(18)  # the command again, as its next attempt: the state before it stays
    assert here.storage.list_dir("projects/p/agentruns/r/workspace") == [
        "000000000012.manifest.json",
        "000000000018.manifest.json",
        "blobs",
    ]
    assert _blobs(here) == {_sha(b"one\ntwo\n")}, "the undone command's blobs went with it"
    assert here.restore_state(12) is True
    assert here.restore_state(7) is False, "a state no longer stored cannot be restored"
    assert here.restore_state(NO_COMMAND) is True
    assert list(here.workspace.iterdir()) == [] and here.local_seq() == NO_COMMAND
