"""Retention: a finished run's payloads, and its workspace, are deleted once their time is up.

``NODUS_PAYLOAD_RETENTION`` (default 30 days) after a run's ``status.finishedAt`` its recorded
payloads go: its input (``spec.input``, later generations' inputs), its messages, its journal's
values (model requests and replies, command output, step results: `durable.skeleton` keeps the
records' skeleton), its answer (the file and ``status.answer.preview``), the turns' prompts, a
program's outputs, return value and log, its connection records, and (for an evaluation group,
after the group ends) its cases' evidence. The run, its phases, the steps' skeleton (ids, kinds,
states, times, attempts, costs) and its totals (``status.cost``, the turns' tokens and costs)
stay; ``status.payloadsExpiredAt`` says when. Reading what went answers 410 ``PayloadExpired``.

``NODUS_WORKSPACE_RETENTION`` (default 24 hours) after it ends, a run's workspace goes: its
directory on the node it ran on (`node_workspaces`) and its snapshots (and seed) in storage;
``status.sandbox.workspaceDeletedAt`` says when it was gone, and a retry of the run is refused
from the moment its deletion began
(decision 46: replaying a journal whose commands' effects are gone would go on from the wrong
files).

How it is kept right:

* Everything is derived from run.json (``finishedAt``, the two fields above, and
  ``status.retention``, which says ``Expiring``/``Expired`` and ``Deleting``/``Deleted``), so a
  restarted control plane picks up where the last one stopped: a run marked ``Expiring`` but not
  ``Expired`` is swept again, and every step of a sweep may be done twice.
* An unfinished run is never touched, nor a finished one something unfinished still reads: a
  member of a group that has not ended (its grader reads the answer and the workspace), a
  child whose parent has not ended (``gather`` reads its return value and outputs). A Waiting
  keep-alive run is unfinished. Each run is swept under its lock, after checking it is still
  finished (a retry takes the same lock, and is refused once the mark is written).
* No polling: one timer, armed for the earliest time anything is due (from the runs in memory),
  armed again after each sweep and whenever a run finishes earlier than that; blocked runs are
  looked at again every `_BLOCKED_RECHECK`, and everything every `_RESCAN` at the latest.
* Storage is read and written off the event loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from nodus.lifecycle import GROUP_TERMINAL_PHASES, RUN_TERMINAL_PHASES
from nodus_ray.control.registry import Key, Registry
from nodus_ray.control.retention_policy import RetentionPolicy
from nodus_ray.durable.skeleton import rewrite_skeleton
from nodus_ray.sandbox.run_workspaces import workspace_path
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.settings import ServerSettings
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import format_timestamp, parse_timestamp

__all__ = ["RetentionSweeper", "SweepReport", "expire_run_files", "scrub_run_document"]

logger = logging.getLogger(__name__)

_RESCAN = timedelta(hours=1)  # the longest the timer waits, whatever it was armed for
_BLOCKED_RECHECK = timedelta(seconds=60)  # a due run something unfinished still reads
Work = Literal["payloads", "workspace"]
RemoveOnNode = Callable[[str, str], Awaitable[bool]]  # (node id, path): `node_workspaces.remove_on_node`
# What a run keeps beside its journal that is payload (`layout`): deleted on expiry.
_PAYLOAD_FOLDERS = ("messages", "outputs", "logs", "generations", "egress")


@dataclass
class SweepReport:
    """What one sweep did (a test and the log read it)."""

    payloads: list[Key] = field(default_factory=list)
    workspaces: list[Key] = field(default_factory=list)
    groups: list[Key] = field(default_factory=list)


def _finished_at(resource: dict[str, Any], terminal: frozenset[Any]) -> datetime | None:
    status = resource.get("status") or {}
    finished = status.get("finishedAt")
    if status.get("phase") not in terminal or not finished:
        return None
    try:
        return parse_timestamp(str(finished))
    except ValueError:
        return None


def _done(status: dict[str, Any], work: Work) -> bool:
    state = (status.get("retention") or {}).get(work)
    return state == ("Expired" if work == "payloads" else "Deleted")


def scrub_run_document(run: dict[str, Any]) -> None:
    """Remove the payloads a run's document holds: its input, answer preview, turns' prompts."""
    spec, status = run["spec"], run["status"]
    if "input" in spec:
        spec["input"] = ""
    answer = status.get("answer")
    if isinstance(answer, dict):
        answer["preview"] = ""
    for turn in status.get("turns") or []:
        if isinstance(turn, dict):
            turn["prompt"] = ""
    for field_name in ("step", "waitingFor"):  # what a finished run was doing: none, or content
        status[field_name] = None


def expire_run_files(storage: Storage, key: Key) -> None:
    """Delete what a run keeps of its payloads in storage, its journals made skeletons
    (blocking: call it in a thread). Safe to call again, and after a stop anywhere."""
    project, name = key
    prefix = layout.run_prefix(project, name)
    for entry in storage.list_dir(prefix):
        if entry == "journal" or entry.startswith("journal-g"):
            rewrite_skeleton(storage, f"{prefix}/{entry}")
    for folder in _PAYLOAD_FOLDERS:
        storage.delete_tree(f"{prefix}/{folder}")
    storage.delete(layout.run_answer(project, name))
    storage.delete(layout.run_result(project, name))
    _scrub_batch_records(storage, project, name)


def _scrub_batch_records(storage: Storage, project: str, name: str) -> None:
    """A kept batch answer (`batches`, an Idempotency-Key's replay) holds the runs as created."""
    folder = layout.batches_folder(project)
    for entry in storage.list_dir(folder):
        path = f"{folder}/{entry}"
        try:
            record = storage.read_json(path)
        except Exception:  # noqa: BLE001 - a damaged record is the batch service's to prune
            continue
        changed = False
        for item in record.get("items") or []:
            if (item.get("metadata") or {}).get("name") == name and (item.get("spec") or {}).get("input"):
                item["spec"]["input"] = ""
                changed = True
        if changed:
            storage.write_json(path, record)


def _remove_workspace(storage: Storage, sandbox_root: str, run: dict[str, Any]) -> None:
    """The run's directory (and marker) on this node, its snapshots and seed in storage."""
    metadata = run["metadata"]
    project, name = str(metadata["project"]), str(metadata["name"])
    local = workspace_path(sandbox_root, project, name, metadata.get("uid"))
    shutil.rmtree(local, ignore_errors=True)
    WorkspaceSnapshots.marker_of(local).unlink(missing_ok=True)
    prefix = layout.run_prefix(project, name)
    storage.delete_tree(layout.workspace_folder(prefix))
    storage.delete(layout.seed(prefix))


def _expire_case_records(storage: Storage, key: Key) -> None:
    """An evaluation group's cases keep their scores, not their evidence; the results table too."""
    from nodus_ray.core.evaluation import results_parquet

    folder = layout.evaluation_cases_folder(*key)
    records = []
    for entry in storage.list_dir(folder):
        if not entry.endswith(".json"):
            continue
        record = storage.read_json(f"{folder}/{entry}")
        if record.get("evidence"):
            record["evidence"] = ""
            storage.write_json(f"{folder}/{entry}", record)
        records.append(record)
    group = storage.read_json(layout.group_document(*key))
    if records and storage.exists(layout.evaluation_results(*key)):
        evaluation = (group.get("status") or {}).get("evaluation") or {}
        storage.write_bytes(layout.evaluation_results(*key), results_parquet(key[1], evaluation, records))


class RetentionSweeper:
    """Deletes finished runs' payloads and workspaces when due; see the module docstring."""

    def __init__(
        self,
        registry: Registry,
        settings: ServerSettings,
        forget_evaluation: Any = None,
        remove_on_node: RemoveOnNode | None = None,
    ) -> None:
        self._registry = registry
        self._sandbox_root = settings.sandbox_root
        self.payloads = RetentionPolicy.parse(settings.payload_retention, "NODUS_PAYLOAD_RETENTION")
        self.workspaces = RetentionPolicy.parse(settings.workspace_retention, "NODUS_WORKSPACE_RETENTION")
        self._forget_evaluation = forget_evaluation  # `EvaluationService.forget`: its cases are reread
        self._remove_on_node = remove_on_node  # the copy on the node the run ran on, when not this one
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for: datetime | None = None
        self._sweeping: asyncio.Task[SweepReport] | None = None
        self._again = False
        self._started = False
        registry.on_run_changed(self._run_changed)

    @property
    def armed_for(self) -> datetime | None:
        """When the timer fires next (None: not armed)."""
        return self._armed_for

    @property
    def sweeping(self) -> asyncio.Task[SweepReport] | None:
        """The sweep under way or last done (a test awaits it)."""
        return self._sweeping

    # -- when things are due --------------------------------------------------------------

    def _blocked(self, run: dict[str, Any]) -> bool:
        """Whether something unfinished still reads the finished run (its group, its parent)."""
        project = run["metadata"]["project"]
        group = run["spec"].get("group")
        if group:
            found = self._registry.groups.get((project, group))
            if found is not None and found["status"].get("phase") not in GROUP_TERMINAL_PHASES:
                return True
        parent = run["status"].get("parent")
        return bool(parent) and not self._registry.is_over((project, str(parent)))

    def due(self, run: dict[str, Any]) -> list[tuple[Work, datetime]]:
        """What is left to delete of the run, and when it is due (nothing for an unfinished run)."""
        finished = _finished_at(run, RUN_TERMINAL_PHASES)
        if finished is None:
            return []
        project = str(run["metadata"]["project"])
        status = run["status"]
        left: list[tuple[Work, datetime]] = []
        if not _done(status, "workspace"):
            left.append(("workspace", finished + self.workspaces.for_project(project)))
        if not _done(status, "payloads"):
            left.append(("payloads", finished + self.payloads.for_project(project)))
        return left

    def _group_due(self, project: str, group: dict[str, Any]) -> datetime | None:
        finished = _finished_at(group, GROUP_TERMINAL_PHASES)
        if finished is None or not group["spec"].get("evaluation"):
            return None
        if group["status"].get("payloadsExpiredAt") or group["metadata"].get("deletionTimestamp"):
            return None
        return finished + self.payloads.for_project(project)

    def next_due(self, now: datetime | None = None) -> datetime | None:
        """The earliest time anything is due (a blocked run: `_BLOCKED_RECHECK` from now)."""
        now = now or datetime.now(UTC)
        times: list[datetime] = []
        for run in self._registry.runs.values():
            for _, due in self.due(run):
                times.append(max(due, now + _BLOCKED_RECHECK) if due <= now and self._blocked(run) else due)
        for (project, _), group in self._registry.groups.items():
            group_due = self._group_due(project, group)
            if group_due is not None:
                times.append(group_due)
        return min(times) if times else None

    # -- the timer ------------------------------------------------------------------------

    def start(self) -> None:
        """After recovery: sweep what came due while the service was down, then keep the timer."""
        self._started = True
        self.sweep_soon()

    def stop(self) -> None:
        self._started = False
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_for = None, None

    def _arm(self, at: datetime | None = None) -> None:
        """Arm the one timer for ``at`` (default: `next_due`), at most `_RESCAN` from now."""
        if not self._started:
            return
        now = datetime.now(UTC)
        at = at if at is not None else self.next_due(now)
        at = min(at, now + _RESCAN) if at is not None else now + _RESCAN
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, (at - now).total_seconds())
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)
        self._armed_for = at

    def _fire(self) -> None:
        self._timer, self._armed_for = None, None
        self.sweep_soon()

    async def _run_changed(self, key: Key) -> None:
        """A run that just finished may be due before the timer: arm it earlier."""
        run = self._registry.runs.get(key)
        if not self._started or run is None:
            return
        due = min((when for _, when in self.due(run)), default=None)
        if due is not None and (self._armed_for is None or due < self._armed_for):
            self._arm(due)

    def sweep_soon(self) -> asyncio.Task[SweepReport]:
        """Sweep in the background; asked while one runs, it goes round once more."""
        self._again = True
        if self._sweeping is None or self._sweeping.done():
            self._sweeping = asyncio.get_running_loop().create_task(self._sweep_while_asked())
        return self._sweeping

    async def _sweep_while_asked(self) -> SweepReport:
        report = SweepReport()
        try:
            while self._again:
                self._again = False
                try:
                    done = await self.sweep()
                except Exception:  # noqa: BLE001 - what failed is due still: the next sweep tries again
                    logger.exception("the retention sweep failed; it runs again at the next timer")
                    continue
                report.payloads += done.payloads
                report.workspaces += done.workspaces
                report.groups += done.groups
        finally:
            self._arm()
        return report

    # -- the sweep ------------------------------------------------------------------------

    async def sweep(self, now: datetime | None = None) -> SweepReport:
        """Delete everything due at ``now``: each run's workspace, then its payloads; groups'."""
        report = SweepReport()
        now = now or datetime.now(UTC)
        for key, run in list(self._registry.runs.items()):
            for work, due in self.due(run):
                if due > now or self._blocked(run):
                    continue
                try:
                    if work == "workspace" and await self.delete_workspace(key, now):
                        report.workspaces.append(key)
                    if work == "payloads" and await self.expire_payloads(key, now):
                        report.payloads.append(key)
                except Exception:  # noqa: BLE001 - one run's storage error must not stop the others
                    logger.exception("run %s/%s: its %s could not be deleted; tried again later", *key, work)
        for key, group in list(self._registry.groups.items()):
            group_due = self._group_due(key[0], group)
            if group_due is not None and group_due <= now:
                try:
                    if await self.expire_group(key, now):
                        report.groups.append(key)
                except Exception:  # noqa: BLE001 - tried again at the next sweep
                    logger.exception("group %s/%s: its case records could not be expired", *key)
        if report.payloads or report.workspaces or report.groups:
            logger.info(
                "retention: payloads of %d run(s), workspaces of %d, case records of %d group(s) deleted",
                len(report.payloads),
                len(report.workspaces),
                len(report.groups),
            )
        return report

    def _still_due(self, key: Key, work: Work, now: datetime) -> dict[str, Any] | None:
        """The run, if (under its lock) it is still finished, unblocked and due for ``work``."""
        run = self._registry.runs.get(key)
        if run is None or self._blocked(run):
            return None
        if not any(what == work and due <= now for what, due in self.due(run)):
            return None
        return run

    async def expire_payloads(self, key: Key, now: datetime | None = None) -> bool:
        """Delete the run's payloads now if it is finished and they are due; True when done."""
        now = now or datetime.now(UTC)
        registry = self._registry
        async with registry.locks[key]:
            run = self._still_due(key, "payloads", now)
            if run is None:
                return False
            status = run["status"]
            # Marked first: from here on reads answer PayloadExpired, and a restart finishes the job.
            status["payloadsExpiredAt"] = status.get("payloadsExpiredAt") or format_timestamp(now)
            status["retention"] = {**(status.get("retention") or {}), "payloads": "Expiring"}
            scrub_run_document(run)
            await registry.persist_run(key)
            await asyncio.to_thread(expire_run_files, registry.storage, key)
            status["retention"]["payloads"] = "Expired"
            await registry.persist_run(key)
        return True

    async def delete_workspace(self, key: Key, now: datetime | None = None) -> bool:
        """Delete the run's workspace now if it is finished and it is due; True when done."""
        now = now or datetime.now(UTC)
        registry = self._registry
        async with registry.locks[key]:
            run = self._still_due(key, "workspace", now)
            if run is None:
                return False
            status = run["status"]
            sandbox = status.setdefault("sandbox", {})
            # Marked first: a retry is refused from here on, and a restart finishes the job.
            status["retention"] = {**(status.get("retention") or {}), "workspace": "Deleting"}
            await registry.persist_run(key)
            await asyncio.to_thread(_remove_workspace, registry.storage, self._sandbox_root, run)
            node = sandbox.get("nodeId")
            if node and self._remove_on_node is not None:
                metadata = run["metadata"]
                path = workspace_path(self._sandbox_root, key[0], key[1], metadata.get("uid"))
                await self._remove_on_node(str(node), str(path))
            sandbox["workspaceDeletedAt"] = sandbox.get("workspaceDeletedAt") or format_timestamp(now)
            status["retention"]["workspace"] = "Deleted"
            await registry.persist_run(key)
        return True

    async def expire_group(self, key: Key, now: datetime | None = None) -> bool:
        """An ended evaluation group's case records lose their evidence; its results read 410."""
        now = now or datetime.now(UTC)
        registry = self._registry
        async with registry.locks[("group", *key)]:
            group = registry.groups.get(key)
            due = self._group_due(key[0], group) if group is not None else None
            if group is None or due is None or due > now:
                return False
            await asyncio.to_thread(_expire_case_records, registry.storage, key)
            if self._forget_evaluation is not None:
                self._forget_evaluation(key)  # its records are read again, as they are now
            group["status"]["payloadsExpiredAt"] = format_timestamp(now)
            await registry.persist_group(key)
        return True
