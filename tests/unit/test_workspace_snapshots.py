"""A workspace follows its run: snapshots after commands, restore on another node, or refuse."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from nodus_ray.sandbox import workspace_manifest
from nodus_ray.sandbox.snapshots import (
    NO_COMMAND,
    UnsafeManifest,
    WorkspaceLost,
    WorkspaceSnapshots,
    accepted_states,
)
from nodus_ray.sandbox.workspace_manifest import encode_blob
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


class _CountingStorage(Storage):
    """Real storage that remembers the keys written (what a snapshot uploaded)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.written: list[str] = []

    def write_bytes(self, key: str, data: bytes) -> None:
        self.written.append(key)
        super().write_bytes(key, data)


def _counting(tmp_path: Path, node: str) -> WorkspaceSnapshots:
    storage = _CountingStorage(str(tmp_path / "storage"))
    return WorkspaceSnapshots(storage, "projects/p/agentruns/r", tmp_path / node / "r")


def _written(snapshots: WorkspaceSnapshots) -> list[str]:
    assert isinstance(snapshots.storage, _CountingStorage)
    written, snapshots.storage.written = snapshots.storage.written, []
    return [key.rsplit("/workspace/", 1)[1] for key in written]


def test_an_unchanged_workspace_uploads_only_its_manifest_and_a_changed_file_one_blob(tmp_path: Path) -> None:
    here = _counting(tmp_path, "node-a")
    here.workspace.mkdir(parents=True)
    for index in range(5):
        (here.workspace / f"f{index}.txt").write_text(f"file {index}\n")
    (here.workspace / "copy.txt").write_text("file 0\n")  # the same content: one blob
    here.after_command(1)
    assert sorted(_written(here)) == sorted(
        ["000000000001.manifest.json", *("blobs/" + _sha(f"file {i}\n".encode()) for i in range(5))]
    )
    here.after_command(2)
    assert _written(here) == ["000000000002.manifest.json"], "nothing changed: no file data"
    (here.workspace / "f3.txt").write_text("changed\n")
    here.after_command(3)
    assert _written(here) == ["blobs/" + _sha(b"changed\n"), "000000000003.manifest.json"]
    # A new actor of the run (same storage) knows the stored blobs from the kept manifests.
    again = _counting(tmp_path, "node-a")
    again.storage = here.storage
    again.after_command(4)
    assert _written(again) == ["000000000004.manifest.json"]


def test_unchanged_files_are_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Files changed within a moment of a snapshot are read again by the next one (their ctime
    # could not show a later change): here no such moment, so only the changed file is read.
    monkeypatch.setattr(workspace_manifest, "_RACY_NS", 0)
    here = _snapshots(tmp_path, "node-a")
    (here.workspace / "src").mkdir(parents=True)
    for index in range(4):
        (here.workspace / "src" / f"m{index}.py").write_text(f"x = {index}\n")
    here.after_command(1)
    assert sorted(here.last_read) == [f"src/m{index}.py" for index in range(4)]
    (here.workspace / "src" / "m2.py").write_text("x = 22\n")
    here.after_command(2)
    assert here.last_read == ["src/m2.py"]
    here.after_command(3)
    assert here.last_read == []
    os.chmod(here.workspace / "src" / "m1.py", 0o600)  # a chmod changes ctime: read again
    here.after_command(4)
    assert here.last_read == ["src/m1.py"]


def test_a_file_changed_within_a_moment_of_the_snapshot_is_read_again(tmp_path: Path) -> None:
    here = _snapshots(tmp_path, "node-a")
    here.workspace.mkdir(parents=True)
    (here.workspace / "a.txt").write_text("one")
    here.after_command(1)
    here.after_command(2)
    assert here.last_read == ["a.txt"], "its ctime is too close to the last snapshot to be trusted"


def test_blobs_no_kept_manifest_references_are_deleted(tmp_path: Path) -> None:
    here = _snapshots(tmp_path, "node-a")
    here.workspace.mkdir(parents=True)
    (here.workspace / "keep.txt").write_text("always")
    for seq, text in ((1, "v1"), (2, "v2"), (3, "v3")):
        (here.workspace / "a.txt").write_text(text)
        here.after_command(seq)
    assert _blobs(here) == {_sha(b"always"), _sha(b"v2"), _sha(b"v3")}
    assert here.storage.list_dir(layout.workspace_folder(here.prefix)) == [
        "000000000002.manifest.json",
        "000000000003.manifest.json",
        "blobs",
    ]
    here.forget()
    assert here.storage.list_dir(layout.workspace_folder(here.prefix)) == [], "blobs go with the folder"


def test_a_move_to_another_node_restores_files_modes_and_symlinks_exactly(tmp_path: Path) -> None:
    first = _snapshots(tmp_path, "node-a")
    root = first.workspace
    (root / "bin").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "deep" / "er").mkdir(parents=True)
    (root / "bin" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "bin" / "run.sh", 0o755)
    (root / "private.txt").write_text("mine")
    os.chmod(root / "private.txt", 0o600)
    (root / "deep" / "er" / "data.bin").write_bytes(bytes(range(256)) * 1000)
    (root / "empty.txt").write_bytes(b"")
    os.chmod(root / "deep", 0o750)
    (root / "deep" / "er" / "up").symlink_to("../../private.txt")
    (root / "tools").symlink_to("bin")
    (root / "dangling").symlink_to("not-there-yet")
    os.utime(root / "private.txt", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    first.after_command(9)

    moved = _snapshots(tmp_path, "node-b")
    assert moved.ensure((9,)) == "restored"
    assert _tree(moved.workspace) == _tree(root)
    assert (moved.workspace / "tools" / "run.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert (moved.workspace / "deep" / "er" / "up").read_text() == "mine"
    assert moved.local_seq() == 9


def _tree(root: Path) -> dict[str, tuple[object, ...]]:
    """What a restore must keep of each entry: its type, mode, mtime, content or target."""
    tree: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        relative = str(path.relative_to(root))
        if path.is_symlink():
            tree[relative] = ("symlink", os.readlink(path))
        elif path.is_dir():
            tree[relative] = ("dir", stat.S_IMODE(info.st_mode), info.st_mtime_ns)
        else:
            tree[relative] = ("file", stat.S_IMODE(info.st_mode), info.st_mtime_ns, path.read_bytes())
    return tree


def _forged(
    tmp_path: Path, entries: Sequence[Mapping[str, object]], blobs: dict[str, bytes] | None = None
) -> Path:
    """A manifest as a compromised workspace (or storage) could make it; unpacked on the host."""
    snapshots = _snapshots(tmp_path, "node-b")
    for digest, data in (blobs or {}).items():
        snapshots.storage.write_bytes(layout.workspace_blob(snapshots.prefix, digest), encode_blob(data))
    defaults = {"mode": 0o644, "size": 0, "mtime_ns": 0}
    document = {"version": 1, "seq": 3, "takenNs": 0, "entries": [{**defaults, **e} for e in entries]}
    snapshots.storage.write_json(layout.workspace_manifest(snapshots.prefix, 3), document)
    into = tmp_path / "grading" / "r"
    with pytest.raises(UnsafeManifest):
        snapshots.unpack(3, into)
    assert not into.exists(), "what was unpacked before the refusal is removed"
    with pytest.raises(UnsafeManifest):
        snapshots.ensure((3,))
    assert not snapshots.workspace.exists() and snapshots.local_seq() is None
    return into


@pytest.mark.parametrize(
    "entries",
    [
        [{"path": "etc-link", "type": "symlink", "target": "/etc"}],
        [{"path": "up", "type": "symlink", "target": "../outside"}],
        [{"path": "d", "type": "dir"}, {"path": "d/up", "type": "symlink", "target": "../../outside"}],
        # Each link stays inside on its own; together they lead out of the directory.
        [
            {"path": "self", "type": "symlink", "target": "."},
            {"path": "out", "type": "symlink", "target": "self/.."},
        ],
        [{"path": "../outside", "type": "dir"}],
        [{"path": "a/../../outside", "type": "dir"}],
        [{"path": "/tmp/outside", "type": "dir"}],
        [{"path": "", "type": "dir"}],
        [{"path": "fifo", "type": "fifo"}],
        [{"path": "x", "type": "dir"}, {"path": "x", "type": "dir"}],
        [{"path": "missing-parent/f", "type": "file", "sha256": _sha(b"x")}],
    ],
    ids=[
        "absolute-target",
        "target-outside",
        "nested-target-outside",
        "links-chained-outside",
        "dotdot-path",
        "dotdot-inside-path",
        "absolute-path",
        "empty-path",
        "special-file",
        "duplicate",
        "no-parent",
    ],
)
def test_a_manifest_that_would_leave_the_directory_is_refused(
    tmp_path: Path, entries: list[dict[str, object]]
) -> None:
    into = _forged(tmp_path, entries)
    assert not (tmp_path / "outside").exists() and not Path("/tmp/outside").exists()
    assert not (tmp_path / "grading" / "outside").exists()
    assert into.parent.is_dir()


def test_an_entry_under_a_symlink_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = [
        {"path": "link", "type": "symlink", "target": "."},
        {"path": "link/f", "type": "file", "sha256": _sha(b"pwned")},
    ]
    _forged(tmp_path, entries, {_sha(b"pwned"): b"pwned"})
    assert list(outside.iterdir()) == []


def test_a_blob_that_does_not_match_its_digest_or_size_is_refused(tmp_path: Path) -> None:
    good = [{"path": "f", "type": "file", "sha256": _sha(b"good"), "size": 4}]
    _forged(tmp_path / "evil", good, {_sha(b"good"): b"evil"})
    _forged(tmp_path / "bomb", good, {_sha(b"good"): b"good" * 10_000_000})  # never inflated whole


def test_a_snapshot_stored_as_a_tar_gz_before_manifests_still_restores(tmp_path: Path) -> None:
    old = _snapshots(tmp_path, "node-a")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = b"from the old format\n"
        info = tarfile.TarInfo("notes/a.txt")
        info.size, info.mode = len(data), 0o644
        archive.addfile(info, io.BytesIO(data))
    old.storage.write_bytes(layout.workspace_snapshot(old.prefix, 6), buffer.getvalue())
    assert old.stored_seq() == 6
    assert old.ensure((6,)) == "restored"
    assert (old.workspace / "notes" / "a.txt").read_text() == "from the old format\n"
    (old.workspace / "notes" / "a.txt").write_text("new\n")
    old.after_command(8)
    folder = layout.workspace_folder(old.prefix)
    assert old.storage.list_dir(folder) == ["000000000006.tar.gz", "000000000008.manifest.json", "blobs"]
    assert old.restore_state(6) is True, "the old form is still the state before the newest"
    assert (old.workspace / "notes" / "a.txt").read_text() == "from the old format\n"
    assert old.storage.list_dir(folder) == ["000000000006.tar.gz", "blobs"]
    assert _blobs(old) == set(), "the undone manifest's blob went with it"
    old.after_command(9)
    old.after_command(10)
    assert old.storage.list_dir(folder) == [
        "000000000009.manifest.json",
        "000000000010.manifest.json",
        "blobs",
    ]
