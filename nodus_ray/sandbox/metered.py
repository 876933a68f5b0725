"""A ``Popen`` that keeps the CPU time of the process it reaps: how a command's compute is billed.

Why ``wait4`` on the one child: its resource usage is the child's own plus that of every
descendant the child (or a descendant) waited for. Under bubblewrap the sandbox's init (pid 1
of its PID namespace) reaps every process of the command, orphans included, and the kernel
reaps the rest when that namespace ends, so the whole process tree adds up in the one figure
the runner gets for the bubblewrap process it started. Under the process fallback the shell
waits for its children; a process that double-forks away from it is reparented outside and
its time is not counted (that backend has no namespace to hold it, see `process`).

Why not ``getrusage(RUSAGE_CHILDREN)`` before and after: that counts every child of the whole
Ray worker, and a worker runs several runs' commands at once on its threads; ``wait4`` on one
pid is per command and needs no lock beyond the one ``Popen`` already takes around its waits.

It overrides two private hooks of CPython's ``subprocess.Popen`` (``_try_wait`` for blocking
and timed waits, ``_internal_poll`` for ``poll``), whose signatures have been stable since 3.3;
should a future Python change them, the figure is 0 (not wrong in the user's disfavour).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["CpuGroup", "MeteredPopen", "cpu_seconds_of", "open_cpu_group"]


class MeteredPopen(subprocess.Popen[bytes]):
    """``subprocess.Popen`` whose reap is ``os.wait4``: ``cpu_seconds`` is user+system CPU of
    the process and the descendants it waited for, once it has been reaped (0.0 before)."""

    cpu_seconds: float = 0.0
    # The cgroup the process was started in (`CpuGroup.wrap`), if any: its figure counts what
    # ``wait4`` cannot see (see `cpu_seconds_of`). Its owner closes it once the process is gone.
    cpu_group: CpuGroup | None = None

    def _wait4(self, pid: int, flags: int) -> tuple[int, int]:
        reaped, status, usage = os.wait4(pid, flags)
        if reaped == pid:
            self.cpu_seconds = float(usage.ru_utime + usage.ru_stime)
        return reaped, status

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        try:
            return self._wait4(self.pid, wait_flags)
        except ChildProcessError:  # reaped elsewhere: as Popen does, an exit status of 0
            return self.pid, 0

    def _internal_poll(self, _deadstate: Any = None, **_kwargs: Any) -> int | None:
        return super()._internal_poll(_deadstate, _waitpid=self._wait4)  # type: ignore[misc,no-any-return]


def cpu_seconds_of(proc: subprocess.Popen[bytes]) -> float:
    """The CPU seconds a reaped process used: its cgroup's figure where it has one, else what
    ``wait4`` reported (0.0 for a plain ``Popen``, which keeps neither)."""
    group = getattr(proc, "cpu_group", None)
    counted = group.seconds() if isinstance(group, CpuGroup) else 0.0
    return round(max(counted, float(getattr(proc, "cpu_seconds", 0.0))), 3)


# --------------------------------------------------------------------------------------------
# A cgroup per command: counts every process of it, however it ended


_PROBE_NAME = "nodus-sandbox"


@dataclass(frozen=True)
class _CgroupRoot:
    path: Path
    usage_file: str  # "cpuacct.usage" (v1, nanoseconds) or "cpu.stat" (v2, usage_usec)


def _own_cgroup_paths() -> dict[str, str]:
    """This process's cgroup per hierarchy: ``{"cpuacct": "/x", "": "/y" (v2)}``."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _id, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


@lru_cache(maxsize=1)
def _cgroup_root() -> _CgroupRoot | None:
    """Where this process may make per-command cgroups (None: not root, or no usable hierarchy).

    cgroup v1's ``cpuacct`` first (its ``cpuacct.usage`` needs no controller enabled), else the
    v2 hierarchy's ``cpu.stat`` (always kept). A folder ``nodus-sandbox`` below this process's
    own cgroup holds them; a probe child is made and removed to see it works.
    """
    if os.geteuid() != 0:
        return None
    own = _own_cgroup_paths()
    candidates: list[tuple[str, str]] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields_ = line.split()
            if len(fields_) < 4:
                continue
            mount, kind, options = fields_[1], fields_[2], fields_[3].split(",")
            if kind == "cgroup" and "cpuacct" in options and "cpuacct" in own:
                candidates.insert(0, (mount + own["cpuacct"].rstrip("/"), "cpuacct.usage"))
            elif kind == "cgroup2" and "" in own:
                candidates.append((mount + own[""].rstrip("/"), "cpu.stat"))
    for base, usage_file in candidates:
        root = Path(base) / _PROBE_NAME
        probe = root / f"probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            root.mkdir(exist_ok=True)
            probe.mkdir()
            usable = (probe / usage_file).exists() and (probe / "cgroup.procs").exists()
            probe.rmdir()
        except OSError:
            continue
        if usable:
            return _CgroupRoot(root, usage_file)
    return None


_stale: list[Path] = []  # cgroups a process still held when their command was done; retried
_stale_lock = threading.Lock()


class CpuGroup:
    """A fresh cgroup for one command: the command moves itself in before it starts anything
    (`wrap`), so every process it ever makes is counted in `seconds`, orphans and killed ones
    too, which ``wait4`` cannot see (bubblewrap's init exits without being waited for)."""

    def __init__(self, root: _CgroupRoot) -> None:
        self._root = root
        self.path = root.path / uuid.uuid4().hex
        self.path.mkdir()

    @property
    def procs_file(self) -> Path:
        """The file a process writes its pid to in order to join the cgroup."""
        return self.path / "cgroup.procs"

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started from a shell that first joins the cgroup (a failed join runs it anyway)."""
        join = 'echo $$ > "$0" 2>/dev/null; exec "$@"'
        return ["/bin/sh", "-c", join, str(self.procs_file), *argv]

    def seconds(self) -> float:
        """CPU seconds (user + system) every process of the cgroup used so far."""
        try:
            text = (self.path / self._root.usage_file).read_text()
        except OSError:
            return 0.0
        if self._root.usage_file == "cpuacct.usage":
            return int(text.strip() or 0) / 1e9
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value) / 1e6
        return 0.0

    def close(self) -> None:
        """Remove the cgroup (and any left before that a process still held then)."""
        with _stale_lock:
            pending = [*_stale, self.path]
            _stale.clear()
            for path in pending:
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    if len(_stale) < 1000:
                        _stale.append(path)


def open_cpu_group() -> CpuGroup | None:
    """A cgroup for one command, or None where this host gives none (then ``wait4`` counts)."""
    root = _cgroup_root()
    if root is None:
        return None
    try:
        return CpuGroup(root)
    except OSError:
        return None
