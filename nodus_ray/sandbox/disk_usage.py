"""How much disk a workspace uses, and a watcher that stops a command growing it past a cap.

Why in userspace: the sandbox root is an ordinary directory on whatever filesystem the host
has, with no project quotas to lean on. So while a command runs, a thread re-measures the
workspace every quarter second and kills the command once the usage is over the cap *and*
larger than when the command started: a command that only deletes (to get back under a cap
an earlier command overshot) is never killed for the old excess. The cap can be overshot by
what a command writes between two measurements, and by files it deletes while keeping them
open (the walk cannot see those).

The walk runs as root over a tree the command controls, so it never follows a symlink: it
moves between directories through descriptors (``O_NOFOLLOW`` going down, ``..`` checked
against the recorded parent going up, as fts does), holding one descriptor however deep the
tree is. It stays on the workspace's filesystem, counts allocated blocks (``st_blocks * 512``,
so sparse files count what they use) and a hard-linked inode once.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["disk_usage", "format_bytes", "DiskWatch"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_POLL_SECONDS = 0.25
# A huge workspace makes each walk slow; polling then backs off so the watcher spends at most
# about 1 / (1 + _BACKOFF) of a core measuring (a walk takes about 6 µs per file).
_BACKOFF = 10.0


def format_bytes(n: int) -> str:
    """``1.0 GiB``, ``8.0 MiB``, ``512 B``: for messages the model reads."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _scan(fd: int, seen: set[tuple[int, int]], dev: int) -> tuple[int, list[tuple[str, tuple[int, int]]]]:
    """Bytes of the entries of the directory ``fd``, and its subdirectories to descend into."""
    total = 0
    subdirs: list[tuple[str, tuple[int, int]]] = []
    with contextlib.suppress(OSError), os.scandir(fd) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:  # removed meanwhile
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if not is_dir and st.st_nlink > 1:
                if _identity(st) in seen:
                    continue
                seen.add(_identity(st))
            total += st.st_blocks * 512
            if is_dir and st.st_dev == dev:
                subdirs.append((entry.name, _identity(st)))
    return total, subdirs


def disk_usage(path: Path | str) -> int:
    """Bytes allocated to ``path`` and everything below it (0 if it does not exist).

    A tree changing during the walk is measured as well as it can be: entries that vanish are
    skipped, and if a directory is moved while the walk is inside it, the walk stops there and
    returns what it counted.
    """
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return 0
    try:
        top = os.fstat(fd)
        seen: set[tuple[int, int]] = set()
        total, pending = _scan(fd, seen, top.st_dev)
        total += top.st_blocks * 512
        # One frame per directory on the current path: its identity and the subdirectories
        # still to visit. ``fd`` is always the directory of the last frame.
        frames = [(_identity(top), pending)]
        while frames:
            _ident, pending = frames[-1]
            if pending:
                name, child_ident = pending.pop()
                try:
                    child = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except OSError:
                    continue
                if _identity(os.fstat(child)) != child_ident:  # swapped since the scan
                    os.close(child)
                    continue
                os.close(fd)
                fd = child
                size, child_pending = _scan(fd, seen, top.st_dev)
                total += size
                frames.append((child_ident, child_pending))
                continue
            frames.pop()
            if not frames:
                break
            try:
                parent = os.open("..", _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                break
            os.close(fd)
            fd = parent
            if _identity(os.fstat(fd)) != frames[-1][0]:
                break  # moved while we were below it: do not wander elsewhere
        return total
    finally:
        os.close(fd)


class DiskWatch:
    """Measures a workspace while one command runs and calls ``on_exceeded`` if it grows past ``cap``.

    ``measure_baseline`` comes before the command starts (so growth is the command's own),
    ``start`` once it runs; ``finish`` stops polling and measures once more, returning whether
    the cap was exceeded at any point (``killed`` says whether ``on_exceeded`` was called).
    """

    def __init__(self, path: Path, cap: int, *, interval: float = _POLL_SECONDS) -> None:
        self.path = path
        self.cap = cap
        self.interval = interval
        self.baseline = 0
        self.usage = 0
        self.killed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _over(self, usage: int) -> bool:
        return usage > self.cap and usage > self.baseline

    def measure_baseline(self) -> None:
        self.baseline = self.usage = disk_usage(self.path)

    def start(self, on_exceeded: Callable[[], None]) -> None:
        self._thread = threading.Thread(
            target=self._poll, args=(on_exceeded,), name="nodus-disk-watch", daemon=True
        )
        self._thread.start()

    def _poll(self, on_exceeded: Callable[[], None]) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            started = time.monotonic()
            self.usage = disk_usage(self.path)
            if self._over(self.usage):
                self.killed = True
                on_exceeded()
                return
            wait = max(self.interval, (time.monotonic() - started) * _BACKOFF)

    def stop(self) -> None:
        """Stop polling (idempotent); waits for a walk in progress to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def finish(self) -> bool:
        """Stop polling, measure once more (the command may have written since) and report."""
        self.stop()
        if not self.killed:
            self.usage = disk_usage(self.path)
        return self.killed or self._over(self.usage)
