"""AgentGroups in the control plane: the group resources, and the link to their supervisors.

The group service owns each group's resource (spec and last known status) the way the control
plane owns every resource: validated, written to storage, then answered. Admission belongs to
the group's supervisor actor (`group_supervisor`), which `group_link.GroupLink` talks to: this
service creates, updates, cancels and deletes groups, and recovers them after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from nodus.errors import Conflict, Invalid, NotFound
from nodus.lifecycle import GROUP_TERMINAL_PHASES, GroupPhase
from nodus.resources import (
    API_VERSION,
    AgentGroup,
    AgentGroupStatus,
    GroupCost,
    ObjectMeta,
    parse_resource,
)
from nodus_ray.control.evaluations import EvaluationService
from nodus_ray.control.group_actors import GroupSupervisors, limits_wire
from nodus_ray.control.group_link import GroupLink
from nodus_ray.control.registry import Key, Registry
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.control.templates import resolve_agent
from nodus_ray.core.patch import patched_document
from nodus_ray.store import layout
from nodus_ray.store.timestamps import utc_now

__all__ = ["GroupService"]

logger = logging.getLogger(__name__)

_DELETE_CONCURRENCY = 16


class GroupService:
    """Group resources, their supervisors, and the members' side of admission."""

    def __init__(
        self,
        registry: Registry,
        supervisor: RunSupervisor,
        group_actors: GroupSupervisors,
        evaluations: EvaluationService,
        link: GroupLink,
    ) -> None:
        self._registry = registry
        self._runs = registry.runs
        self._groups = registry.groups
        self._group_members = registry.group_members
        self._locks = registry.locks
        # A deleted group's grading stays spent against the project's Budget (`control.budgets`,
        # wired by `compose`); called before its files go.
        self.budget_forget_group: Callable[[str, str], None] = lambda project, name: None
        self._supervisor = supervisor
        self._group_actors = group_actors
        self._evaluations = evaluations
        self._link = link

    # -- loading and starting ---------------------------------------------------------------

    async def recover(self) -> None:
        """After a (re)start: finish interrupted deletions, bring every live group's supervisor up.

        A live evaluation's cases are loaded before its supervisor reports, because the group's
        phase depends on them (it stays Running while cases are being graded).
        """
        for key, group in list(self._groups.items()):
            if group["metadata"].get("deletionTimestamp"):
                asyncio.get_running_loop().create_task(self._finish_delete(key))
            elif group["status"]["phase"] not in GROUP_TERMINAL_PHASES:
                if group["spec"].get("evaluation"):
                    try:
                        await asyncio.to_thread(self._evaluations.load, key)
                    except Exception:  # noqa: BLE001 - e.g. its Environment was uninstalled: that group only
                        # Its runs still go on (as a plain group's would); they are not graded.
                        logger.exception("evaluation of group %s/%s could not be loaded", *key)
                    else:
                        asyncio.get_running_loop().create_task(self._evaluations.resume(key))
                asyncio.get_running_loop().create_task(self._link.wake(key))

    def _supervisor_of(self, key: Key) -> Any:
        return self._group_actors.handle(key)

    def _release_supervisor(self, key: Key) -> None:
        self._group_actors.release(key)

    async def _persist_group(self, key: Key) -> None:
        await self._registry.persist_group(key)

    # -- the group resource -----------------------------------------------------------------

    async def get_group(self, project: str, name: str) -> dict[str, Any]:
        return self._registry.group(project, name)

    async def list_groups(self, project: str) -> list[dict[str, Any]]:
        return [
            group
            for (p, _), group in sorted(self._groups.items())
            if p == project and not group["metadata"].get("deletionTimestamp")
        ]

    async def apply_group(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        """Create (``mode="create"``) or create-or-update a group.

        An update may raise ``maxActive``/``maxPending`` either way, raise the cap, seal or
        cancel; it may not change the agent, lower or remove the cap, unseal or un-cancel.
        A refused update changes nothing.
        """
        parsed = parse_resource(document, expected_kind="AgentGroup")
        assert isinstance(parsed, AgentGroup)
        name = parsed.metadata.name
        key = (project, name)
        spec = parsed.spec.model_dump(mode="json", exclude_none=True)
        async with self._locks[("group", *key)]:
            existing = self._groups.get(key)
            if existing is not None and existing["metadata"].get("deletionTimestamp"):
                raise Conflict(
                    f"agentgroup {name!r} is being deleted",
                    code="GroupDeleting",
                    details={"kind": "AgentGroup", "name": name},
                )
            if existing is None:
                outcome = await self._create_group(key, parsed, spec)
            else:
                if mode == "create":
                    raise Conflict(
                        f"agentgroup {name!r} already exists",
                        code="AlreadyExists",
                        details={"kind": "AgentGroup", "name": name},
                    )
                # The one-way switches are often flipped by a patch after the file was applied:
                # applying the same file again (without them) keeps them instead of refusing.
                given: dict[str, Any] = document["spec"] if isinstance(document.get("spec"), dict) else {}
                for switch in ("sealed", "state"):
                    if switch not in given:
                        spec[switch] = existing["spec"].get(switch, spec[switch])
                return await self._update_group(key, existing, spec, parsed.metadata.labels)
        if spec.get("evaluation"):
            # Outside the group's lock, which creating members takes. The group is stored first,
            # so a crash from here on is finished by the next start (`_resume_evaluation`).
            await self._evaluations.prepare(key)
        return outcome

    async def _create_group(self, key: Key, parsed: AgentGroup, spec: dict[str, Any]) -> dict[str, Any]:
        project, name = key
        agent = resolve_agent(self._registry, project, parsed.spec.agent)  # its own, or a template
        if agent is None:
            raise NotFound(
                f"spec.agent: agent {parsed.spec.agent!r} not found in project {project!r}",
                details={"kind": "Agent", "name": parsed.spec.agent, "field": "spec.agent"},
            )
        if spec.get("state") == "Cancelled":
            raise Invalid(
                "spec.state: a group is created Running; cancel it once it exists",
                details={"field": "spec.state"},
            )
        created = utc_now()
        evaluation, tasks = None, None
        if spec.get("evaluation"):
            if agent["spec"].get("state") == "Stopped":
                raise Conflict(
                    f"spec.agent: agent {parsed.spec.agent!r} is stopped (spec.state: Stopped); an "
                    "evaluation's runs could not start",
                    code="AgentStopped",
                    details={"kind": "Agent", "name": parsed.spec.agent, "field": "spec.agent"},
                )
            if spec.get("sealed"):
                raise Invalid(
                    "spec.sealed: an evaluation group creates its own runs and seals itself; "
                    "leave spec.sealed out",
                    code="EvaluationGroup",
                    details={"field": "spec.sealed"},
                )
            evaluation, tasks = await self._evaluations.plan(name, spec, created, agent["spec"].get("image"))
        status = AgentGroupStatus(
            phase=GroupPhase.RUNNING.value,
            message="sealed with no runs" if spec.get("sealed") else None,
            cost=GroupCost(limitUSD=parsed.spec.maxCostUSD),
            agentRevision=agent["status"]["revision"],
        ).model_dump(mode="json")
        status["evaluation"] = evaluation
        if agent["metadata"].get("project", project) != project:
            status["agentProject"] = agent["metadata"]["project"]  # a template (`templates`)
        resource = {
            "apiVersion": API_VERSION,
            "kind": "AgentGroup",
            "metadata": ObjectMeta(
                name=name,
                project=project,
                uid=uuid.uuid4().hex,
                generation=1,
                creationTimestamp=created,
                labels=parsed.metadata.labels,
            ).model_dump(mode="json"),
            "spec": spec,
            "status": status,
        }
        self._groups[key] = resource
        if tasks is not None:
            self._evaluations.open(key, tasks)
        try:
            await self._persist_group(key)
        except BaseException:
            self._groups.pop(key, None)
            self._evaluations.forget(key)
            raise
        await self._link.take_status(key, await self._supervisor_of(key).load.remote(), {})
        return {"resource": resource, "result": "created"}

    async def _update_group(
        self, key: Key, existing: dict[str, Any], spec: dict[str, Any], labels: dict[str, str]
    ) -> dict[str, Any]:
        old = existing["spec"]
        if spec == old and existing["metadata"].get("labels", {}) == labels:
            return {"resource": existing, "result": "unchanged"}
        self._check_update(key[1], old, spec)
        existing["spec"] = spec
        existing["metadata"]["labels"] = labels
        existing["metadata"]["generation"] = int(existing["metadata"].get("generation") or 1) + 1
        existing["status"]["cost"]["limitUSD"] = spec.get("maxCostUSD")
        await self._persist_group(key)
        if existing["status"]["phase"] not in GROUP_TERMINAL_PHASES:
            status = await self._supervisor_of(key).configure.remote(
                limits_wire(spec), bool(spec.get("sealed")), spec.get("state") == "Cancelled"
            )
            await self._link.take_status(key, status, {})
            if spec.get("evaluation") and spec.get("state") == "Cancelled":
                await self._evaluations.cancel_grading(key)
        return {"resource": existing, "result": "configured"}

    @staticmethod
    def _check_update(name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        def refuse(field: str, code: str, message: str) -> None:
            raise Conflict(
                f"agentgroup {name!r} {field}: {message}",
                code=code,
                details={"kind": "AgentGroup", "name": name, "field": field},
            )

        if new["agent"] != old["agent"]:
            raise Invalid(
                f"agentgroup {name!r} spec.agent: the agent of a group cannot change "
                f"(its runs use {old['agent']!r})",
                code="FieldImmutable",
                details={"kind": "AgentGroup", "name": name, "field": "spec.agent"},
            )
        if new.get("evaluation") != old.get("evaluation"):
            raise Invalid(
                f"agentgroup {name!r} spec.evaluation: an evaluation is fixed when its group is created "
                "(create another group to evaluate again)",
                code="FieldImmutable",
                details={"kind": "AgentGroup", "name": name, "field": "spec.evaluation"},
            )
        old_cap, new_cap = old.get("maxCostUSD"), new.get("maxCostUSD")
        if old_cap is None and new_cap is not None:
            refuse(
                "spec.maxCostUSD",
                "CapLowered",
                "a group without a cost cap cannot be given one: its started runs were never held to one",
            )
        if old_cap is not None and new_cap is None:
            refuse("spec.maxCostUSD", "CapLowered", f"the cap ${old_cap} can be raised, not removed")
        if old_cap is not None and new_cap is not None and Decimal(new_cap) < Decimal(old_cap):
            refuse(
                "spec.maxCostUSD",
                "CapLowered",
                f"the cap can be raised, not lowered (from ${old_cap} to ${new_cap})",
            )
        if old.get("sealed") and not new.get("sealed"):
            refuse("spec.sealed", "GroupSealed", "sealing cannot be undone")
        if old.get("state") == "Cancelled" and new.get("state") != "Cancelled":
            refuse("spec.state", "GroupCancelled", "a cancelled group stays cancelled")

    async def patch_group(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        current = await self.get_group(project, name)
        if current["spec"].get("evaluation") and "sealed" in (patch.get("spec") or {}):
            raise Conflict(
                f"agentgroup {name!r} is an evaluation group: it creates its own runs and seals itself, "
                "so it takes no seal",
                code="EvaluationGroup",
                details={"kind": "AgentGroup", "name": name, "field": "spec.sealed"},
            )
        return await self.apply_group(project, patched_document(current, patch, name), mode="apply")

    async def cancel_group(self, project: str, name: str) -> dict[str, Any]:
        """Cancel the unfinished runs; finished runs keep their answers. A finished group stays as it is."""
        group = await self.get_group(project, name)
        if group["status"]["phase"] in GROUP_TERMINAL_PHASES or group["spec"].get("state") == "Cancelled":
            return group
        document = {
            "apiVersion": API_VERSION,
            "kind": "AgentGroup",
            "metadata": {"name": name, "labels": group["metadata"].get("labels") or {}},
            "spec": {**group["spec"], "state": "Cancelled"},
        }
        resource: dict[str, Any] = (await self.apply_group(project, document, mode="apply"))["resource"]
        return resource

    async def delete_group(self, project: str, name: str) -> dict[str, Any]:
        """Delete the group with all of its runs; resumed after a restart once it has begun."""
        group = await self.get_group(project, name)
        key = (project, name)
        async with self._locks[("group", *key)]:
            group["metadata"]["deletionTimestamp"] = utc_now()
            await self._persist_group(key)
        await self._finish_delete(key)
        return group

    async def _finish_delete(self, key: Key) -> None:
        self._release_supervisor(key)
        self._evaluations.release_grader(key)
        self._evaluations.forget(key)
        limit = asyncio.Semaphore(_DELETE_CONCURRENCY)

        async def delete_member(run: str) -> None:
            async with limit:
                await self._supervisor.remove((key[0], run))

        await asyncio.gather(*(delete_member(run) for run in list(self._group_members.get(key, []))))
        await asyncio.to_thread(self.budget_forget_group, *key)
        await asyncio.to_thread(self._registry.storage.delete_tree, layout.group_prefix(*key))
        self._groups.pop(key, None)
        self._group_members.pop(key, None)
