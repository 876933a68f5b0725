"""A program's workspace follows its snapshots: the local one when it is as new as the newest
snapshot (same node), else the newest snapshot restored (another node, or a stale copy)."""

from __future__ import annotations

import shutil
from pathlib import Path

from nodus_ray.runtime.program.wiring import ensure_program_workspace
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.store.storage import Storage


def snapshots(tmp_path: Path) -> WorkspaceSnapshots:
    return WorkspaceSnapshots(Storage(str(tmp_path / "store")), "projects/p/agentruns/r", tmp_path / "ws")


def test_a_new_run_starts_empty_and_a_moved_run_gets_its_newest_snapshot(tmp_path: Path) -> None:
    workspace = snapshots(tmp_path)
    assert ensure_program_workspace(workspace) == "local"
    (tmp_path / "ws" / "state").mkdir(parents=True)
    (tmp_path / "ws" / "state" / "count").write_text("1")
    workspace.after_command(4)
    (tmp_path / "ws" / "state" / "count").write_text("2")
    workspace.after_command(9)
    assert ensure_program_workspace(snapshots(tmp_path)) == "local", "same node: the local copy is current"
    shutil.rmtree(tmp_path / "ws")  # another node: nothing here
    assert ensure_program_workspace(snapshots(tmp_path)) == "restored"
    assert (tmp_path / "ws" / "state" / "count").read_text() == "2"


def test_a_stale_local_copy_is_replaced_by_the_newer_snapshot(tmp_path: Path) -> None:
    workspace = snapshots(tmp_path)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "f").write_text("new")
    workspace.after_command(7)
    (tmp_path / "ws" / "f").write_text("stale")
    WorkspaceSnapshots.marker_of(tmp_path / "ws").write_text("3")  # this node last saw seq 3
    assert ensure_program_workspace(snapshots(tmp_path)) == "restored"
    assert (tmp_path / "ws" / "f").read_text() == "new"
