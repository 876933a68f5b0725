"""The control plane's resources in memory, mirrored to storage: the state its services share.

Every service of the control plane reads and changes the same agents, runs and groups, so they
live here, once, with the per-resource locks that serialize changes and the writes that mirror
them to storage (storage is the only durable state). `Registry.load` reads everything back at
startup; a damaged file is logged and skipped, never fatal.

A registry also carries `run_changed`, the one signal that flows upward: whoever changes a
run's phase or spend emits it after writing the run, and the group service (which forwards a
member's progress to its group's supervisor) listens.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from nodus.errors import Invalid, NotFound
from nodus.lifecycle import (
    PARKED_REASONS,
    RUN_TERMINAL_PHASES,
    WAITING_FIELDS,
    RunPhase,
    RunReason,
    check_run_transition,
)
from nodus.resources import validate_dns_label
from nodus_ray.control.batches import BatchRecords
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

__all__ = [
    "Key",
    "Registry",
    "RunChanged",
    "check_project",
    "parked",
    "merge_status",
    "awaits_admission",
    "admission_state",
    "is_over",
    "is_terminal_run",
    "is_python",
    "suspended",
    "children_ended",
]

logger = logging.getLogger(__name__)

Key = tuple[str, str]
Resource = dict[str, Any]
RunChanged = Callable[[Key], Awaitable[None]]


def check_project(project: str) -> str:
    """A project name is a DNS label; anything else is refused before it reaches storage."""
    try:
        return validate_dns_label(project)
    except ValueError as exc:
        raise Invalid(f"project: {exc}", details={"field": "project"}) from None


def parked(run: Resource) -> bool:
    """A Waiting run that holds no actor: nothing moves it but a person or its deadline."""
    return run["status"]["phase"] == RunPhase.WAITING and run["status"].get("reason") in PARKED_REASONS


def suspended(run: Resource) -> bool:
    """Parked by `suspend` until `resume`: no timer, message or child's end moves it."""
    return bool(
        run["status"]["phase"] == RunPhase.WAITING and run["status"].get("reason") == RunReason.SUSPENDED
    )


def is_python(run: Resource) -> bool:
    """A run of an Agent whose pinned spec has an ``entrypoint`` (a durable Python program)."""
    return bool(run["status"].get("program") == "Python")


def children_ended(runs: dict[Key, Resource], project: str, names: list[str]) -> bool:
    """Whether every named child run has finished (a deleted one counts as finished: nothing
    would ever end it, and a parent waiting for it must not wait forever)."""
    return all(is_terminal_run(runs.get((project, name))) for name in names)


def is_terminal_run(run: Resource | None) -> bool:
    return run is None or run["status"]["phase"] in RUN_TERMINAL_PHASES


def awaits_admission(run: Resource) -> bool:
    """A queued member: it gets an actor only when its group's supervisor admits it."""
    return bool(run["spec"].get("group")) and not run["status"].get("admittedAt")


def admission_state(run: Resource) -> str:
    """A run's state as admission counts it: started means admitted, whatever the actor says."""
    phase = run["status"]["phase"]
    if phase == RunPhase.PENDING:
        return "Active" if run["status"].get("admittedAt") else "Queued"
    if phase == RunPhase.RUNNING:
        return "Active"
    return str(phase)  # Waiting, Succeeded, Failed, Cancelled


def merge_status(status: dict[str, Any], patch: dict[str, Any]) -> None:
    """Merge a run's status patch: nested objects (cost, messages, sandbox) are merged one level deep.

    Every change of a run's status goes through here (a run actor's reports and outcome, the
    supervisor's own decisions), so a phase change is checked against the lifecycle here once:
    an illegal one raises `IllegalTransition` and changes nothing.
    """
    if "phase" in patch:
        frm = str(status.get("phase") or RunPhase.PENDING)
        check_run_transition(frm, str(patch["phase"]))
        if frm == RunPhase.WAITING and patch["phase"] != RunPhase.WAITING:
            # What a parked program waited for is over once it leaves Waiting (`WAITING_FIELDS`).
            for field in WAITING_FIELDS:
                if field not in patch and status.get(field) is not None:
                    status[field] = None
    for field, value in patch.items():
        if isinstance(value, dict) and isinstance(status.get(field), dict):
            status[field].update(value)
        else:
            status[field] = value


class Registry:
    """Agents, runs and groups by ``(project, name)``; locks; the writes that mirror them."""

    def __init__(self, storage: Storage, batches: BatchRecords) -> None:
        self.storage = storage
        self.batches = batches
        self.agents: dict[Key, Resource] = {}
        self.runs: dict[Key, Resource] = {}
        self.groups: dict[Key, Resource] = {}
        self.group_members: defaultdict[Key, list[str]] = defaultdict(list)  # in creation order
        # Keys are a run's or agent's (project, name), ("group", project, name) or
        # ("batch", project, idempotency key): one lock per thing changed.
        self.locks: defaultdict[tuple[str, ...], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._run_changed: list[RunChanged] = []
        self._group_changed: list[RunChanged] = []

    def __repr__(self) -> str:
        return f"Registry(agents={len(self.agents)}, runs={len(self.runs)}, groups={len(self.groups)})"

    # -- the upward signal ------------------------------------------------------------------

    def on_run_changed(self, listener: RunChanged) -> None:
        """Call ``listener(key)`` whenever a run's phase or spend changed (after it was written)."""
        self._run_changed.append(listener)

    async def run_changed(self, key: Key) -> None:
        for listener in self._run_changed:
            await listener(key)

    def on_group_changed(self, listener: RunChanged) -> None:
        """Call ``listener(key)`` whenever a group's phase changed (after it was written)."""
        self._group_changed.append(listener)

    async def group_changed(self, key: Key) -> None:
        for listener in self._group_changed:
            await listener(key)

    # -- lookups ----------------------------------------------------------------------------

    def run(self, project: str, name: str) -> Resource:
        """The run, or the API's NotFound."""
        check_project(project)
        run = self.runs.get((project, name))
        if run is None:
            raise NotFound(
                f"agentrun {name!r} not found in project {project!r}",
                details={"kind": "AgentRun", "name": name},
            )
        return run

    def group(self, project: str, name: str) -> Resource:
        """The group (one being deleted is gone already), or the API's NotFound."""
        group = self.groups.get((project, name))
        if group is None or group["metadata"].get("deletionTimestamp"):
            raise NotFound(
                f"agentgroup {name!r} not found in project {project!r}",
                details={"kind": "AgentGroup", "name": name},
            )
        return group

    def is_over(self, key: Key) -> bool:
        """True when the run is gone or finished."""
        return is_terminal_run(self.runs.get(key))

    # -- persistence ------------------------------------------------------------------------

    async def persist_run(self, key: Key) -> None:
        """Write the run; every write is a new ``metadata.resourceVersion`` (what `resolve` checks)."""
        run = self.runs.get(key)
        if run is not None:
            run["metadata"]["resourceVersion"] = int(run["metadata"].get("resourceVersion") or 0) + 1
            await asyncio.to_thread(self.storage.write_json, layout.run_document(*key), run)

    async def persist_group(self, key: Key) -> None:
        group = self.groups.get(key)
        if group is not None:
            await asyncio.to_thread(self.storage.write_json, layout.group_document(*key), group)

    # -- loading ----------------------------------------------------------------------------

    def load(self) -> None:
        """Read every resource back from storage (blocking: call it in a thread)."""
        for project in self.storage.list_dir(layout.projects_folder()):
            for name in self.storage.list_dir(layout.agents_folder(project)):
                self._load_one(self.agents, (project, name), layout.agent_document(project, name))
            # An unanswered batch is rolled back before its runs are read: all or nothing.
            for batch in self.batches.pending(project):
                for name in batch.names:
                    self.storage.delete_tree(layout.run_prefix(project, name))
                self.batches.abandon(project, batch.record_id)
            for name in self.storage.list_dir(layout.runs_folder(project)):
                self._load_one(self.runs, (project, name), layout.run_document(project, name))
            for name in self.storage.list_dir(layout.groups_folder(project)):
                self._load_one(self.groups, (project, name), layout.group_document(project, name))
        self._index_members()

    def _load_one(self, into: dict[Key, Resource], key: Key, path: str) -> None:
        try:
            into[key] = self.storage.read_json(path)
        except FileNotFoundError:
            logger.warning("no resource file at %s; skipped", path)
        except Exception:  # noqa: BLE001 - one damaged file must not stop the whole service
            logger.exception("could not read %s; skipped", path)

    def _index_members(self) -> None:
        """Each group's member names in creation order (``status.groupIndex``)."""
        indexed: defaultdict[Key, list[tuple[int, str]]] = defaultdict(list)
        for (project, name), run in self.runs.items():
            group = run["spec"].get("group")
            if group:
                indexed[(project, group)].append((int(run["status"].get("groupIndex") or 0), name))
        for key, entries in indexed.items():
            self.group_members[key] = [name for _, name in sorted(entries)]


is_over = is_terminal_run
