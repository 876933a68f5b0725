"""Where a service's CPU goes: CPU seconds by process role over a window, short-lived ones too.

The machine-wide figure (/proc/stat) says how much a workload cost, not who spent it. Run
actors are short-lived worker processes (one per run), gone before a window ends and not
reaped by anyone whose ``cutime`` would count them, so a before/after reading misses them. A
`ProcessCpu` therefore polls /proc every ``interval`` seconds from a thread, following every
process of the service (its Ray head's processes, found by the head's temp directory in their
command line, and their descendants: workers, sandboxes), and keeps each one's last reading;
what a process spends in its last interval before it exits is missed (at 50 ms, a few ms a
process).

A process's role is its Ray title (``ray::ControlPlane``, ``ray::runslot`` for a pooled run
actor, ``ray::run`` for one started for its run, ``ray::GroupSupervisor``...) or the program
(``gcs_server``, ``raylet``, ``bwrap``...); a worker still ``ray::IDLE`` is looked at again until it
names what it runs. `by_role` sums the window by role.

    with ProcessCpu(env["NODUS_RAY_TEMP_DIR"]) as sampler:
        ...workload...
    for role, seconds, count in sampler.by_role(): ...
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

__all__ = ["ProcessCpu"]

_TICKS = os.sysconf("SC_CLK_TCK")
# What a worker is called before it knows what it will run: looked at again until it does.
_UNNAMED = ("worker (starting)", "ray::IDLE")
_PROGRAMS = ("gcs_server", "raylet", "dashboard/agent", "dashboard.py", "log_monitor", "monitor.py")


def _stat(pid: int) -> tuple[int, float, str] | None:
    """(parent pid, CPU seconds so far, command name) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (
        int(fields[1]),
        (int(fields[11]) + int(fields[12])) / _TICKS,
        text[text.index("(") + 1 : text.rindex(")")],
    )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _role(command: str, name: str) -> str:
    if command.startswith("ray::"):
        return command.split()[0].split(".")[0]
    if "default_worker.py" in command:
        return "worker (starting)"
    return next((program for program in _PROGRAMS if program in command), name)


class ProcessCpu:
    """Samples the CPU of every process of one Ray head (and their descendants) from a thread."""

    def __init__(self, head_temp_dir: str, interval: float = 0.05) -> None:
        self._marker = head_temp_dir
        self._interval = interval
        self._roles: dict[int, str] = {}
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-cpu", daemon=True)

    def __enter__(self) -> ProcessCpu:
        self._poll(baseline=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._poll()

    def _poll(self, baseline: bool = False) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            stat = _stat(pid)
            if stat is None:
                continue
            parent, cpu, name = stat
            role = self._roles.get(pid)
            if role is None or role in _UNNAMED:
                command = _cmdline(pid)
                if pid not in self._roles and not (self._marker in command or parent in self._roles):
                    continue
                role = self._roles[pid] = _role(command, name)
                # Present at the start: only what it spends from now on counts.
                self._first.setdefault(pid, cpu if baseline else 0.0)
            self._last[pid] = cpu

    def by_role(self) -> list[tuple[str, float, int]]:
        """(role, CPU seconds in the window, processes), the largest first."""
        sums: dict[str, list[float]] = {}
        for pid, role in self._roles.items():
            spent = self._last.get(pid, 0.0) - self._first.get(pid, 0.0)
            entry = sums.setdefault(role, [0.0, 0])
            entry[0] += spent
            entry[1] += 1
        return sorted(((role, cpu, int(count)) for role, (cpu, count) in sums.items()), key=lambda r: -r[1])

    def total(self) -> float:
        return sum(cpu for _role, cpu, _count in self.by_role())
