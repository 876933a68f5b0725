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
  no flush, exactly what a power cut or the OOM killer does;
* armed with ``action="hold"`` instead, it holds there: the thread that reached the point
  waits (nothing after the point runs) until the test creates ``<directory>/.<point>.release``.
  A run actor held so is frozen at a known moment; the test may then also SIGSTOP its node (a
  partition, a paused VM), wake it, and release it: that is how a test makes a *zombie*, an
  actor Ray gave up on that later goes on. (Not SIGSTOP to itself: in a Ray worker a stopped
  process was seen to go on at once, its process group being orphaned.)

The context a point matches against ends with `` node=<Ray node id>`` in a Ray worker, so a
test can arm a point for the runs of one node. The fired file (``.<point>.fired.<pid>``)
holds the context that fired it, so the test knows which run it stopped.

Without ``NODUS_FAULTS`` a point costs one dictionary lookup. The points:

``step-started``        a journaled step's ``Started`` is written, its effect not begun
                        (context: ``<journal prefix>/<step id>``)
``step-effect-done``    a journaled step's effect happened, its ``Completed`` is not written
                        (context: ``<journal prefix>/<step id>``)
``step-recorded``       a journaled step's ``Completed`` is written (context: as above)
``actor-fenced``        a run actor found a newer actor of its run and stopped (context:
                        ``<project>/<run>``)
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

import json
import os
import signal
import time
from pathlib import Path
from typing import Literal

__all__ = ["POINTS", "crash_point", "arm", "enabled", "fired_context", "release"]

Action = Literal["kill", "hold"]

POINTS = frozenset(
    {
        "step-started",
        "step-effect-done",
        "step-recorded",
        "actor-fenced",
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
    """Die (or freeze) here, at once, if a test armed ``point`` for a context like this one."""
    directory = os.environ.get(_ENV)
    if not directory:
        return
    armed = Path(directory) / point
    try:
        content = armed.read_text()
    except OSError:
        return
    wanted, action = _parse(content)
    context = f"{context} node={_node_id()}"
    if wanted not in context:
        return
    fired = armed.with_name(f".{point}.fired.{os.getpid()}")
    try:  # exactly one process fires an armed point
        armed.rename(fired)
    except OSError:
        return
    fired.write_text(context)
    if action == "hold":
        release = Path(directory) / f".{point}.release"
        while not release.exists():
            time.sleep(0.05)  # held on purpose: the thread must not go past the point
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _parse(content: str) -> tuple[str, Action]:
    if content.startswith("{"):
        armed = json.loads(content)
        return str(armed.get("context", "")).strip(), "hold" if armed.get("action") == "hold" else "kill"
    return content.strip(), "kill"


def _node_id() -> str:
    """The Ray node this process runs on ("" outside a Ray worker or driver)."""
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - a point must never fail the code it sits in
        return ""


def arm(directory: str | Path, point: str, context: str = "", action: Action = "kill") -> Path:
    """Arm ``point`` under ``directory`` (what a test does); returns the armed file."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(sorted(POINTS))}")
    path = Path(directory) / point
    path.write_text(json.dumps({"context": context, "action": action}) if action != "kill" else context)
    return path


def release(directory: str | Path, point: str) -> None:
    """Let every process held at ``point`` go on (see ``action="hold"``)."""
    (Path(directory) / f".{point}.release").touch()


def fired_context(directory: str | Path, point: str) -> str | None:
    """The context that fired ``point`` (None while it has not fired)."""
    for fired in Path(directory).glob(f".{point}.fired.*"):
        try:
            context = fired.read_text()
        except OSError:
            continue
        if context:  # written just after the claiming rename
            return context
    return None
