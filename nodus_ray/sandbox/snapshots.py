"""A run's workspace follows it to another node: a snapshot in storage after every command.

The journal makes a run's *steps* survive anything, but a sandbox command's effects live in
the workspace directory, on the disk of the node the run ran on. When the run's actor starts
on another node (its node died, or ``ray stop`` and the next cluster placed it elsewhere) the
journal says "``ls`` printed ``report.txt``" while the new node has no ``report.txt``. Replaying
on an empty workspace would silently diverge from what the model was told.

So after every command, inside the command's step (before its ``Completed`` is written), the
actor writes

* a marker beside the workspace (``.<run>.workspace``, outside the sandbox's reach) naming the
  command's journal sequence number: "this directory holds the effects up to that command";
* a snapshot of the workspace to storage: a small manifest, ``<run prefix>/workspace/
  <seq>.manifest.json``, listing every directory, file (size, mode, mtime, sha256 of its
  content) and symlink (its target), and each file content once, under ``workspace/blobs/
  <sha256>`` (`workspace_manifest`). Only content no kept manifest holds is uploaded, and a
  file whose size, mtime, inode and ctime are those of the previous manifest is not even read,
  so a command that changed one small file of a 50 MB repository uploads that file and a
  manifest, and a command that changed nothing uploads only the manifest (it is still written:
  the state must be restorable by its seq on another node). Once the new manifest is stored,
  all manifests but it and the one before it are deleted, and then the blobs that only the
  deleted ones referenced. A crash between the two only leaks blobs: they go with the whole
  ``workspace`` folder when the run is forgotten or its retention is up.

Because both happen before ``Completed``, every completed command's effects are in the
snapshot. When an actor opens the sandbox of a run that has run commands, `WorkspaceSnapshots.
ensure` uses the local directory if its marker matches the journal, else restores the snapshot
that does, else raises `WorkspaceLost`: the run fails and says why instead of continuing on
the wrong files. If the last command was interrupted (its outcome is unknown, the run will
park for a resolution), the state just before it is accepted too.

A run may start from a *seed*: files its evaluation task gives the agent, stored as
``<run prefix>/seed.tar.gz`` before the run is created (`pack_files`). A seeded run's first
workspace is the seed, unpacked beside the workspace and renamed into place, so a crash
mid-unpack never leaves half a seed that looks like a whole one.

A run's actor keeps every command's manifest (``history``, decision 58): a fork of the run
may start from the workspace after any of its commands, and content-addressed blobs make an
older state cost its manifest and the contents no later state holds. A new actor then reads
only the newest manifest (what the next scan compares against), the others when an undo needs
them. Without ``history`` (the grader's copies) the newest two are kept.

The snapshot before the newest is kept so that an interrupted command can be undone: a run
whose sandbox reaches nothing outside (no ``allowedHosts``) has no effect but its workspace,
so when its command was interrupted, `restore_state` puts back the workspace as it was before
that command (never the local copy, which the command may have half changed) and the command
simply runs again, as if it ran once.

A workspace over ``limit_bytes`` (its files' sizes together) is not snapshotted (the local
directory still works; only a move to another node then fails with `WorkspaceLost`, naming the
limit).

A restore (`ensure`, `restore_state`, the grader's `WorkspaceSnapshots.unpack`) refuses what
could write outside the directory or through a link (`workspace_manifest.unpack`): the
manifest describes a directory that sandboxed code controlled, and the actor runs on the host.
Storage written before manifests holds ``<seq>.tar.gz`` snapshots of the whole workspace; they
are still restored (with ``tarfile``'s ``filter="data"``) and count as stored states.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from nodus_ray.sandbox.workspace_manifest import (
    TRANSFERS,
    Manifest,
    Scan,
    TooLarge,
    UnsafeManifest,
    encode_blob,
    scan,
)
from nodus_ray.sandbox.workspace_manifest import unpack as unpack_manifest
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

__all__ = [
    "WorkspaceLost",
    "WorkspaceSnapshots",
    "UnsafeManifest",
    "DEFAULT_SNAPSHOT_LIMIT_BYTES",
    "NO_COMMAND",
    "accepted_states",
    "seed_key",
    "pack_files",
]

DEFAULT_SNAPSHOT_LIMIT_BYTES = 64 * 1024 * 1024
NO_COMMAND = -1  # the state of a workspace before the run's first command


def seed_key(prefix: str) -> str:
    """Where a seeded run's first workspace is stored (under the run's storage prefix)."""
    return layout.seed(prefix)


def pack_files(files: dict[str, str]) -> bytes:
    """A seed: ``{relative path: text}`` as a tar.gz (paths are checked to stay inside)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
        for path, text in sorted(files.items()):
            parts = Path(path).parts
            if not parts or Path(path).is_absolute() or ".." in parts:
                raise ValueError(f"seed file path {path!r} must be relative and stay in the workspace")
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name=str(Path(*parts)))
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class WorkspaceLost(Exception):
    """The workspace this run's journal describes is neither here nor in a snapshot."""


@dataclass
class WorkspaceSnapshots:
    storage: Storage
    prefix: str  # the run's storage prefix; snapshots go under ``<prefix>/workspace``
    workspace: Path
    limit_bytes: int = DEFAULT_SNAPSHOT_LIMIT_BYTES
    enabled: bool = True
    seeded: bool = False  # the run starts from ``seed.tar.gz`` instead of an empty workspace
    skipped_for_size: bool = False
    # Raises when a newer actor of the run took over (`durable.fencing`): checked before the
    # snapshot is stored and before older ones (and their blobs) are deleted, so a zombie never
    # replaces them.
    fence: Callable[[str], None] | None = None
    # Keep every command's manifest, not only the newest two: the states a fork can start from
    # (`control.forks`, decision 58). Manifests are then read when needed, not all at start.
    history: bool = False
    last_read: list[str] = field(default_factory=list, init=False)  # files the last snapshot read
    # What is in storage, read once per actor (an earlier actor may have left several), then
    # known, so a command costs its new blobs, one manifest and the deletes, not a listing too:
    # each stored seq's form ("manifest" or an old "tar"), the stored manifests, the blobs they hold.
    _stored: dict[int, str] | None = field(default=None, init=False, repr=False)
    _manifests: dict[int, Manifest] = field(default_factory=dict, init=False, repr=False)
    _known: set[str] = field(default_factory=set, init=False, repr=False)

    @staticmethod
    def marker_of(workspace: Path) -> Path:
        """Beside the workspace, not in it: a sandboxed command cannot forge it."""
        return workspace.parent / f".{workspace.name}.workspace"

    @property
    def _marker(self) -> Path:
        return self.marker_of(self.workspace)

    @property
    def _folder(self) -> str:
        return layout.workspace_folder(self.prefix)

    def local_seq(self) -> int | None:
        """The last command whose effects the local directory holds: None when there is no
        directory, `NO_COMMAND` when there is one that no command of this run touched."""
        if not self.workspace.is_dir():
            return None
        try:
            return int(self._marker.read_text())
        except FileNotFoundError:
            return NO_COMMAND
        except (OSError, ValueError):
            return None

    def _list(self) -> dict[int, str]:
        """The stored states by seq: a manifest, or a tar.gz from before manifests."""
        stored: dict[int, str] = {}
        for name in self.storage.list_dir(self._folder):
            number, _, rest = name.partition(".")
            if number.isdigit() and rest in ("manifest.json", "tar.gz"):
                if rest == "manifest.json" or int(number) not in stored:
                    stored[int(number)] = "manifest" if rest == "manifest.json" else "tar"
        return stored

    def stored_seq(self) -> int | None:
        """The command the newest snapshot in storage (a manifest or an old tar.gz) was taken after."""
        return max(self._list(), default=None)

    def _load(self) -> dict[int, str]:
        if self._stored is None:
            self._stored = self._list()
            manifests = [seq for seq, form in self._stored.items() if form == "manifest"]
            wanted = manifests[-1:] if self.history else manifests  # `_manifest` reads the rest
            self._manifests = {seq: self._read_manifest(seq) for seq in sorted(wanted)}
            self._known = set().union(*(m.digests() for m in self._manifests.values()))
        return self._stored

    def _manifest(self, seq: int) -> Manifest:
        if seq not in self._manifests:
            self._manifests[seq] = self._read_manifest(seq)
        return self._manifests[seq]

    def _read_manifest(self, seq: int) -> Manifest:
        return Manifest.from_json(self.storage.read_json(layout.workspace_manifest(self.prefix, seq)))

    def after_command(self, seq: int) -> None:
        """Record that the workspace now holds the effects of command ``seq`` (see the module)."""
        _write_durably(self._marker, str(seq))
        if not self.enabled:
            return
        stored = self._load()
        previous = max((s for s, form in stored.items() if s < seq and form == "manifest"), default=None)
        for _attempt in range(3):  # again if a file changed while it was read (nothing should run)
            try:
                found = scan(
                    self.workspace,
                    self._manifest(previous) if previous is not None else None,
                    self._known,
                    self.limit_bytes,
                )
            except TooLarge:
                self.skipped_for_size = True
                return
            self.skipped_for_size = False
            if self.fence is not None:
                self.fence(f"before the snapshot after command {seq}")
            self.last_read = found.read
            if self._upload(found):
                break
        else:
            raise RuntimeError(
                f"the workspace kept changing while its snapshot after command {seq} was taken"
            )
        self.storage.write_json(layout.workspace_manifest(self.prefix, seq), found.manifest.to_json(seq))
        if stored.get(seq) == "tar":  # an older actor's snapshot of the same seq
            self.storage.delete(layout.workspace_snapshot(self.prefix, seq))
        stored[seq] = "manifest"
        self._manifests[seq] = found.manifest
        # This one and the one before it stay (`restore_state`); with history, every one.
        kept = sorted(stored) if self.history else sorted(stored)[-2:]
        self._drop([s for s in stored if s not in kept], f"after the snapshot after command {seq}")

    def _upload(self, found: Scan) -> bool:
        """Store the blobs the scan found new, a few at once (on S3 each is a request); False if
        a file no longer has the digest it had when it was scanned."""

        def upload(item: tuple[str, Path]) -> bool:
            digest, path = item
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return False
            if hashlib.sha256(data).hexdigest() != digest:
                return False
            self.storage.write_bytes(layout.workspace_blob(self.prefix, digest), encode_blob(data))
            return True

        items = list(found.to_upload.items())
        if len(items) <= 1:
            stored = [upload(item) for item in items]
        else:
            with ThreadPoolExecutor(max_workers=TRANSFERS) as pool:
                stored = list(pool.map(upload, items))
        self._known.update(digest for (digest, _), done in zip(items, stored, strict=True) if done)
        return all(stored)

    def _drop(self, seqs: list[int], where: str) -> None:
        """Delete these stored states, then the blobs that no remaining manifest references."""
        stored = self._load()
        if seqs:  # what stays must be known to tell which blobs only the dropped ones hold
            for seq, form in stored.items():
                if form == "manifest":
                    self._manifest(seq)
        for seq in seqs:
            form = stored.pop(seq)
            key = layout.workspace_manifest if form == "manifest" else layout.workspace_snapshot
            self.storage.delete(key(self.prefix, seq))
        dropped = [self._manifests.pop(s) for s in seqs if s in self._manifests]
        garbage = set().union(*(m.digests() for m in dropped)) - set().union(
            *(m.digests() for m in self._manifests.values())
        )
        if garbage and self.fence is not None:
            self.fence(f"before deleting blobs {where}")
        for digest in sorted(garbage):
            self.storage.delete(layout.workspace_blob(self.prefix, digest))
        self._known -= garbage

    def _seed(self) -> None:
        data = self.storage.read_bytes(seed_key(self.prefix))
        staging = self.workspace.with_name(f".{self.workspace.name}.seeding")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True, mode=0o700)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            archive.extractall(staging, filter="data")
        os.rename(staging, self.workspace)

    def ensure(self, accepted: tuple[int, ...]) -> str:
        """Make the local workspace one of the ``accepted`` states; say which way it got there.

        ``accepted`` is empty when the run never ran a command (any workspace will do, a new
        one is created by the sandbox). Returns ``"local"`` or ``"restored"`` (`SandboxStatus.origin`).
        """
        local = self.local_seq()
        if self.seeded and local is None and (not accepted or NO_COMMAND in accepted):
            self._seed()
            return "restored"
        if not accepted or local in accepted or (local is None and NO_COMMAND in accepted):
            return "local"
        stored = self.stored_seq() if self.enabled else None
        if stored in accepted:
            self._restore(stored)
            return "restored"
        why = (
            "snapshots are off (NODUS_WORKSPACE_SNAPSHOTS=off)"
            if not self.enabled
            else f"the newest snapshot in storage is from step seq {stored}"
            if stored is not None
            else f"no snapshot is in storage (a workspace over {self.limit_bytes // (1024 * 1024)} MiB "
            "is not snapshotted)"
        )
        raise WorkspaceLost(
            f"the workspace on this node does not hold the effects of the run's commands (up to "
            f"journal seq {max(accepted)}) and cannot be restored: {why}"
        )

    def unpack(self, seq: int, into: Path) -> None:
        """Create ``into`` (removed first if it exists) holding the stored state after command
        ``seq``; FileNotFoundError when it is not stored, `UnsafeManifest` (or ``tarfile``'s
        filter error) when it would write outside ``into`` or through a link."""
        shutil.rmtree(into, ignore_errors=True)
        into.parent.mkdir(parents=True, exist_ok=True)
        try:
            document = self.storage.read_json(layout.workspace_manifest(self.prefix, seq))
        except FileNotFoundError:
            document = None
            data = self.storage.read_bytes(layout.workspace_snapshot(self.prefix, seq))
        try:
            if document is None:  # stored before manifests
                into.mkdir(mode=0o700)
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
                    # "data": no absolute paths, no links out of the directory, no device files.
                    archive.extractall(into, filter="data")
            else:
                unpack_manifest(
                    Manifest.from_json(document),
                    into,
                    lambda digest: self.storage.read_bytes(layout.workspace_blob(self.prefix, digest)),
                )
        except BaseException:
            shutil.rmtree(into, ignore_errors=True)  # never leave a link that was refused
            raise

    def _restore(self, seq: int) -> None:
        # Built beside the workspace, then swapped in: a crash mid-restore leaves the old
        # directory or none, never half of one under the old marker.
        staging = self.workspace.with_name(f".{self.workspace.name}.restoring")
        trash = self.workspace.with_name(f".{self.workspace.name}.replaced")
        shutil.rmtree(trash, ignore_errors=True)
        self.unpack(seq, staging)
        if self.workspace.exists():
            os.rename(self.workspace, trash)
        os.rename(staging, self.workspace)
        _write_durably(self._marker, str(seq))
        shutil.rmtree(trash, ignore_errors=True)

    def restore_state(self, seq: int) -> bool:
        """Make the workspace what it was after command ``seq`` (`NO_COMMAND`: before any), from
        storage only; False (nothing changed) when that state is not stored."""
        if seq == NO_COMMAND:
            shutil.rmtree(self.workspace, ignore_errors=True)
            self._marker.unlink(missing_ok=True)
            if self.seeded:
                self._seed()
            else:
                self.workspace.mkdir(parents=True, mode=0o700)
        elif not self.enabled or seq not in self._list():
            return False
        else:
            self._restore(seq)
        # A snapshot taken after ``seq`` holds an undone command's effects: it must never be
        # restored, nor push the state restored here out of the two kept (`after_command`).
        if self.fence is not None:
            self.fence(f"before dropping snapshots after {seq}")
        self._stored = None  # read again: an earlier actor may have left more than this one knows
        self._drop([s for s in self._load() if s > seq], f"after restoring {seq}")
        return True

    def forget(self) -> None:
        """The run is gone: its marker and snapshots too (the caller deletes the directory)."""
        self._marker.unlink(missing_ok=True)
        self.storage.delete_tree(self._folder)
        self._stored = None


def _write_durably(path: Path, text: str) -> None:
    temporary = path.with_name(f"{path.name}.tmp")
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def accepted_states(attempts: list[tuple[int, bool]]) -> tuple[int, ...]:
    """Which workspace states fit a journal, from its command attempts ``(seq, completed)``.

    ``completed`` means the run itself wrote the attempt's ``Completed`` (so the marker and the
    snapshot were written first). The newest attempt's state always fits; when the run did not
    complete it (interrupted, or decided by a person), the state before it fits too (-1: the
    state before any command), because the attempt may not have touched the workspace.
    """
    if not attempts:
        return ()
    newest, completed = attempts[-1]
    if completed:
        return (newest,)
    return (newest, attempts[-2][0] if len(attempts) > 1 else NO_COMMAND)
