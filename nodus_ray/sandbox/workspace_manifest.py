"""A workspace as a manifest of entries plus its files' contents by sha256 (`snapshots`).

`scan` walks a workspace without following a symlink (``os.scandir``) and lists what it holds:
directories, regular files (size, mode, mtime and the sha256 of their content) and symlinks
(their target). A file whose ``(size, mtime_ns, inode, ctime_ns)`` equals its entry in the
previous manifest keeps that entry's digest without being read; ``ctime_ns`` is set by the
kernel on every write or ``chmod`` and cannot be forged by the sandboxed command (``touch -d``
sets only ``mtime``). An entry changed so shortly before its manifest was taken that a later
write could leave all four unchanged (the kernel's clock is coarser than a nanosecond) is not
trusted next time: it is read again (git's "racy clean" rule). Other special files (FIFOs,
sockets, devices) have no content to keep and are left out, as the grader's copy leaves them.

A content is stored compressed (zlib, level 1, as the tar.gz snapshots were), under its
sha256; `decode_blob` never inflates it past the size its entry names.

`unpack` builds a workspace from a manifest in a directory that does not exist yet. The
manifest came from a directory that sandboxed code controlled, while the actor (and the grader)
that unpacks it runs on the host, so it refuses (`UnsafeManifest`) what ``tarfile``'s
``filter="data"`` refused: an absolute path or one with ``..``, a path under a symlink,
an absolute symlink target or one that resolves outside the directory, and a file whose
content does not match its digest. Directories and files come first (created new, never
through a symlink: ``O_EXCL | O_NOFOLLOW``), symlinks last, so nothing is ever written
through a link. Modes keep only the owner/group/other read and execute bits and the owner
write bit, as ``filter="data"`` did (no set-uid, no group or other write).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Entry",
    "Manifest",
    "Scan",
    "UnsafeManifest",
    "TooLarge",
    "scan",
    "unpack",
    "file_digest",
    "encode_blob",
    "decode_blob",
    "TRANSFERS",
]

MANIFEST_VERSION = 1
TRANSFERS = 8  # blobs uploaded or fetched at once (on S3 each is a request)
_RACY_NS = 2_000_000_000  # a change this close to a manifest is read again next time
_READ_CHUNK = 1024 * 1024
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

Entry = dict[str, Any]  # {"path", "type": "file"|"dir"|"symlink", "mode", "size", "mtime_ns", ...}


class UnsafeManifest(Exception):
    """A manifest that would write outside its directory, through a link, or a wrong file."""


class TooLarge(Exception):
    """The workspace's files together are over the snapshot size limit."""


@dataclass
class Manifest:
    """One workspace state: its entries, in walk order (a directory before what it holds)."""

    entries: list[Entry]
    taken_ns: int = 0  # when it was taken (host clock), for the racy-clean rule

    def digests(self) -> set[str]:
        return {e["sha256"] for e in self.entries if e["type"] == "file"}

    def to_json(self, seq: int) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, "seq": seq, "takenNs": self.taken_ns, "entries": self.entries}

    @staticmethod
    def from_json(document: dict[str, Any]) -> Manifest:
        if document.get("version") != MANIFEST_VERSION or not isinstance(document.get("entries"), list):
            raise UnsafeManifest(f"not a workspace manifest of version {MANIFEST_VERSION}")
        return Manifest(document["entries"], int(document.get("takenNs") or 0))


@dataclass
class Scan:
    """What `scan` found: the new manifest and the files whose content it has to store."""

    manifest: Manifest
    to_upload: dict[str, Path] = field(default_factory=dict)  # digest -> a file holding it
    read: list[str] = field(default_factory=list)  # the paths that were read (not reused)


def file_digest(path: Path) -> str:
    """The sha256 of a file's content, read in chunks (a large file is never whole in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _walk(root: Path, relative: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    with os.scandir(root / relative if relative else root) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    for entry in entries:
        path = f"{relative}/{entry.name}" if relative else entry.name
        yield path, entry
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(root, path)


def scan(
    workspace: Path,
    previous: Manifest | None,
    known: set[str],
    limit_bytes: int,
    digest_of: Callable[[Path], str] = file_digest,
) -> Scan:
    """The workspace's manifest now; `TooLarge` (before anything is read) over ``limit_bytes``."""
    taken_ns = time.time_ns()
    before = {e["path"]: e for e in previous.entries} if previous is not None else {}
    trusted_until = (previous.taken_ns - _RACY_NS) if previous is not None else 0
    found: list[tuple[str, os.stat_result, str]] = []
    total = 0
    for path, entry in _walk(workspace):
        try:
            info = entry.stat(follow_symlinks=False)
            target = os.readlink(entry.path) if stat.S_ISLNK(info.st_mode) else ""
        except FileNotFoundError:
            continue  # gone since it was listed
        if stat.S_ISREG(info.st_mode):
            total += info.st_size
            if total > limit_bytes:
                raise TooLarge
        found.append((path, info, target))
    result = Scan(Manifest([], taken_ns))
    for path, info, target in found:
        entry_: Entry = {"path": path, "mode": stat.S_IMODE(info.st_mode), "mtime_ns": info.st_mtime_ns}
        if stat.S_ISDIR(info.st_mode):
            entry_.update(type="dir", size=0)
        elif stat.S_ISLNK(info.st_mode):
            entry_.update(type="symlink", size=len(os.fsencode(target)), target=target)
        elif stat.S_ISREG(info.st_mode):
            entry_.update(type="file", size=info.st_size, ino=info.st_ino, ctime_ns=info.st_ctime_ns)
            old = before.get(path)
            if (
                old is not None
                and old["type"] == "file"
                and (old["size"], old["mtime_ns"], old.get("ino"), old.get("ctime_ns"))
                == (info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)
                and info.st_ctime_ns < trusted_until
            ):
                entry_["sha256"] = old["sha256"]
            else:
                try:
                    entry_["sha256"] = digest_of(workspace / path)
                except FileNotFoundError:
                    continue
                result.read.append(path)
                if entry_["sha256"] not in known:
                    result.to_upload[entry_["sha256"]] = workspace / path
        else:
            continue  # a FIFO, socket or device: no content to keep
        result.manifest.entries.append(entry_)
    return result


def _checked_path(path: object) -> str:
    if not isinstance(path, str) or not path or "\0" in path or path.startswith("/"):
        raise UnsafeManifest(f"entry path {path!r} is absolute or empty")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafeManifest(f"entry path {path!r} leaves the workspace or is not normal")
    return path


def _inside(root: Path, candidate: str) -> bool:
    real_root = os.path.realpath(root)
    return os.path.commonpath([real_root, os.path.realpath(candidate)]) == real_root


def unpack(manifest: Manifest, into: Path, read_blob: Callable[[str], bytes]) -> None:
    """Create ``into`` (it must not exist) holding the manifest's workspace; see the module."""
    entries = manifest.entries
    kinds: dict[str, str] = {}
    for entry in entries:
        path = _checked_path(entry.get("path"))
        if entry.get("type") not in ("dir", "file", "symlink"):
            raise UnsafeManifest(f"entry {path!r} has an unknown type {entry.get('type')!r}")
        if path in kinds:
            raise UnsafeManifest(f"entry {path!r} is listed twice")
        kinds[path] = entry["type"]
    for path in kinds:
        parent = path.rpartition("/")[0]
        if parent and kinds.get(parent) != "dir":
            raise UnsafeManifest(f"entry {path!r} is not under a directory of the manifest (a symlink?)")
    into.mkdir(mode=0o700)
    directories: list[Entry] = []
    for entry in sorted((e for e in entries if e["type"] == "dir"), key=lambda e: e["path"].count("/")):
        os.mkdir(into / entry["path"], 0o700)
        directories.append(entry)
    files = [e for e in entries if e["type"] == "file"]
    for entry in files:
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise UnsafeManifest(f"entry {entry['path']!r} has no valid sha256")
    # Fetched a few at a time (on S3 each is a request), written one by one in order.
    with ThreadPoolExecutor(max_workers=TRANSFERS) as pool:
        contents = pool.map(read_blob, [e["sha256"] for e in files])
        _write_files(into, files, contents)
    _finish(into, entries, directories)


def _write_files(into: Path, files: list[Entry], contents: Iterator[bytes]) -> None:
    for entry in files:
        digest = entry["sha256"]
        data = decode_blob(next(contents), int(entry["size"]))
        if hashlib.sha256(data).hexdigest() != digest:
            raise UnsafeManifest(f"the stored content of {entry['path']!r} does not match its sha256")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        descriptor = os.open(into / entry["path"], flags, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
            os.fchmod(descriptor, _file_mode(int(entry["mode"])))
            mtime = int(entry["mtime_ns"])
            os.utime(descriptor, ns=(mtime, mtime))
        finally:
            os.close(descriptor)


def _finish(into: Path, entries: list[Entry], directories: list[Entry]) -> None:
    """Symlinks (last: nothing is written after them), then the directories' modes and mtimes."""
    links = [e for e in entries if e["type"] == "symlink"]
    for entry in links:
        target = entry.get("target")
        if not isinstance(target, str) or not target or "\0" in target or os.path.isabs(target):
            raise UnsafeManifest(f"symlink {entry['path']!r} has an absolute or empty target {target!r}")
        where = os.path.normpath(os.path.join(os.path.dirname(entry["path"]), target))
        if where == ".." or where.startswith("../"):
            raise UnsafeManifest(f"symlink {entry['path']!r} points outside the workspace ({target!r})")
        os.symlink(target, into / entry["path"])
    for entry in links:  # a chain of links that are each inside may still lead out together
        if not _inside(into, str(into / entry["path"])):
            raise UnsafeManifest(f"symlink {entry['path']!r} resolves outside the workspace")
        mtime = int(entry["mtime_ns"])
        os.utime(into / entry["path"], ns=(mtime, mtime), follow_symlinks=False)
    for entry in reversed(directories):  # deepest first: a directory's own mtime is set last
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        descriptor = os.open(into / entry["path"], flags)
        try:
            os.fchmod(descriptor, (int(entry["mode"]) & 0o755) | 0o700)
            mtime = int(entry["mtime_ns"])
            os.utime(descriptor, ns=(mtime, mtime))
        finally:
            os.close(descriptor)


def encode_blob(data: bytes) -> bytes:
    """A file content as stored: zlib at level 1 (what the tar.gz snapshots used)."""
    return zlib.compress(data, 1)


def decode_blob(stored: bytes, size: int) -> bytes:
    """A stored content, never inflated past ``size`` + 1 bytes (a forged blob cannot fill the disk)."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(stored, size + 1)
    except zlib.error as error:
        raise UnsafeManifest(f"a stored file content is not readable: {error}") from None
    if len(data) != size or not inflater.eof:
        raise UnsafeManifest(f"a stored file content is not the {size} bytes its entry says")
    return data


def _file_mode(mode: int) -> int:
    """What ``tarfile``'s ``filter="data"`` kept of a file's mode: no special or group/other
    write bits, owner read/write always, execute bits only if the owner's is set."""
    mode &= 0o755
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600
