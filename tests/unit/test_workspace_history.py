"""Workspace snapshots with history (decision 58): every command's state stays, for forks."""

from __future__ import annotations

import hashlib
from pathlib import Path

from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Reads(Storage):
    """Real storage that counts the manifests read (a new actor must not read every one)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.manifests_read = 0

    def read_json(self, key: str):  # type: ignore[no-untyped-def]
        if key.endswith(".manifest.json"):
            self.manifests_read += 1
        return super().read_json(key)


def _history(tmp_path: Path, node: str, storage: Storage | None = None) -> WorkspaceSnapshots:
    storage = storage or Storage(str(tmp_path / "storage"))
    return WorkspaceSnapshots(storage, "projects/p/agentruns/r", tmp_path / node / "r", history=True)


def _manifests(snapshots: WorkspaceSnapshots) -> list[str]:
    return [n for n in snapshots.storage.list_dir(layout.workspace_folder(snapshots.prefix)) if n != "blobs"]


def test_every_commands_state_stays_and_each_can_be_restored(tmp_path: Path) -> None:
    here = _history(tmp_path, "node-a")
    here.workspace.mkdir(parents=True)
    for seq in (3, 7, 12):
        (here.workspace / f"f{seq}.txt").write_text(f"{seq}\n")
        here.after_command(seq)
    assert _manifests(here) == [f"{seq:012d}.manifest.json" for seq in (3, 7, 12)]
    for seq, files in ((3, ["f3.txt"]), (7, ["f3.txt", "f7.txt"])):
        into = tmp_path / f"at-{seq}"
        here.unpack(seq, into)
        assert sorted(p.name for p in into.iterdir()) == files


def test_a_new_actor_reads_the_newest_manifest_only_and_uploads_only_new_content(tmp_path: Path) -> None:
    first = _history(tmp_path, "node-a")
    first.workspace.mkdir(parents=True)
    (first.workspace / "big.txt").write_text("big\n")
    for seq in range(1, 6):
        (first.workspace / "n.txt").write_text(f"{seq}\n")
        first.after_command(seq)
    storage = _Reads(str(tmp_path / "storage"))
    later = _history(tmp_path, "node-a", storage)  # the same directory, a new actor
    later.after_command(6)
    assert storage.manifests_read == 1, "the newest one, which the scan compares against"
    assert len(_manifests(later)) == 6


def test_an_undone_command_drops_only_the_states_after_it_and_their_own_blobs(tmp_path: Path) -> None:
    here = _history(tmp_path, "node-a")
    here.workspace.mkdir(parents=True)
    (here.workspace / "a.txt").write_text("one\n")
    here.after_command(1)
    (here.workspace / "a.txt").write_text("two\n")
    here.after_command(2)
    (here.workspace / "b.txt").write_text("half")  # command 3, interrupted after its snapshot
    here.after_command(3)
    fresh = _history(tmp_path, "node-b")  # the actor that undoes it
    assert fresh.restore_state(2) is True
    assert _manifests(fresh) == [f"{seq:012d}.manifest.json" for seq in (1, 2)]
    blobs = set(fresh.storage.list_dir(layout.workspace_blobs_folder(fresh.prefix)))
    assert blobs == {_sha(b"one\n"), _sha(b"two\n")}, "state 1's content stays; command 3's goes"
