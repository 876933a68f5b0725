"""The control plane: one detached async actor that owns every resource.

It validates each change, writes it to storage before answering (storage is the only durable
state), and supervises one run actor per unfinished run (`run_supervision`). On start it reloads
everything from storage and re-attaches to, or replaces, the actors of unfinished runs, which
is what makes ``ray stop --force`` followed by ``nodus up`` lose nothing.

Ownership is strict: run actors report progress here and never write a run's resource
themselves, so there is exactly one writer per resource file.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import uuid
from collections import Counter, defaultdict
from decimal import Decimal, InvalidOperation
from typing import Any

import ray

from nodus.errors import Conflict, Invalid, NotFound
from nodus.resources import (
    GROUP_TERMINAL_PHASES,
    TERMINAL_PHASES,
    Agent,
    AgentRun,
    AgentRunStatus,
    AgentStatus,
    ObjectMeta,
    Secret,
    parse_duration,
    parse_resource,
    parse_run_list,
    validate_dns_label,
)
from nodus_ray import metrics
from nodus_ray.control.access import AccessControl
from nodus_ray.control.batches import BatchRecords, request_digest
from nodus_ray.control.evaluations import Evaluation, EvaluationControl
from nodus_ray.control.groups import GroupControl, admission_refusal
from nodus_ray.control.messages import Inbox, RunMessages
from nodus_ray.control.resolution import RunResolution
from nodus_ray.control.run_pool import RunActorPool
from nodus_ray.control.secrets import SecretStore
from nodus_ray.control.supervision import RunSupervision, merge_status, parked
from nodus_ray.control.tokens import TokenStore
from nodus_ray.core.admission import AdmissionError
from nodus_ray.core.patch import patched_document
from nodus_ray.durable.journal import Journal, record_view, step_views
from nodus_ray.faults import crash_point
from nodus_ray.money.credits import CreditLedger
from nodus_ray.money.prices import PriceTable
from nodus_ray.runtime.group_supervisor import member_wire
from nodus_ray.runtime.run_actor import run_storage_prefix
from nodus_ray.sandbox import bwrap_available
from nodus_ray.settings import ServerSettings
from nodus_ray.store.secret_box import SecretBox, load_or_create_key
from nodus_ray.store.storage import Storage, redact_uri
from nodus_ray.store.timestamps import format_timestamp, parse_timestamp, utc_now

__all__ = ["ControlPlane", "RemoteControlPlane"]

logger = logging.getLogger(__name__)

_VERSION = "0.1.0"
# Sandbox uids are handed out one per run, above the range the sandbox's own hash fallback
# uses (200000-249999), so no two runs ever share a process budget or kill each other's work.
_FIRST_SANDBOX_UID = 300_000
_POOL_CHECK_SECONDS = 10.0  # how soon a node that joined gets parked run actors
_METRICS_SECONDS = 5.0  # how often runs by phase are published (Prometheus scrapes every 10 s or so)

Key = tuple[str, str]


def _check_project(project: str) -> str:
    try:
        return validate_dns_label(project)
    except ValueError as exc:
        raise Invalid(f"project: {exc}", details={"field": "project"}) from None


def _agent_key(project: str, name: str) -> str:
    return f"projects/{project}/agents/{name}"


class ControlPlane(
    RunSupervision, RunMessages, RunResolution, GroupControl, EvaluationControl, AccessControl
):
    """Resources in memory, mirrored to storage; supervisors for unfinished runs and live groups."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.storage = Storage(settings.storage_uri)
        self.prices = PriceTable.load(settings.prices_file)
        self.secrets = SecretStore(self.storage, SecretBox(load_or_create_key(settings.secret_key_file)))
        self.tokens = TokenStore(self.storage)
        self.credits = CreditLedger(self.storage, Decimal(settings.initial_credits_usd))
        self._agents: dict[Key, dict[str, Any]] = {}
        self._runs: dict[Key, dict[str, Any]] = {}
        self._groups: dict[Key, dict[str, Any]] = {}
        self._group_members: defaultdict[Key, list[str]] = defaultdict(list)
        self._group_handles: dict[Key, Any] = {}
        self._evaluations: dict[Key, Evaluation] = {}
        self._creating: set[Key] = set()  # run names taken by a batch that is being written
        self.batches = BatchRecords(self.storage)
        self.pool = RunActorPool(settings.run_pool_per_node)
        self._inboxes: dict[Key, Inbox] = {}
        self._locks: defaultdict[Key, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._supervisors: dict[Key, asyncio.Task[None]] = {}
        self._actors: dict[Key, Any] = {}
        self._last_sandbox_uid: int | None = None
        self._started = False
        self._pool_keeper: asyncio.Task[None] | None = None
        self._metrics_publisher: asyncio.Task[None] | None = None
        self._start_lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"ControlPlane(storage={redact_uri(self.settings.storage_uri)}, agents={len(self._agents)}, runs={len(self._runs)})"

    # -- start and recovery ---------------------------------------------------------------

    async def _ensure_started(self) -> None:
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            await asyncio.to_thread(self._load)
            await asyncio.to_thread(self.secrets.load)
            await asyncio.to_thread(self.tokens.load)
            for (project, name), run in self._runs.items():
                self.credits.record_run_spend(
                    project, name, Decimal(run["status"]["cost"].get("totalUSD") or "0")
                )
            for key, run in self._runs.items():
                if run["status"]["phase"] in TERMINAL_PHASES:
                    continue
                if parked(run) or self._awaits_admission(run):
                    self._arm_deadline(key)
                else:
                    self._supervise(key)
            await self._start_groups()
            await self._refill_pool()
            loop = asyncio.get_running_loop()
            self._pool_keeper = loop.create_task(self._keep_pool_filled())
            self._metrics_publisher = loop.create_task(self._publish_run_metrics())
            self._started = True

    def _load(self) -> None:
        """Read every resource back from storage; a damaged file is logged, not fatal."""
        for project in self.storage.list_dir("projects"):
            for name in self.storage.list_dir(f"projects/{project}/agents"):
                self._load_one(self._agents, (project, name), f"{_agent_key(project, name)}/agent.json")
            # An unanswered batch is rolled back before its runs are read: all or nothing.
            for batch in self.batches.pending(project):
                for name in batch.names:
                    self.storage.delete_tree(run_storage_prefix(project, name))
                self.batches.abandon(project, batch.record_id)
            for name in self.storage.list_dir(f"projects/{project}/agentruns"):
                self._load_one(self._runs, (project, name), f"{run_storage_prefix(project, name)}/run.json")
            self._load_groups(project)
        self._index_members()

    def _load_one(self, into: dict[Key, dict[str, Any]], key: Key, path: str) -> None:
        try:
            into[key] = self.storage.read_json(path)
        except FileNotFoundError:
            logger.warning("no resource file at %s; skipped", path)
        except Exception:  # noqa: BLE001 - one damaged file must not stop the whole service
            logger.exception("could not read %s; skipped", path)

    async def ready(self) -> dict[str, Any]:
        """Load (once) and describe the service: the readiness probe and ``/v1/info``."""
        await self._ensure_started()
        return {
            "version": _VERSION,
            "storage": redact_uri(self.settings.storage_uri),
            "modelBackend": "anthropic" if await asyncio.to_thread(self.secrets.server_key) else "offline",
            "prices": {"effective": self.prices.effective.isoformat()},
            "sandbox": "bubblewrap" if await asyncio.to_thread(bwrap_available) else "process",
            "sandboxRoot": self.settings.sandbox_root,
            "settingsDigest": self.settings.digest(),
            "agents": len(self._agents),
            "runs": len(self._runs),
        }

    async def _refill_pool(self) -> None:
        byok = any(
            (agent["spec"].get("model") or {}).get("access") == "BYOK" for agent in self._agents.values()
        )
        self.pool.warm_anthropic = byok or bool(await asyncio.to_thread(self.secrets.server_key))
        self.pool.fill()

    async def _keep_pool_filled(self) -> None:
        """Nodes join and leave: every few seconds a node short of parked run actors gets them."""
        while True:
            await asyncio.sleep(_POOL_CHECK_SECONDS)
            try:
                await self._refill_pool()
            except Exception:  # noqa: BLE001 - the next round tries again
                logger.warning("could not check the run pool", exc_info=True)

    async def _publish_run_metrics(self) -> None:
        """Runs by phase for Ray's metrics export (`metrics`); a project emptied shows zeros."""
        projects: set[str] = set()
        while True:
            counts = Counter((project, run["status"]["phase"]) for (project, _), run in self._runs.items())
            projects |= {project for project, _ in self._runs}
            metrics.set_runs_by_phase(counts, projects)
            await asyncio.sleep(_METRICS_SECONDS)

    async def claim_slot(self, slot: str) -> Any:
        """A pre-started run actor waits here (inside its ``__init__``) for the run it will serve."""
        return await self.pool.claim(slot)

    async def running_settings(self) -> dict[str, object]:
        """The running settings, credentials redacted (for `nodus up` to explain a mismatch)."""
        return self.settings.describe()

    # -- persistence ----------------------------------------------------------------------

    async def _persist_run(self, key: Key) -> None:
        """Write the run; every write is a new ``metadata.resourceVersion`` (what `resolve` checks)."""
        run = self._runs.get(key)
        if run is not None:
            run["metadata"]["resourceVersion"] = int(run["metadata"].get("resourceVersion") or 0) + 1
            await asyncio.to_thread(self.storage.write_json, f"{run_storage_prefix(*key)}/run.json", run)

    # -- agents ---------------------------------------------------------------------------

    async def apply_agent(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        """Create (``mode="create"``) or create-or-update an Agent; a changed spec is a revision."""
        await self._ensure_started()
        _check_project(project)
        agent = parse_resource(document, expected_kind="Agent")
        assert isinstance(agent, Agent)
        key = (project, agent.metadata.name)
        async with self._locks[key]:
            existing = self._agents.get(key)
            if existing is not None and mode == "create":
                raise Conflict(
                    f"agent {agent.metadata.name!r} already exists",
                    code="AlreadyExists",
                    details={"kind": "Agent", "name": agent.metadata.name},
                )
            self._check_model(agent)
            spec = agent.spec.model_dump(mode="json", exclude_none=True)
            if not spec.get("env"):  # agents stored before spec.env existed compare equal
                spec.pop("env", None)
            labels = agent.metadata.labels
            if (
                existing is not None
                and existing["spec"] == spec
                and existing["metadata"].get("labels", {}) == labels
            ):
                return {"resource": existing, "result": "unchanged"}
            revision = (existing["status"]["revision"] + 1) if existing else 1
            resource = Agent(
                metadata=ObjectMeta(
                    name=agent.metadata.name,
                    project=project,
                    uid=existing["metadata"]["uid"] if existing else uuid.uuid4().hex,
                    generation=revision,
                    creationTimestamp=existing["metadata"]["creationTimestamp"] if existing else utc_now(),
                    labels=labels,
                ),
                spec=agent.spec,
                status=AgentStatus(revision=revision, updatedAt=utc_now()),
            ).model_dump(mode="json")
            resource["spec"] = spec  # the same normal form the next apply compares against
            base = _agent_key(project, agent.metadata.name)
            # The revision first: agent.json must never name a revision that is not stored.
            await asyncio.to_thread(
                self.storage.write_json, f"{base}/revisions/{revision:06d}.json", resource
            )
            await asyncio.to_thread(self.storage.write_json, f"{base}/agent.json", resource)
            self._agents[key] = resource
            return {"resource": resource, "result": "created" if existing is None else "configured"}

    def _check_model(self, agent: Agent) -> None:
        """Refuse what could only fail later: an unpriced model, BYOK without a secret."""
        model = agent.spec.model
        if model.name is not None and not self.prices.has(model.name):
            raise Invalid(
                f"spec.model.name: model {model.name!r} has no price in the price table "
                f"(effective {self.prices.effective}); the operator adds prices with NODUS_PRICES",
                code="UnpricedModel",
                details={"field": "spec.model.name"},
            )
        if model.access == "BYOK" and not model.apiKeySecret:
            raise Invalid(
                "spec.model.apiKeySecret: access BYOK needs the name of a Secret holding ANTHROPIC_API_KEY",
                details={"field": "spec.model.apiKeySecret"},
            )
        if model.access == "Nodus" and model.apiKeySecret:
            raise Invalid(
                "spec.model.apiKeySecret: only access BYOK uses a key of its own",
                details={"field": "spec.model.apiKeySecret"},
            )

    async def patch_agent(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        current = await self.get_agent(project, name)
        return await self.apply_agent(project, patched_document(current, patch, name), mode="apply")

    async def get_agent(self, project: str, name: str) -> dict[str, Any]:
        await self._ensure_started()
        _check_project(project)
        agent = self._agents.get((project, name))
        if agent is None:
            raise NotFound(
                f"agent {name!r} not found in project {project!r}", details={"kind": "Agent", "name": name}
            )
        return agent

    async def list_agents(self, project: str) -> list[dict[str, Any]]:
        await self._ensure_started()
        _check_project(project)
        return [agent for (p, _), agent in sorted(self._agents.items()) if p == project]

    async def delete_agent(self, project: str, name: str) -> dict[str, Any]:
        agent = await self.get_agent(project, name)
        key = (project, name)
        async with self._locks[key]:
            users = [
                run_name
                for (p, run_name), run in self._runs.items()
                if p == project
                and run["spec"]["agent"] == name
                and run["status"]["phase"] not in TERMINAL_PHASES
            ]
            if users:
                raise Conflict(
                    f"agent {name!r} has unfinished runs ({', '.join(sorted(users)[:5])}); "
                    "cancel or delete them first",
                    details={"kind": "Agent", "name": name},
                )
            groups = [
                group_name
                for (p, group_name), group in self._groups.items()
                if p == project
                and group["spec"]["agent"] == name
                and group["status"]["phase"] not in GROUP_TERMINAL_PHASES
            ]
            if groups:
                raise Conflict(
                    f"agent {name!r} is the agent of unfinished groups ({', '.join(sorted(groups)[:5])}); "
                    "cancel or delete them first",
                    details={"kind": "Agent", "name": name},
                )
            await asyncio.to_thread(self.storage.delete_tree, _agent_key(project, name))
            self._agents.pop(key, None)
        return agent

    # -- runs -----------------------------------------------------------------------------

    async def create_run(
        self, project: str, document: dict[str, Any], mode: str = "create"
    ) -> dict[str, Any]:
        """Accept one run: a batch of one (``mode="apply"`` answers an identical run as unchanged)."""
        await self._ensure_started()
        _check_project(project)
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
        await self._ensure_started()
        _check_project(project)
        runs = parse_run_list(document)
        digest = request_digest([run.model_dump(mode="json", exclude_none=True) for run in runs])
        lock_key = ("batch", project, idempotency_key or "")
        async with self._locks[lock_key] if idempotency_key else contextlib.nullcontext():
            if idempotency_key:
                record = await asyncio.to_thread(self.batches.find, project, idempotency_key)
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
    ) -> list[dict[str, Any]]:
        """Check every run, then write them all (behind a batch record when there are several).

        Names are taken synchronously (no await between the check and the taking), so two
        concurrent batches can never both create one name. Group members are checked by their
        group's supervisor first and handed to it after they are stored; other runs get their
        actor at once. ``pinned_agent`` (an evaluation's runs) is the Agent revision they run,
        instead of the current one.
        """
        results: list[dict[str, Any] | None] = [None] * len(runs)
        fresh: list[tuple[int, AgentRun, dict[str, Any]]] = []
        taken: set[Key] = set()
        for index, run in enumerate(runs):
            name = run.metadata.name
            key = (project, name)
            where = f"items[{index}]: " if len(runs) > 1 else ""
            spec = run.spec.model_dump(mode="json", exclude_none=True)
            existing = self._runs.get(key)
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
            groups = sorted({run.spec.group for _, run, _ in fresh if run.spec.group})
            async with contextlib.AsyncExitStack() as stack:
                for group in groups:
                    await stack.enter_async_context(self._locks[("group", project, group)])
                members = await self._check_members(project, fresh, groups, evaluation_member)
                created = await self._write_runs(project, fresh, idempotency_key, digest)
                for (index, _, _), (_, resource) in zip(fresh, created, strict=True):
                    # As written: the answer a repeated Idempotency-Key replays must be the same.
                    results[index] = {"resource": copy.deepcopy(resource), "result": "created"}
                for group, wires in members.items():
                    status = await self._supervisor((project, group)).add.remote(wires)
                    await self._take_status((project, group), status, {})
        finally:
            self._creating -= taken
        for key, resource in created:
            if resource["spec"].get("group"):
                self._arm_deadline(key)  # a queued run's deadline runs while it waits to start
            else:
                self._supervise(key)
        return [result for result in results if result is not None]

    def _check_new_run(self, project: str, run: AgentRun, index: int, where: str) -> dict[str, Any]:
        """The refusals that need no group: the agent exists and takes runs; returns the agent."""
        agent = self._agents.get((project, run.spec.agent))
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

    async def _check_members(
        self,
        project: str,
        fresh: list[tuple[int, AgentRun, dict[str, Any]]],
        groups: list[str],
        evaluation_member: bool = False,
    ) -> dict[str, list[dict[str, Any]]]:
        """Ask each group's supervisor whether it takes its new members; nothing is stored yet.

        An evaluation group takes only the members its evaluation creates (``evaluation_member``).
        """
        members: dict[str, list[dict[str, Any]]] = {}
        positions: dict[str, list[int]] = {}
        for index, run, agent in fresh:
            group_name = run.spec.group
            if group_name is None:
                continue
            where = f"items[{index}]: " if len(fresh) > 1 else ""
            group = self._groups.get((project, group_name))
            if group is None or group["metadata"].get("deletionTimestamp"):
                raise NotFound(
                    f"{where}spec.group: agentgroup {group_name!r} not found in project {project!r}",
                    details={"kind": "AgentGroup", "name": group_name, "field": "spec.group", "index": index},
                )
            if run.spec.agent != group["spec"]["agent"]:
                raise Invalid(
                    f"{where}spec.agent: the runs of group {group_name!r} use its agent "
                    f"{group['spec']['agent']!r}, not {run.spec.agent!r}",
                    code="AgentMismatch",
                    details={"field": "spec.agent", "index": index},
                )
            if group["spec"].get("evaluation") and not evaluation_member:
                raise Conflict(
                    f"{where}agentgroup {group_name!r} is an evaluation group: it creates its own runs "
                    f"from {group['spec']['evaluation']['environment']} and takes none submitted",
                    code="EvaluationGroup",
                    details={"kind": "AgentGroup", "name": group_name, "field": "spec.group", "index": index},
                )
            closed = (
                ("GroupCancelled", "cancelled")
                if group["spec"].get("state") == "Cancelled"
                else (("GroupSealed", "sealed") if group["spec"].get("sealed") else None)
            )
            if closed is not None:
                raise Conflict(
                    f"{where}agentgroup {group_name!r} is {closed[1]} and takes no new runs",
                    code=closed[0],
                    details={"kind": "AgentGroup", "name": group_name, "field": "spec.group", "index": index},
                )
            assert run.spec.taskKey is not None  # the schema requires it of a group's run
            members.setdefault(group_name, []).append(
                member_wire(run.spec.taskKey, run.metadata.name, self._run_cap(agent), run.spec.dependsOn)
            )
            positions.setdefault(group_name, []).append(index)
        for group_name in groups:
            try:
                await self._supervisor((project, group_name)).check.remote(members[group_name])
            except Exception as error:  # noqa: BLE001 - Ray wraps the refusal; its cause is what counts
                cause = getattr(error, "cause", error)
                if not isinstance(cause, AdmissionError):
                    raise
                index_map = positions[group_name] if len(fresh) > 1 else None
                raise admission_refusal(cause, index_map=index_map) from None
        return members

    @staticmethod
    def _run_cap(agent: dict[str, Any]) -> str:
        """The run's own cap, copied from the agent; a BYOK run costs Nodus nothing and has none."""
        byok = (agent["spec"].get("model") or {}).get("access") == "BYOK"
        return "0" if byok else str(agent["spec"]["perRunMaxCostUSD"])

    async def _write_runs(
        self,
        project: str,
        fresh: list[tuple[int, AgentRun, dict[str, Any]]],
        idempotency_key: str | None,
        digest: str | None,
    ) -> list[tuple[Key, dict[str, Any]]]:
        """Store the runs, all or none: several go behind a batch record (see `run_batches`)."""
        names = [run.metadata.name for _, run, _ in fresh]
        record = None
        if len(fresh) > 1 or idempotency_key:
            record = await asyncio.to_thread(
                self.batches.begin, project, idempotency_key, digest or "", names
            )
        created: list[tuple[Key, dict[str, Any]]] = []
        added: defaultdict[str, int] = defaultdict(int)  # members of this batch per group so far
        try:
            for _, run, agent in fresh:
                key = (project, run.metadata.name)
                group_index = None
                if run.spec.group:
                    group_index = len(self._group_members[(project, run.spec.group)]) + added[run.spec.group]
                    added[run.spec.group] += 1
                resource = self._new_run(project, run, agent, group_index)
                prefix = run_storage_prefix(*key)
                # The pinned agent is stored with the run: the run never depends on the Agent again.
                await asyncio.to_thread(self.storage.write_json, f"{prefix}/agent.json", agent)
                await asyncio.to_thread(self.storage.write_json, f"{prefix}/run.json", resource)
                created.append((key, resource))
                if record is not None and len(created) == 1 < len(fresh):
                    crash_point("batch-half-written", f"{project}/{key[1]}")
            if record is not None:
                items = [resource for _, resource in created] if idempotency_key else None
                await asyncio.to_thread(self.batches.commit, project, record, digest or "", items)
        except BaseException:
            for key, _ in created:  # roll back: a refused or failed batch leaves nothing behind
                await asyncio.to_thread(self.storage.delete_tree, run_storage_prefix(*key))
            if record is not None:
                await asyncio.to_thread(self.batches.abandon, project, record)
            raise
        for key, resource in created:
            self._runs[key] = resource
            group = resource["spec"].get("group")
            if group:
                self._group_members[(project, group)].append(key[1])
        return created

    def _new_run(
        self, project: str, run: AgentRun, agent: dict[str, Any], group_index: int | None
    ) -> dict[str, Any]:
        """The stored form of an accepted run: Pending, pinned to the agent's current revision."""
        created = utc_now()
        status = AgentRunStatus(
            phase="Pending", agentRevision=agent["status"]["revision"], createdAt=created
        ).model_dump(mode="json")
        # The cap is copied now: changing the agent later does not change a started run.
        cap = self._run_cap(agent)
        status["cost"]["limitUSD"] = None if cap == "0" else cap
        status["sandbox"]["uid"] = self._next_sandbox_uid()
        if run.spec.deadline:
            deadline = parse_timestamp(created) + parse_duration(run.spec.deadline)
            status["deadlineAt"] = format_timestamp(deadline)
        if group_index is not None:
            status["groupIndex"] = group_index  # creation order in the group, which admission follows
            status["reason"] = "DependencyWait" if run.spec.dependsOn else "GroupWait"
            status.update(self._member_status(project, run))  # an evaluation's deadline and seed
        return {
            "apiVersion": run.apiVersion,
            "kind": "AgentRun",
            "metadata": ObjectMeta(
                name=run.metadata.name,
                project=project,
                uid=uuid.uuid4().hex,
                generation=1,
                creationTimestamp=created,
                labels=run.metadata.labels,
            ).model_dump(mode="json"),
            "spec": run.spec.model_dump(mode="json", exclude_none=True),
            "status": status,
        }

    def _next_sandbox_uid(self) -> int:
        # Taken synchronously (no await) so two concurrent creates never get the same uid.
        if self._last_sandbox_uid is None:
            used = [run["status"].get("sandbox", {}).get("uid") for run in self._runs.values()]
            self._last_sandbox_uid = max([u for u in used if isinstance(u, int)] + [_FIRST_SANDBOX_UID - 1])
        self._last_sandbox_uid += 1
        return self._last_sandbox_uid

    async def get_run(self, project: str, name: str) -> dict[str, Any]:
        await self._ensure_started()
        _check_project(project)
        run = self._runs.get((project, name))
        if run is None:
            raise NotFound(
                f"agentrun {name!r} not found in project {project!r}",
                details={"kind": "AgentRun", "name": name},
            )
        return run

    async def list_runs(
        self, project: str, agent: str | None = None, group: str | None = None
    ) -> list[dict[str, Any]]:
        """Runs by name; a group's runs in creation order (the order they are admitted in)."""
        await self._ensure_started()
        _check_project(project)
        if group is not None:
            names = self._group_members.get((project, group), [])
            runs = [self._runs[(project, name)] for name in names if (project, name) in self._runs]
            return [run for run in runs if agent is None or run["spec"]["agent"] == agent]
        return [
            run
            for (p, _), run in sorted(self._runs.items())
            if p == project and (agent is None or run["spec"]["agent"] == agent)
        ]

    async def run_steps(self, project: str, name: str) -> list[dict[str, Any]]:
        await self.get_run(project, name)
        journal = Journal(self.storage, f"{run_storage_prefix(project, name)}/journal")
        records = await asyncio.to_thread(journal.load)
        return step_views(records)

    async def run_events(self, project: str, name: str, after_seq: int) -> dict[str, Any]:
        """The run and its journal records from ``after_seq`` on: what the events stream sends."""
        run = await self.get_run(project, name)
        journal = Journal(self.storage, f"{run_storage_prefix(project, name)}/journal")
        records = await asyncio.to_thread(journal.records_from, max(0, after_seq))
        return {"run": run, "records": [record_view(r) for r in records if r.kind != "message"]}

    async def run_answer(self, project: str, name: str) -> dict[str, Any]:
        run = await self.get_run(project, name)
        phase = run["status"]["phase"]
        if run["status"].get("answer") is None:
            raise Conflict(
                f"agentrun {name!r} has no answer (phase {phase})",
                code="AnswerNotReady",
                details={"kind": "AgentRun", "name": name, "phase": phase},
            )
        data = await asyncio.to_thread(
            self.storage.read_bytes, f"{run_storage_prefix(project, name)}/answer.txt"
        )
        text = data.decode("utf-8")
        return {"name": name, "phase": phase, "answer": text, "bytes": len(data)}

    async def cancel_run(self, project: str, name: str) -> dict[str, Any]:
        """Stop the run: its command is killed and its sandbox deleted. Finished runs stay as they are."""
        await self.get_run(project, name)
        return await self._cancel((project, name), "Cancelled", "cancelled on request")

    async def _cancel(self, key: Key, reason: str, message: str) -> dict[str, Any]:
        run = self._runs[key]
        async with self._locks[key]:
            if run["status"]["phase"] in TERMINAL_PHASES:
                return run
            # Terminal first, so neither the supervisor nor a late report revives the run.
            run["status"].update(
                {"phase": "Cancelled", "reason": reason, "message": message, "finishedAt": utc_now()}
            )
            await self._persist_run(key)
        await self._tell_group(key)
        await self._stop_actor(key, run)
        return run

    async def delete_run(self, project: str, name: str) -> dict[str, Any]:
        run = await self.get_run(project, name)
        group = run["spec"].get("group")
        if group and (project, group) in self._groups:
            raise Conflict(
                f"agentrun {name!r} is a run of group {group!r} and is deleted with it; "
                f"cancel the run, or delete agentgroup/{group}",
                code="GroupMember",
                details={"kind": "AgentRun", "name": name, "group": group},
            )
        await self._delete_run_now((project, name))
        return run

    async def _delete_run_now(self, key: Key) -> None:
        """Cancel the run if unfinished, end its actor, then remove its workspace, journal and resource."""
        run = self._runs.get(key)
        if run is None:
            return
        if run["status"]["phase"] not in TERMINAL_PHASES:
            await self._cancel(key, "Cancelled", "cancelled because it was deleted")
        else:
            await self._stop_actor(key, run)
        async with self._locks[key]:
            await asyncio.to_thread(self._remove_workspace, *key)
            await asyncio.to_thread(self.storage.delete_tree, run_storage_prefix(*key))
            await asyncio.to_thread(self.credits.forget_run, *key)
            self._runs.pop(key, None)
            self._inboxes.pop(key, None)

    # -- reports from run actors ----------------------------------------------------------

    async def report(self, project: str, name: str, patch: dict[str, Any]) -> None:
        """Merge a run actor's progress into the run's status; late reports of a finished run are dropped."""
        await self._ensure_started()  # a report that reaches a just-restarted control plane is not lost
        key = (project, name)
        async with self._locks[key]:
            run = self._runs.get(key)
            if run is None or run["status"]["phase"] in TERMINAL_PHASES:
                return
            merge_status(run["status"], patch)
            total = (patch.get("cost") or {}).get("totalUSD")
            if total is not None:
                self.credits.record_run_spend(project, name, Decimal(total))
            await self._persist_run(key)
        if "phase" in patch or total is not None:
            await self._tell_group(key)

    # -- secrets --------------------------------------------------------------------------

    async def apply_secret(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        await self._ensure_started()
        _check_project(project)
        secret = parse_resource(document, expected_kind="Secret")
        assert isinstance(secret, Secret)
        key = (project, f"secret/{secret.metadata.name}")
        async with self._locks[key]:
            if mode == "create" and self.secrets.exists(project, secret.metadata.name):
                raise Conflict(
                    f"secret {secret.metadata.name!r} already exists",
                    code="AlreadyExists",
                    details={"kind": "Secret", "name": secret.metadata.name},
                )
            if not (secret.stringData or secret.data):
                raise Invalid(
                    "a Secret needs stringData (or data) with at least one value",
                    details={"field": "stringData"},
                )
            view, result = await asyncio.to_thread(
                self.secrets.apply, project, secret, create_only=(mode == "create")
            )
        return {"resource": view, "result": result}

    async def get_secret(self, project: str, name: str) -> dict[str, Any]:
        await self._ensure_started()
        _check_project(project)
        return self.secrets.get(project, name)

    async def list_secrets(self, project: str) -> list[dict[str, Any]]:
        await self._ensure_started()
        _check_project(project)
        return self.secrets.list(project)

    async def delete_secret(self, project: str, name: str) -> dict[str, Any]:
        await self._ensure_started()
        _check_project(project)
        return await asyncio.to_thread(self.secrets.delete, project, name)

    async def configure_model_key(self, key: str | None) -> str:
        """The server's own Anthropic key, from the environment of ``nodus up``; sealed in storage."""
        await self._ensure_started()
        await asyncio.to_thread(self.secrets.set_server_key, key)
        await self._refill_pool()
        return "anthropic" if key else "offline"

    async def model_access(self, project: str, name: str) -> dict[str, Any]:
        """What a run actor needs to call its model: which provider, and the key, in memory only."""
        await self.get_run(project, name)
        pinned = await asyncio.to_thread(
            self.storage.read_json, f"{run_storage_prefix(project, name)}/agent.json"
        )
        model = pinned["spec"].get("model") or {}
        base = {"baseUrl": self.settings.anthropic_base_url, "access": model.get("access", "Nodus")}
        if model.get("access") == "BYOK":
            secret = model.get("apiKeySecret") or ""
            if not self.secrets.exists(project, secret):
                raise NotFound(
                    f"the agent's apiKeySecret {secret!r} does not exist in project {project!r}",
                    code="SecretNotFound",
                    details={"kind": "Secret", "name": secret},
                )
            values = await asyncio.to_thread(self.secrets.values, project, secret)
            if not values.get("ANTHROPIC_API_KEY"):
                raise Invalid(
                    f"secret {secret!r} has no ANTHROPIC_API_KEY",
                    code="SecretKeyMissing",
                    details={"kind": "Secret", "name": secret},
                )
            return {**base, "provider": "anthropic", "apiKey": values["ANTHROPIC_API_KEY"]}
        server_key = await asyncio.to_thread(self.secrets.server_key)
        if server_key:
            return {**base, "provider": "anthropic", "apiKey": server_key}
        return {**base, "provider": "offline", "apiKey": None}

    async def run_secrets(self, project: str, name: str) -> dict[str, Any]:
        """A run's environment (`spec.env`, secret values opened) and the values to redact.

        Like the model key, the answer travels over Ray's RPC into the run actor's memory only.
        ``redact`` maps ``secret/KEY`` to each secret value of its env, so the actor masks them
        in whatever it records (`redaction`); the actor adds the BYOK key, which `model_access`
        already gave it.
        """
        await self.get_run(project, name)
        pinned = await asyncio.to_thread(
            self.storage.read_json, f"{run_storage_prefix(project, name)}/agent.json"
        )
        env: dict[str, str] = {}
        redact: dict[str, str] = {}
        opened: dict[str, dict[str, str]] = {}
        for index, variable in enumerate(pinned["spec"].get("env") or []):
            reference = (variable.get("valueFrom") or {}).get("secretKeyRef")
            if reference is None:
                env[variable["name"]] = variable.get("value") or ""
                continue
            secret, key = reference["name"], reference["key"]
            if secret not in opened:
                if not self.secrets.exists(project, secret):
                    raise NotFound(
                        f"spec.env[{index}] ({variable['name']}) names secret {secret!r}, which does not "
                        f"exist in project {project!r}",
                        code="SecretNotFound",
                        details={"kind": "Secret", "name": secret, "field": f"spec.env[{index}]"},
                    )
                opened[secret] = await asyncio.to_thread(self.secrets.values, project, secret)
            if key not in opened[secret]:
                raise Invalid(
                    f"spec.env[{index}] ({variable['name']}) names key {key!r}, which secret {secret!r} "
                    f"does not have (it has {', '.join(sorted(opened[secret])) or 'none'})",
                    code="SecretKeyMissing",
                    details={"kind": "Secret", "name": secret, "field": f"spec.env[{index}]"},
                )
            env[variable["name"]] = redact[f"{secret}/{key}"] = opened[secret][key]
        return {"env": env, "redact": redact}

    async def price_table(self) -> dict[str, Any]:
        """The prices in force (dated), per model id, in USD per million tokens."""
        return self.prices.to_dict()

    # -- credits --------------------------------------------------------------------------

    async def get_credits(self, project: str) -> dict[str, Any]:
        await self._ensure_started()
        _check_project(project)
        return await asyncio.to_thread(self.credits.view, project)

    async def add_credits(self, project: str, amount: str) -> dict[str, Any]:
        await self._ensure_started()
        _check_project(project)
        try:
            value = Decimal(str(amount))
            if not value.is_finite() or value <= 0 or value != value.quantize(Decimal("0.000001")):
                raise InvalidOperation
        except InvalidOperation:
            raise Invalid(
                f"amountUSD: {str(amount)[:40]!r} is not a positive amount of dollars (at most 6 decimals)",
                details={"field": "amountUSD"},
            ) from None
        view = await asyncio.to_thread(self.credits.add, project, value)
        await self._resume_runs_waiting_for_credits(project)
        return view

    async def _resume_runs_waiting_for_credits(self, project: str) -> None:
        """Every run of the project parked for credits gets an actor; each checks its next call again."""
        for key, run in list(self._runs.items()):
            if key[0] != project or run["status"].get("reason") != "InsufficientCredits":
                continue
            async with self._locks[key]:
                if (
                    run["status"]["phase"] != "Waiting"
                    or run["status"].get("reason") != "InsufficientCredits"
                ):
                    continue
                run["status"].update({"phase": "Running", "reason": None, "message": "credits were added"})
                await self._persist_run(key)
            self._supervise(key)

    def _affordable(self, project: str, needed: str | None) -> bool:
        return needed is not None and self.credits.project(project).available >= Decimal(needed)

    async def reserve_credits(self, project: str, name: str, amount: str) -> bool:
        await self._ensure_started()
        return self.credits.reserve(project, name, Decimal(amount))


RemoteControlPlane = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=1000)(ControlPlane)
