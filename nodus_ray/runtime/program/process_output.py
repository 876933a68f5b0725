"""What a program's process leaves behind for its run: its own output, its CPU, its error's text.

Kept apart from `python_program` because it is plain process bookkeeping, the same whatever the
program did: the bootstrap's or a crash's stdout/stderr (kept whole for the log up to a limit,
and its last lines for the run's message), the CPU seconds it used, and a raised exception
shortened to what a run's message can carry.
"""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any

from nodus._runtime import protocol as wire
from nodus_ray.sandbox.metered import cpu_seconds_of

__all__ = ["LOG_LIMIT", "TAIL_LINES", "ProcessOutput", "failure_text", "reap"]

TAIL_LINES = 20
_TAIL_CHARS = 4000
LOG_LIMIT = 8 << 20


class ProcessOutput:
    """The process's own stdout/stderr (the bootstrap's, a crash's): kept whole for the log,
    up to a limit, and its last lines for the run's message."""

    def __init__(self) -> None:
        self.text = bytearray()
        self.dropped = 0

    def read(self, pipe: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: pipe.read1(65536), b""):
                room = LOG_LIMIT - len(self.text)
                self.text += chunk[: max(0, room)]
                self.dropped += max(0, len(chunk) - max(0, room))

    def tail(self) -> str:
        lines = self.text.decode("utf-8", "replace").rstrip().splitlines()[-TAIL_LINES:]
        return "\n".join(lines)[-_TAIL_CHARS:]


def reap(proc: subprocess.Popen[bytes]) -> float:
    """Wait for the process and return the CPU seconds it and its descendants used (its cgroup's
    figure, else ``wait4``'s: `sandbox.metered`)."""
    proc.wait()
    return cpu_seconds_of(proc)


def failure_text(error: wire.ErrorInfo) -> str:
    """The program's exception as the run's message: its type, its message, its traceback's tail."""
    kind = error.type.removeprefix("builtins.")
    head = f"{kind}: {error.message}" if error.message else kind
    tail = "\n".join(error.traceback.rstrip().splitlines()[-TAIL_LINES:])[-_TAIL_CHARS:]
    return f"{head}\n{tail}" if tail else head
