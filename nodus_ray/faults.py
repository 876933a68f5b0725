"""Crash points: places where the fault-injection suite can kill a process on purpose.

Durability claims are only as good as the crashes they were tested against, and a crash that
"happens to land" between a model call and its journal record cannot be timed from outside
the process. So the engine names the moments that matter (in the manner of etcd's gofail and
TiKV's fail-rs) and a test arms one:

* the operator (a test) starts the service with ``NODUS_FAULTS=<directory>``;
* it arms a point by creating the file ``<directory>/<point>``, whose content (may be empty) is a
  substring the point's context must contain, e.g. a run name;
* the first process that reaches the armed point with a matching context claims the file (an
  atomic rename, so exactly one process fires) and kills itself with SIGKILL: no ``finally``,
  no flush, exactly what a power cut or the OOM killer does.

Without ``NODUS_FAULTS`` a point costs one dictionary lookup. The points:

``step-effect-done``    a journaled step's effect happened, its ``Completed`` is not written
                        (context: ``<journal prefix>/<step id>``)
``admission-decided``   a group supervisor decided to start a run, before the control plane
                        heard of it (context: ``<project>/<group>/<run>``)
``batch-half-written``  the control plane stored the first run of a batch and not the rest
                        (context: ``<project>/<first run>``)
``api-answering``       the API replica has the control plane's answer and has not sent it
                        (context: ``<method> <path>``)
``run-ended-untold``    the control plane stored a run's end and has not told its group's
                        supervisor (context: ``<project>/<run>``)
``evaluation-unsealed`` the control plane created an evaluation's runs and has not sealed its
                        group (context: ``<project>/<group>``)
``case-graded-unrecorded`` the grader graded a case and the control plane has not stored the
                        record (context: ``<project>/<run>``)
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["POINTS", "crash_point", "arm", "enabled"]

POINTS = frozenset(
    {
        "step-effect-done",
        "admission-decided",
        "batch-half-written",
        "api-answering",
        "run-ended-untold",
        "evaluation-unsealed",
        "case-graded-unrecorded",
    }
)
_ENV = "NODUS_FAULTS"


def enabled() -> bool:
    """Whether this process was started for fault injection (so hooks may be installed)."""
    return bool(os.environ.get(_ENV))


def crash_point(point: str, context: str) -> None:
    """Die here, at once, if a test armed ``point`` for a context like this one."""
    directory = os.environ.get(_ENV)
    if not directory:
        return
    armed = Path(directory) / point
    try:
        wanted = armed.read_text()
    except OSError:
        return
    if wanted.strip() not in context:
        return
    try:  # exactly one process fires an armed point
        armed.rename(armed.with_name(f".{point}.fired.{os.getpid()}"))
    except OSError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def arm(directory: str | Path, point: str, context: str = "") -> Path:
    """Arm ``point`` under ``directory`` (what a test does); returns the armed file."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(sorted(POINTS))}")
    path = Path(directory) / point
    path.write_text(context)
    return path
