"""The workspace measurement behind the disk cap: what it counts, what it must never follow."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from nodus_ray.sandbox.disk_usage import DiskWatch, disk_usage, format_bytes

MIB = 1 << 20


def _write(path: Path, size: int) -> None:
    path.write_bytes(os.urandom(size))


def _blocks(path: Path) -> int:
    return os.lstat(path).st_blocks * 512


def test_counts_allocated_blocks_of_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    _write(tmp_path / "a" / "one", MIB)
    _write(tmp_path / "a" / "b" / "two", 2 * MIB)
    expected = sum(_blocks(p) for p in [tmp_path, *tmp_path.rglob("*")])
    assert disk_usage(tmp_path) == expected
    assert 3 * MIB <= expected < 3 * MIB + (256 << 10)


def test_sparse_files_count_what_they_use_and_hard_links_count_once(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)
    _write(tmp_path / "data", MIB)
    for i in range(5):
        os.link(tmp_path / "data", tmp_path / f"link{i}")
    assert MIB <= disk_usage(tmp_path) < MIB + (256 << 10)


def test_never_follows_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    _write(outside / "big", 4 * MIB)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "to-dir").symlink_to(outside)
    (ws / "to-file").symlink_to(outside / "big")
    (ws / "to-root").symlink_to("/")
    assert disk_usage(ws) < MIB


def test_a_deep_tree_is_counted_whole_with_one_descriptor(tmp_path: Path) -> None:
    depth = 400  # deeper than any fd-per-level walk could afford in a Ray worker
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(leaf, os.urandom(MIB))
        os.close(leaf)
    finally:
        os.close(fd)
    fds_before = len(os.listdir("/proc/self/fd"))
    assert disk_usage(tmp_path) >= MIB  # the only data is in the deepest directory
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_missing_path_is_zero(tmp_path: Path) -> None:
    assert disk_usage(tmp_path / "missing") == 0


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(8 * MIB) == "8.0 MiB"
    assert format_bytes(1 << 30) == "1.0 GiB"
    assert format_bytes(3 << 40) == "3072.0 GiB"


def test_watch_fires_when_usage_grows_past_the_cap(tmp_path: Path) -> None:
    watch = DiskWatch(tmp_path, 2 * MIB, interval=0.02)
    watch.measure_baseline()
    fired = threading.Event()
    watch.start(fired.set)
    _write(tmp_path / "big", 3 * MIB)
    assert fired.wait(timeout=10)
    assert watch.finish() and watch.killed and watch.usage > 2 * MIB


def test_watch_spares_a_workspace_that_was_over_the_cap_and_shrinks(tmp_path: Path) -> None:
    _write(tmp_path / "a", 3 * MIB)
    _write(tmp_path / "b", 3 * MIB)
    watch = DiskWatch(tmp_path, 2 * MIB, interval=0.02)
    watch.measure_baseline()
    fired = threading.Event()
    watch.start(fired.set)
    (tmp_path / "a").unlink()
    assert not watch.finish()  # still over the cap, but smaller than when it started
    assert not fired.is_set() and not watch.killed


@pytest.mark.parametrize("grow", [True, False])
def test_watch_final_measure_catches_growth_between_polls(tmp_path: Path, grow: bool) -> None:
    watch = DiskWatch(tmp_path, MIB, interval=3600)  # never polls: only the final measure sees it
    watch.measure_baseline()
    watch.start(lambda: None)
    if grow:
        _write(tmp_path / "big", 2 * MIB)
    assert watch.finish() is grow
    assert not watch.killed
