"""The grader: one detached actor per live evaluation group, apart from every run.

Grading is isolated from the agent it judges. It runs in its own Ray worker process, never in
a run actor (which holds the agent's model access and its sandbox), never calls a model, and
works on its own copy of the agent's workspace: the snapshot the run left in storage (see
`sandbox.snapshots`), unpacked under the sandbox root's ``.grading`` folder. An
Environment's commands (hidden tests, say) run in a fresh sandbox over that copy, so nothing
the grader writes ever reaches the run, and nothing the agent left can reach the grader's
process except through a sandboxed command.

Hidden answers never cross a process boundary: the grader regenerates the task batch from the
evaluation's (environment, split, seed, tasks) itself, so the control plane sends only the
task's index, the run's name and its answer text, and nothing stores an answer.

The actor holds no state worth keeping: a grade is a pure function of the answer and the
workspace snapshot, so a lost grader (or a lost reply) is simply asked again.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import shutil
import stat
import tarfile
import time
from pathlib import Path
from typing import Any

import ray

from nodus_ray.environments import Environment, GraderError, GradingWorkspace, Task, resolve
from nodus_ray.sandbox.snapshots import NO_COMMAND, WorkspaceSnapshots
from nodus_ray.settings import NAMESPACE
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

__all__ = ["Grader", "RemoteGrader", "grader_name", "grader_options", "GRADING_CONCURRENCY"]

logger = logging.getLogger(__name__)

GRADING_CONCURRENCY = 4  # cases graded at once by one group's grader (each may run a sandbox)
_EVIDENCE_LIMIT = 500


def grader_name(project: str, group: str) -> str:
    return f"grader.{project}.{group}"


def grader_options(project: str, group: str) -> dict[str, Any]:
    return {
        "name": grader_name(project, group),
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
    }


class Grader:
    """Grades one evaluation group's cases, a few at a time, each on its own workspace copy."""

    def __init__(
        self, project: str, group: str, storage: Storage, grading_root: str, hidden_paths: tuple[str, ...]
    ) -> None:
        self.project = project
        self.group = group
        self._storage = storage
        self._root = Path(grading_root) / project / group
        self._hidden = tuple(Path(path) for path in hidden_paths)
        self._batches: dict[tuple[str, str, int, int], list[Task]] = {}
        self._slots = asyncio.Semaphore(GRADING_CONCURRENCY)

    def __repr__(self) -> str:
        return f"Grader(group={self.project}/{self.group})"

    async def grade(self, case: dict[str, Any]) -> dict[str, Any]:
        """``{"outcome": "scored", verdict, reward, evidence, seconds}`` or ``{"outcome": "failed", evidence}``.

        ``case`` holds ``environment``, ``split``, ``seed``, ``tasks``, ``taskIndex``, ``run``,
        ``runPrefix``, ``localWorkspace``, ``commands`` (how many the run ran), ``uid`` (what the
        grader's sandbox runs as) and ``answer``. ``cpuSeconds`` in the answer is what the
        grading's sandboxed commands used, which the group is billed.
        """
        async with self._slots:
            return await asyncio.to_thread(self._grade, case)

    def _grade(self, case: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        workspace_dir = self._root / case["run"]
        workspace: GradingWorkspace | None = None
        try:
            environment = resolve(case["environment"])
            task = self._task(environment, case)
            workspace = self._workspace(case, workspace_dir)
            grade = environment.grade(task, case["answer"], workspace)
        except GraderError as error:
            return {
                "outcome": "failed",
                "evidence": _cut(f"the grader could not grade: {error}"),
                "seconds": round(time.monotonic() - started, 3),
                "cpuSeconds": _cpu(workspace),
            }
        except Exception as error:  # noqa: BLE001 - any grader bug is an unscored case, not a crash
            # Only the type: a third-party grader's message might quote the hidden answer.
            logger.exception("grader of %s failed on %s", case["environment"], case["run"])
            return {
                "outcome": "failed",
                "evidence": f"the grader failed ({type(error).__name__})",
                "seconds": round(time.monotonic() - started, 3),
                "cpuSeconds": _cpu(workspace),
            }
        finally:
            shutil.rmtree(workspace_dir, ignore_errors=True)
        return {
            "outcome": "scored",
            "verdict": grade.verdict,
            "reward": float(grade.reward),
            "evidence": _cut(grade.evidence),
            "seconds": round(time.monotonic() - started, 3),
            "cpuSeconds": _cpu(workspace),
        }

    def _task(self, environment: Environment, case: dict[str, Any]) -> Task:
        key = (case["environment"], case["split"], int(case["seed"]), int(case["tasks"]))
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = environment.tasks(
                case["split"], int(case["seed"]), int(case["tasks"])
            )
        return batch[int(case["taskIndex"])]

    def _workspace(self, case: dict[str, Any], into: Path) -> GradingWorkspace:
        """A copy of the workspace as the agent's last command left it (as seeded, if it ran none).

        The newest of two candidates: the run's directory on this node (its marker names the
        last command it holds) and the newest snapshot in storage. A directory left on this
        node by an earlier attempt of a run that moved is older than the snapshot and loses.
        """
        shutil.rmtree(into, ignore_errors=True)
        local = WorkspaceSnapshots(self._storage, case["runPrefix"], Path(case["localWorkspace"]))
        local_seq = local.local_seq()
        stored_seq = local.stored_seq()
        if local_seq is not None and local_seq >= (stored_seq if stored_seq is not None else NO_COMMAND):
            shutil.copytree(local.workspace, into, symlinks=True, copy_function=_copy_regular)
        elif stored_seq is not None:
            local.unpack(stored_seq, into)  # refuses what would write outside ``into``
        elif int(case.get("commands") or 0) > 0:
            into.mkdir(parents=True, mode=0o700)
            return _MissingWorkspace(into, hidden_paths=self._hidden, uid=case.get("uid"))
        elif self._storage.exists(layout.seed(case["runPrefix"])):
            _unpack(self._storage.read_bytes(layout.seed(case["runPrefix"])), into)
        else:
            into.mkdir(parents=True, mode=0o700)  # no command and no seed: an empty workspace
        into.chmod(0o700)
        return GradingWorkspace(into, hidden_paths=self._hidden, uid=case.get("uid"))

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)


class _MissingWorkspace(GradingWorkspace):
    """The run ran commands but its workspace is on no disk here and in no snapshot.

    Grading that reads the workspace fails (an unscored case, not a zero reward); grading
    that looks only at the answer still works.
    """

    _WHY = (
        "the workspace the agent left is not available to the grader: it is not on this node "
        "and not in storage (snapshots off, or the workspace is over the snapshot size limit)"
    )

    def read_text(self, path: str) -> str | None:
        raise GraderError(self._WHY)

    def exists(self, path: str) -> bool:
        raise GraderError(self._WHY)

    def run(self, command: str, *, timeout: float = 30.0) -> Any:
        raise GraderError(self._WHY)


def _copy_regular(source: str, target: str) -> None:
    """Regular files only: opening a FIFO the agent left would block the grader for good."""
    if stat.S_ISREG(os.lstat(source).st_mode):
        shutil.copy2(source, target)


def _unpack(data: bytes, into: Path) -> None:
    into.mkdir(parents=True, mode=0o700)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        archive.extractall(into, filter="data")  # no absolute paths, no links out, no devices


def _cpu(workspace: GradingWorkspace | None) -> float:
    """The CPU seconds the grading's sandboxed commands used (billed to the group, decision 44)."""
    return round(workspace.cpu_seconds, 3) if workspace is not None else 0.0


def _cut(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _EVIDENCE_LIMIT else text[: _EVIDENCE_LIMIT - 3] + "..."


RemoteGrader = ray.remote(  # type: ignore[call-overload]  # Ray's stubs lack max_concurrency
    num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=64
)(Grader)
