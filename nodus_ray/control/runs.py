"""AgentRuns: accepted (one, or a list all or none), read, cancelled, deleted, and reported on.

A run is written to storage before it is answered, pinned to its agent's current revision (the
agent's spec is stored with the run, so the run never depends on the Agent again). Several runs
go behind a batch record (`batches`), so a crash half-way leaves none of them. A plain run gets
its actor at once (`run_supervisor`); a group's run is checked by its group's supervisor first
and waits to be admitted (`groups`). Run actors report their progress here (`report`): the
control plane is the only writer of a run's resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from nodus.errors import Conflict, NotFound
from nodus.lifecycle import RUN_TERMINAL_PHASES, RunPhase, RunReason
from nodus.resources import (
    AgentRun,
    parse_resource,
    parse_run_list,
)
from nodus_ray import metrics
from nodus_ray.control.agent_budget import AgentBudget
from nodus_ray.control.batches import BatchRecords, request_digest
from nodus_ray.control.credits import CreditService
from nodus_ray.control.evaluations import EvaluationService
from nodus_ray.control.generations import run_journal
from nodus_ray.control.group_link import GroupLink, NewRun, run_cap
from nodus_ray.control.new_runs import ChildOf, new_run_resource
from nodus_ray.control.registry import Key, Registry, check_project, merge_status, suspended
from nodus_ray.control.retention_policy import check_payloads
from nodus_ray.control.run_images import ImagePins, LocalImages, agent_image, pin_images
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.control.templates import resolve_agent
from nodus_ray.durable.journal import record_view, step_views
from nodus_ray.durable.step_activity import running_time
from nodus_ray.faults import crash_point
from nodus_ray.store import layout
from nodus_ray.store.timestamps import utc_now

__all__ = ["RunService", "ChildOf"]

logger = logging.getLogger(__name__)

# Sandbox uids are handed out one per run, above the range the sandbox's own hash fallback
# uses (200000-249999), so no two runs ever share a process budget or kill each other's work.
_FIRST_SANDBOX_UID = 300_000
_METRICS_SECONDS = 5.0  # how often runs by phase are published (Prometheus scrapes every 10 s or so)


CancelChildren = Callable[[str, str], Awaitable[None]]  # (project, parent): its unfinished children end
Resource = dict[str, Any]
Prepare = Callable[[Key, Resource], None]  # fills a new run's storage before it is stored


class RunService:
    """The AgentRun verbs, and the reports of run actors."""

    def __init__(
        self,
        registry: Registry,
        batches: BatchRecords,
        supervisor: RunSupervisor,
        groups: GroupLink,
        evaluations: EvaluationService,
        credits: CreditService,
        local_images: LocalImages = LocalImages(),
    ) -> None:
        self._registry = registry
        self._local_images = local_images  # where local image references may be read
        self._batches = batches
        self._supervisor = supervisor
        self._groups = groups
        self._evaluations = evaluations
        self._credits = credits
        self._creating: set[Key] = set()  # run names taken by a batch that is being written
        self._last_sandbox_uid: int | None = None
        self._budget = AgentBudget(registry)  # the Agent's maxCostUSD over all its runs
        self._cancel_children: CancelChildren | None = None
        self._image_pins: dict[Key, ImagePins] = {}  # runs being created: their images' digests

    def connect(self, cancel_children: CancelChildren) -> None:
        """The children service, built after this one: deleting a parent cancels its children."""
        self._cancel_children = cancel_children

    async def publish_metrics(self) -> None:
        """Runs by phase for Ray's metrics export (`metrics`); a project emptied shows zeros."""
        projects: set[str] = set()
        runs = self._registry.runs
        while True:
            counts = Counter((project, run["status"]["phase"]) for (project, _), run in runs.items())
            projects |= {project for project, _ in runs}
            metrics.set_runs_by_phase(counts, projects)
            await asyncio.sleep(_METRICS_SECONDS)

    async def create_run(
        self, project: str, document: dict[str, Any], mode: str = "create"
    ) -> dict[str, Any]:
        """Accept one run: a batch of one (``mode="apply"`` answers an identical run as unchanged)."""
        check_project(project)
        run = parse_resource(document, expected_kind="AgentRun")
        assert isinstance(run, AgentRun)
        return (await self._create_runs(project, [run], mode=mode))[0]

    async def create_runs(
        self, project: str, document: dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Accept an AgentRunList: every run, in list order, or none.

        With an ``idempotency_key`` the answer is kept, and the same key again returns it and
        creates nothing; the same key with other runs is refused. ``replayed`` says which.
        """
        check_project(project)
        runs = parse_run_list(document)
        digest = request_digest([run.model_dump(mode="json", exclude_none=True) for run in runs])
        lock_key = ("batch", project, idempotency_key or "")
        async with self._registry.locks[lock_key] if idempotency_key else contextlib.nullcontext():
            if idempotency_key:
                record = await asyncio.to_thread(self._batches.find, project, idempotency_key)
                if record is not None:
                    if record["digest"] != digest:
                        raise Conflict(
                            "the Idempotency-Key was used for a different batch of runs; "
                            "use a new key for new runs",
                            code="IdempotencyKeyReused",
                            details={"field": "Idempotency-Key"},
                        )
                    return {"items": record["items"], "replayed": True}
            results = await self._create_runs(
                project, runs, mode="create", idempotency_key=idempotency_key, digest=digest
            )
        return {"items": [result["resource"] for result in results], "replayed": False}

    async def create_members(
        self,
        project: str,
        runs: list[AgentRun],
        *,
        mode: str,
        evaluation_member: bool = False,
        pinned_agent: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """An evaluation's runs, of the Agent revision its group pinned (`evaluations.MemberCreator`)."""
        return await self._create_runs(
            project, runs, mode=mode, evaluation_member=evaluation_member, pinned_agent=pinned_agent
        )

    async def _create_runs(
        self,
        project: str,
        runs: list[AgentRun],
        *,
        mode: str,
        idempotency_key: str | None = None,
        digest: str | None = None,
        evaluation_member: bool = False,
        pinned_agent: dict[str, Any] | None = None,
        child_of: ChildOf | None = None,
        prepare: Prepare | None = None,
    ) -> list[dict[str, Any]]:
        """Check every run, then write them all (behind a batch record when there are several).

        Names are taken synchronously (no await between the check and the taking), so two
        concurrent batches can never both create one name. Group members are checked by their
        group's supervisor first and handed to it after they are stored; other runs get their
        actor at once. ``pinned_agent`` (an evaluation's runs) is the Agent revision they run,
        instead of the current one.
        """
        results: list[dict[str, Any] | None] = [None] * len(runs)
        fresh: list[NewRun] = []
        taken: set[Key] = set()
        for index, run in enumerate(runs):
            name = run.metadata.name
            key = (project, name)
            where = f"items[{index}]: " if len(runs) > 1 else ""
            spec = run.spec.model_dump(mode="json", exclude_none=True)
            existing = self._registry.runs.get(key)
            if existing is not None or key in self._creating or key in taken:
                if existing is not None and mode == "apply" and existing["spec"] == spec:
                    results[index] = {"resource": existing, "result": "unchanged"}
                    continue
                if existing is not None and mode == "apply":
                    raise Conflict(
                        f"{where}agentrun {name!r} exists with another spec; a run's spec cannot "
                        "change (delete it and create it again)",
                        details={"kind": "AgentRun", "name": name, "index": index},
                    )
                raise Conflict(
                    f"{where}agentrun {name!r} already exists",
                    code="AlreadyExists",
                    details={"kind": "AgentRun", "name": name, "index": index},
                )
            agent = self._check_new_run(project, run, index, where)
            fresh.append((index, run, pinned_agent or agent))
            taken.add(key)
        if not fresh:
            return [result for result in results if result is not None]
        self._creating |= taken
        try:
            # Images first, outside every lock: resolving one may take seconds (`run_images`).
            pins = await pin_images((agent_image(agent) for _, _, agent in fresh), self._local_images)
            self._image_pins.update({(project, run.metadata.name): pins for _, run, _ in fresh})
            unpullable = {
                (project, run.metadata.name): why
                for _, run, agent in fresh
                if (why := pins.failure_of(agent_image(agent))) is not None
            }
            groups = sorted({run.spec.group for _, run, _ in fresh if run.spec.group})
            async with contextlib.AsyncExitStack() as stack:
                for group in groups:
                    await stack.enter_async_context(self._registry.locks[("group", project, group)])
                members = await self._groups.check_members(project, fresh, groups, evaluation_member)
                created = await self._write_runs(project, fresh, idempotency_key, digest, child_of, prepare)
                for (index, _, _), (_, resource) in zip(fresh, created, strict=True):
                    # As written: the answer a repeated Idempotency-Key replays must be the same.
                    results[index] = {"resource": copy.deepcopy(resource), "result": "created"}
                for group, wires in members.items():
                    await self._groups.add_members(project, group, wires)
        finally:
            self._creating -= taken
            for key in taken:
                self._image_pins.pop(key, None)
        for key, resource in created:
            if key in unpullable:  # stored, then failed at once: it never gets an actor
                failed = {"phase": RunPhase.FAILED.value, "reason": RunReason.IMAGE_PULL_FAILED.value}
                await self._supervisor.finish(key, {**failed, "message": unpullable[key]})
            elif resource["spec"].get("group"):
                self._supervisor.arm_deadline(key)  # a queued run's deadline runs while it waits to start
            else:
                self._supervisor.supervise(key)
        return [result for result in results if result is not None]

    def _check_new_run(self, project: str, run: AgentRun, index: int, where: str) -> dict[str, Any]:
        """The refusals that need no group: the agent exists and takes runs; returns the agent
        (the project's own, or else the template of that name, `templates.resolve_agent`)."""
        agent = resolve_agent(self._registry, project, run.spec.agent)
        if agent is None:
            raise NotFound(
                f"{where}spec.agent: agent {run.spec.agent!r} not found in project {project!r}",
                details={"kind": "Agent", "name": run.spec.agent, "field": "spec.agent", "index": index},
            )
        if agent["spec"]["state"] == "Stopped":
            raise Conflict(
                f"{where}agent {run.spec.agent!r} is stopped (spec.state: Stopped); it takes no runs",
                code="AgentStopped",
                details={"kind": "Agent", "name": run.spec.agent, "index": index},
            )
        return agent

    async def create_prepared(
        self, project: str, run: AgentRun, agent: Resource, prep: Prepare
    ) -> list[Resource]:
        """One run whose storage ``prep`` fills before it is stored and started (`forks`)."""
        return await self._create_runs(project, [run], mode="create", pinned_agent=agent, prepare=prep)

    async def create_child(
        self, project: str, run: AgentRun, pinned_agent: dict[str, Any], child_of: ChildOf
    ) -> dict[str, Any]:
        """A Python program's child run (`children`), of the Agent revision its parent pinned."""
        (result,) = await self._create_runs(
            project, [run], mode="create", pinned_agent=pinned_agent, child_of=child_of
        )
        resource: dict[str, Any] = result["resource"]
        return resource

    async def _write_runs(
        self,
        project: str,
        fresh: list[NewRun],
        idempotency_key: str | None,
        digest: str | None,
        child_of: ChildOf | None = None,
        prepare: Prepare | None = None,
    ) -> list[tuple[Key, dict[str, Any]]]:
        """Store the runs, all or none: several go behind a batch record (see `batches`)."""
        names = [run.metadata.name for _, run, _ in fresh]
        record = None
        if len(fresh) > 1 or idempotency_key:
            record = await asyncio.to_thread(
                self._batches.begin, project, idempotency_key, digest or "", names
            )
        created: list[tuple[Key, dict[str, Any]]] = []
        added: defaultdict[str, int] = defaultdict(int)  # members of this batch per group so far
        try:
            for _, run, agent in fresh:
                key = (project, run.metadata.name)
                group_index = None
                if run.spec.group:
                    group_index = (
                        len(self._registry.group_members[(project, run.spec.group)]) + added[run.spec.group]
                    )
                    added[run.spec.group] += 1
                resource = self._new_run(project, run, agent, group_index, child_of)
                await asyncio.to_thread(self._clear_leftovers, key)
                if prepare is not None:  # may add to its status; leaves nothing when it fails
                    await asyncio.to_thread(prepare, key, resource)
                # The pinned agent is stored with the run: the run never depends on the Agent again.
                await asyncio.to_thread(self._registry.storage.write_json, layout.run_agent(*key), agent)
                await asyncio.to_thread(
                    self._registry.storage.write_json, layout.run_document(*key), resource
                )
                created.append((key, resource))
                if record is not None and len(created) == 1 < len(fresh):
                    crash_point("batch-half-written", f"{project}/{key[1]}")
            if record is not None:
                items = [resource for _, resource in created] if idempotency_key else None
                await asyncio.to_thread(self._batches.commit, project, record, digest or "", items)
        except BaseException:
            for key, _ in created:  # roll back: a refused or failed batch leaves nothing behind
                await asyncio.to_thread(self._registry.storage.delete_tree, layout.run_prefix(*key))
            if record is not None:
                await asyncio.to_thread(self._batches.abandon, project, record)
            raise
        finally:
            for _, run, _ in fresh:
                self._budget.written((project, run.metadata.name))
        for key, resource in created:
            self._registry.runs[key] = resource
            group = resource["spec"].get("group")
            if group:
                self._registry.group_members[(project, group)].append(key[1])
        return created

    def _clear_leftovers(self, key: Key) -> None:
        """A new run starts from nothing: whatever an earlier run of that name left in storage
        (a delete that did not finish) goes first: its journal above all, which the new run
        would otherwise replay, and its fencing epochs. An evaluation's seed, stored for this
        run just before it is created, stays."""
        storage = self._registry.storage
        prefix = layout.run_prefix(*key)
        for name in storage.list_dir(prefix):
            if f"{prefix}/{name}" != layout.seed(prefix):
                storage.delete_tree(f"{prefix}/{name}")

    def _new_run(
        self,
        project: str,
        run: AgentRun,
        agent: dict[str, Any],
        group_index: int | None,
        child_of: ChildOf | None = None,
    ) -> dict[str, Any]:
        """The stored form of an accepted run (`new_runs`), with its cap, uid and image now."""
        created = utc_now()
        # The cap is copied now: changing the agent later does not change a started run.
        cap = run_cap(agent)
        limit = None if cap == "0" else Decimal(cap)
        if limit is not None and child_of is not None and child_of.cap_usd is not None:
            limit = min(limit, Decimal(child_of.cap_usd))
        if limit is not None and child_of is None:  # a child's cap is out of its parent's (`agent_budget`)
            limit = self._budget.limit(project, run.spec.agent, run.metadata.name, limit)
        uid = self._next_sandbox_uid()
        pins = self._image_pins.get((project, run.metadata.name))
        return new_run_resource(
            project,
            run,
            agent,
            created=created,
            limit_usd=None if limit is None else str(limit),
            sandbox_uid=uid,
            image=pins.status_of(agent_image(agent)) if pins is not None else None,
            group_index=group_index,
            member_status=self._evaluations.member_status(project, run) if group_index is not None else None,
            child_of=child_of,
        )

    def _next_sandbox_uid(self) -> int:
        # Taken synchronously (no await) so two concurrent creates never get the same uid.
        if self._last_sandbox_uid is None:
            used = [run["status"].get("sandbox", {}).get("uid") for run in self._registry.runs.values()]
            self._last_sandbox_uid = max([u for u in used if isinstance(u, int)] + [_FIRST_SANDBOX_UID - 1])
        self._last_sandbox_uid += 1
        return self._last_sandbox_uid

    async def get_run(self, project: str, name: str) -> dict[str, Any]:
        return self._registry.run(project, name)

    async def list_runs(
        self, project: str, agent: str | None = None, group: str | None = None, parent: str | None = None
    ) -> list[dict[str, Any]]:
        """Runs by name; a group's runs in creation order (the order they are admitted in); a
        parent run's children (``parent``) by name."""
        check_project(project)
        if parent is not None:
            runs = await self.list_runs(project, agent, group)
            return [run for run in runs if run["status"].get("parent") == parent]
        if group is not None:
            names = self._registry.group_members.get((project, group), [])
            runs = [
                self._registry.runs[(project, name)]
                for name in names
                if (project, name) in self._registry.runs
            ]
            return [run for run in runs if agent is None or run["spec"]["agent"] == agent]
        return [
            run
            for (p, _), run in sorted(self._registry.runs.items())
            if p == project and (agent is None or run["spec"]["agent"] == agent)
        ]

    async def run_steps(self, project: str, name: str) -> list[dict[str, Any]]:
        """The steps of the run's current journal generation (`control.generations`); a step in
        progress says what it does and, while the run is Running, for how long (`step_activity`)."""
        run = await self.get_run(project, name)
        journal = run_journal(self._registry.storage, (project, name), run["status"])
        records = await asyncio.to_thread(journal.load)
        views = step_views(records)
        if run["status"].get("phase") == RunPhase.RUNNING:  # a parked run's Started step is not running
            views = running_time(views, datetime.now(UTC))
        return views

    async def run_events(self, project: str, name: str, after_seq: int) -> dict[str, Any]:
        """The run and its journal records from ``after_seq`` on: what the events stream sends."""
        run = await self.get_run(project, name)
        # The current generation's: its seqs go on from the earlier ones', so a follower's
        # ``after_seq`` still holds after the run continued as new.
        journal = run_journal(self._registry.storage, (project, name), run["status"])
        records = await asyncio.to_thread(journal.records_from, max(0, after_seq))
        return {"run": run, "records": [record_view(r) for r in records if r.kind != "message"]}

    async def run_answer(self, project: str, name: str) -> dict[str, Any]:
        run = await self.get_run(project, name)
        check_payloads(run, "answer")  # 410 once retention deleted it (`control.retention`)
        phase = run["status"]["phase"]
        if run["status"].get("answer") is None:
            raise Conflict(
                f"agentrun {name!r} has no answer (phase {phase})",
                code="AnswerNotReady",
                details={"kind": "AgentRun", "name": name, "phase": phase},
            )
        data = await asyncio.to_thread(self._registry.storage.read_bytes, layout.run_answer(project, name))
        text = data.decode("utf-8")
        return {"name": name, "phase": phase, "answer": text, "bytes": len(data)}

    async def cancel_run(self, project: str, name: str) -> dict[str, Any]:
        """Stop the run: its command is killed and its sandbox deleted. Finished runs stay as they are."""
        await self.get_run(project, name)
        return await self._supervisor.cancel(
            (project, name), RunReason.CANCELLED.value, "cancelled on request"
        )

    async def delete_run(self, project: str, name: str) -> dict[str, Any]:
        run = await self.get_run(project, name)
        group = run["spec"].get("group")
        if group and (project, group) in self._registry.groups:
            raise Conflict(
                f"agentrun {name!r} is a run of group {group!r} and is deleted with it; "
                f"cancel the run, or delete agentgroup/{group}",
                code="GroupMember",
                details={"kind": "AgentRun", "name": name, "group": group},
            )
        await self._supervisor.remove((project, name))
        if self._cancel_children is not None:
            await self._cancel_children(project, name)  # a finished parent's unfinished children too
        return run

    async def report(self, project: str, name: str, patch: dict[str, Any]) -> None:
        """Merge a run actor's progress into the run's status; late reports of a finished run are dropped."""
        key = (project, name)
        async with self._registry.locks[key]:
            run = self._registry.runs.get(key)
            if run is None or run["status"]["phase"] in RUN_TERMINAL_PHASES:
                return
            if suspended(run):
                return  # the actor a suspend killed, reporting on its way out (its cost is settled)
            patch = dict(patch)
            attempt = patch.pop("attempt", None)
            if attempt is not None and int(attempt) < int(run["status"].get("attempts") or 0):
                logger.warning(
                    "run %s/%s: dropped a report of attempt %s (a zombie actor)", project, name, attempt
                )
                return
            merge_status(run["status"], patch)
            total = (patch.get("cost") or {}).get("totalUSD")
            if total is not None:
                self._credits.record_run_spend(project, name, Decimal(total))
            await self._registry.persist_run(key)
        if "phase" in patch or total is not None:
            await self._registry.run_changed(key)
