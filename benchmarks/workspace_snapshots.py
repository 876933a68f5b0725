"""Workspace snapshots: incremental manifests + blobs beside the whole-workspace tar.gz they replace.

After every sandbox command a run actor snapshots its workspace to storage, so that the run can
move to another node (`nodus_ray.sandbox.snapshots`). Before issue 19 that was a tar.gz (gzip
level 1) of the whole workspace per command; now it is a manifest plus each file content once,
by sha256, and files whose size, mtime, inode and ctime did not change are not read. This
measures both on the same workspace, command after command, in the same run:

* **Workspaces.** ``large``: ``--files`` files (default 2000) of text-like content (words from a
  small vocabulary, so gzip compresses it about as it does source code) totalling about
  ``--mb`` MB (default 50), in nested directories, plus a few symlinks. ``small``: 10 files of
  1-4 KB. The files exist ``--settle`` seconds (default 2.5) before the first snapshot, as a
  repository cloned before the run's commands: a file changed within 2 s of a snapshot is read
  again by the next one (the racy-clean rule, `workspace_manifest`).
* **Commands.** ``--commands`` commands (default 30); every third changes nothing (``ls``), the
  others each rewrite one small file (a 200-byte edit of a 1-4 KB file). The first snapshot
  (every file new) is reported apart.
* **New**: `WorkspaceSnapshots.after_command` on its own local `Storage` directory (the real
  code: marker, scan, blob uploads, manifest, deleting what the newest two no longer need).
  **Old** (the baseline): a copy of the former ``_pack`` (``tarfile`` over the whole workspace,
  ``compresslevel=1``) written with `Storage.write_bytes` and the snapshot before the newest two
  deleted, on another `Storage` directory. Both run after each command, new first, so both read
  a warm page cache.
* **Figures**: wall time per snapshot (median and max), bytes handed to storage per snapshot,
  and the time to restore the newest snapshot into an empty directory (a move to another node:
  `WorkspaceSnapshots.unpack` beside ``tarfile.extractall(filter="data")``).

    .venv/bin/python benchmarks/workspace_snapshots.py
    .venv/bin/python benchmarks/workspace_snapshots.py --files 2000 --mb 50 --commands 30
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from support import words

from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

PREFIX = "projects/bench/agentruns/r"
VOCABULARY = [
    "def", "return", "self", "import", "from", "class", "None", "if", "else", "for", "in",
    "value", "result", "items", "config", "path", "name", "data", "=", "(", ")", ":", "+",
    "1", "0", "True", "False", "async", "await", "with", "as", "try", "except", "raise",
]  # fmt: skip


class CountingStorage(Storage):
    """Local storage that counts the bytes handed to it."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.bytes_written = 0

    def write_bytes(self, key: str, data: bytes) -> None:
        self.bytes_written += len(data)
        super().write_bytes(key, data)


def old_pack(workspace: Path) -> bytes:
    """The former ``snapshots._pack`` (its size check included): the whole workspace as a tar.gz."""
    total = 0
    for root, _dirs, files in os.walk(workspace):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
        archive.add(workspace, arcname=".", recursive=True)
    return buffer.getvalue()


@dataclass
class OldSnapshots:
    """The former `WorkspaceSnapshots.after_command`: marker, tar.gz, keep the newest two."""

    storage: CountingStorage
    workspace: Path
    stored: list[int] = field(default_factory=list)

    def after_command(self, seq: int) -> None:
        marker = self.workspace.parent / f".{self.workspace.name}.old-marker"
        with open(marker, "w") as handle:
            handle.write(str(seq))
            handle.flush()
            os.fsync(handle.fileno())
        self.storage.write_bytes(layout.workspace_snapshot(PREFIX, seq), old_pack(self.workspace))
        kept = sorted({*self.stored, seq})
        for stale in kept[:-2]:
            self.storage.delete(layout.workspace_snapshot(PREFIX, stale))
        self.stored = kept[-2:]


def make_workspace(root: Path, files: int, total_mb: float, rng: random.Random) -> list[Path]:
    """The workspace's files; returns the small ones a command may edit."""
    root.mkdir(parents=True)
    small: list[Path] = []
    budget = int(total_mb * 1024 * 1024)
    sizes = [rng.randint(1024, 4096) for _ in range(files)]
    large = max(1, files // 20)  # a few large files hold most of the bytes, as in a repository
    rest = budget - sum(sizes[large:])
    for index in range(large):
        sizes[index] = max(4096, rest // large)
    text = words(rng, 1 << 20, VOCABULARY)  # sliced at random offsets: cheap, and compresses like code
    for index, size in enumerate(sizes):
        folder = root / f"pkg{index % 40:02d}" / f"sub{index % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"module_{index:05d}.py"
        chunks = []
        remaining = size
        while remaining > 0:
            start = rng.randrange(0, len(text) - 4096)
            piece = text[start : start + min(remaining, 4096)]
            chunks.append(piece)
            remaining -= len(piece)
        path.write_text("".join(chunks))
        if index >= large:
            small.append(path)
    (root / "latest").symlink_to(small[0].relative_to(root))
    (root / "pkg00" / "up").symlink_to("..")
    return small


def timed(action: Callable[[], None]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def run_profile(
    name: str, files: int, total_mb: float, commands: int, settle: float, base: Path
) -> list[str]:
    rng = random.Random(19)
    workspace = base / name / "node-a" / "r"
    small = make_workspace(workspace, files, total_mb, rng)
    actual = sum(p.stat().st_size for p in workspace.rglob("*") if p.is_file() and not p.is_symlink())
    time.sleep(settle)  # the repository was there before the run's commands (see the module)
    new_storage = CountingStorage(str(base / name / "storage-new"))
    old_storage = CountingStorage(str(base / name / "storage-old"))
    new = WorkspaceSnapshots(new_storage, PREFIX, workspace)
    old = OldSnapshots(old_storage, workspace)
    rows: dict[str, dict[str, list[float]]] = {
        kind: {"new_s": [], "old_s": [], "new_b": [], "old_b": []}
        for kind in ("first", "one file", "nothing")
    }
    for seq in range(1, commands + 2):
        kind = "first" if seq == 1 else "nothing" if seq % 3 == 0 else "one file"
        if kind == "one file":
            path = rng.choice(small)
            content = path.read_text()
            offset = rng.randrange(0, max(1, len(content) - 200))
            path.write_text(content[:offset] + words(rng, 200, VOCABULARY) + content[offset + 200 :])
        before_new, before_old = new_storage.bytes_written, old_storage.bytes_written
        rows[kind]["new_s"].append(timed(partial(new.after_command, seq)))
        rows[kind]["old_s"].append(timed(partial(old.after_command, seq)))
        rows[kind]["new_b"].append(new_storage.bytes_written - before_new)
        rows[kind]["old_b"].append(old_storage.bytes_written - before_old)
    newest = commands + 1
    into_new, into_old = base / name / "node-b" / "new", base / name / "node-b" / "old"
    restore_new = timed(lambda: new.unpack(newest, into_new))

    def extract_old() -> None:
        into_old.mkdir(parents=True)
        data = old_storage.read_bytes(layout.workspace_snapshot(PREFIX, newest))
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            archive.extractall(into_old, filter="data")

    restore_old = timed(extract_old)
    assert sorted(str(p.relative_to(into_new)) for p in into_new.rglob("*")) == sorted(
        str(p.relative_to(workspace)) for p in workspace.rglob("*")
    ), "the restored workspace lists what the original does"
    stored_new = _tree_bytes(base / name / "storage-new")
    stored_old = _tree_bytes(base / name / "storage-old")
    lines = [
        f"**{name}**: {files} files and 2 symlinks, {actual / 1e6:.1f} MB",
        "",
        "| snapshot after | snapshots | new: median / max ms | old tar.gz: median / max ms "
        "| new: bytes written (median) | old: bytes written (median) |",
        "|---|---|---|---|---|---|",
    ]
    for kind, figures in rows.items():
        lines.append(
            f"| {kind} | {len(figures['new_s'])} | "
            f"{_ms(statistics.median(figures['new_s']))} / {_ms(max(figures['new_s']))} | "
            f"{_ms(statistics.median(figures['old_s']))} / {_ms(max(figures['old_s']))} | "
            f"{_size(statistics.median(figures['new_b']))} | {_size(statistics.median(figures['old_b']))} |"
        )
    lines += [
        "",
        f"Restore of the newest snapshot into an empty directory: new {_ms(restore_new)} ms, old "
        f"{_ms(restore_old)} ms. In storage at the end: new {_size(stored_new)}, old {_size(stored_old)}.",
        "",
    ]
    return lines


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _size(count: float) -> str:
    return f"{count / 1e6:.2f} MB" if count >= 1e5 else f"{count / 1e3:.1f} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--commands", type=int, default=30)
    parser.add_argument("--settle", type=float, default=2.5)
    parser.add_argument("--dir", default=None, help="where the workspaces and storage go (a temp dir)")
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="nodus-bench-snapshots-", dir=options.dir))
    try:
        lines = run_profile("large", options.files, options.mb, options.commands, options.settle, base)
        lines += run_profile("small", 10, 0.02, options.commands, options.settle, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
