"""AgentGroups in the control plane: the group resources, and the link to their supervisors.

The control plane mixes this in. It owns each group's resource (spec and last known status) the
way it owns every resource: validated, written to storage, then answered. Admission belongs to
the group's supervisor actor (`group_supervisor`); this side asks it before accepting runs,
forwards what members do, and carries out what it decides (``start_member``,
``cancel_member``, ``group_status``).

A member run is created queued: the control plane gives it no actor until its supervisor
admits it, and records the admission (``status.admittedAt``) before starting it, so after a
restart an admitted run is resumed and a queued one waits for the rebuilt supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import ray

from nodus.errors import Conflict, Invalid, NodusError, NotFound
from nodus.resources import (
    API_VERSION,
    GROUP_TERMINAL_PHASES,
    TERMINAL_PHASES,
    AgentGroup,
    AgentGroupStatus,
    GroupCost,
    ObjectMeta,
    parse_resource,
)
from nodus_ray.core.admission import AdmissionError
from nodus_ray.core.patch import patched_document
from nodus_ray.runtime.group_supervisor import (
    RemoteGroupSupervisor,
    group_supervisor_name,
    member_wire,
    supervisor_options,
)
from nodus_ray.settings import NAMESPACE
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import utc_now

__all__ = ["GroupControl", "group_storage_prefix", "admission_refusal"]

logger = logging.getLogger(__name__)

Key = tuple[str, str]

_DELETE_CONCURRENCY = 16


def group_storage_prefix(project: str, name: str) -> str:
    return f"projects/{project}/agentgroups/{name}"


def admission_refusal(error: AdmissionError, *, index_map: list[int] | None = None) -> NodusError:
    """The API error for a refusal of the admission core; ``index_map`` maps its batch index."""
    details = dict(error.details)
    if error.index is not None and index_map is not None:
        details["index"] = index_map[error.index]
    cls = Invalid if error.code == "Invalid" else Conflict
    where = f"items[{details['index']}]: " if "index" in details and index_map is not None else ""
    return cls(f"{where}{error.message}", code=error.reason, details=details)


def _admission_state(run: dict[str, Any]) -> str:
    """A run's state as admission counts it: started means admitted, whatever the actor says."""
    phase = run["status"]["phase"]
    if phase == "Pending":
        return "Active" if run["status"].get("admittedAt") else "Queued"
    if phase == "Running":
        return "Active"
    return phase  # Waiting, Succeeded, Failed, Cancelled


class GroupControl:
    """Group resources and supervisor links; the control plane provides the attributes declared here."""

    storage: Storage
    _agents: dict[Key, dict[str, Any]]
    _runs: dict[Key, dict[str, Any]]
    _locks: Any
    _groups: dict[Key, dict[str, Any]]
    _group_members: defaultdict[Key, list[str]]
    _group_handles: dict[Key, Any]

    # Provided by the control plane and its run supervision; declarations rather than stubs so
    # that no base class can shadow the real methods in the control plane's MRO.
    _ensure_started: Callable[[], Awaitable[None]]
    _persist_run: Callable[[Key], Awaitable[None]]
    _supervise: Callable[[Key], None]
    _cancel: Callable[[Key, str, str], Awaitable[dict[str, Any]]]
    _delete_run_now: Callable[[Key], Awaitable[None]]
    # Provided by `evaluation_control.EvaluationControl`.
    _evaluations: dict[Key, Any]
    _load_evaluation: Callable[[Key], Any]
    _open_evaluation: Callable[[Key, list[Any]], Any]
    _plan_evaluation: Callable[..., Awaitable[tuple[dict[str, Any], list[Any]]]]
    _prepare_evaluation: Callable[..., Awaitable[None]]
    _resume_evaluation: Callable[[Key], Awaitable[None]]
    _cancel_grading: Callable[[Key], Awaitable[None]]
    _release_grader: Callable[[Key], None]
    _member_ended: Callable[[Key, str], None]
    _evaluation_status: Callable[[Key, str | None], dict[str, Any]]

    # -- loading and starting ---------------------------------------------------------------

    def _load_groups(self, project: str) -> None:
        for name in self.storage.list_dir(f"projects/{project}/agentgroups"):
            path = f"{group_storage_prefix(project, name)}/group.json"
            try:
                self._groups[(project, name)] = self.storage.read_json(path)
            except FileNotFoundError:
                logger.warning("no group file at %s; skipped", path)
            except Exception:  # noqa: BLE001 - one damaged file must not stop the whole service
                logger.exception("could not read %s; skipped", path)

    def _index_members(self) -> None:
        """Each group's member names in creation order (``status.groupIndex``)."""
        indexed: defaultdict[Key, list[tuple[int, str]]] = defaultdict(list)
        for (project, name), run in self._runs.items():
            group = run["spec"].get("group")
            if group:
                indexed[(project, group)].append((int(run["status"].get("groupIndex") or 0), name))
        for key, entries in indexed.items():
            self._group_members[key] = [name for _, name in sorted(entries)]

    def _awaits_admission(self, run: dict[str, Any]) -> bool:
        """A queued member: it gets an actor only when its supervisor admits it."""
        return bool(run["spec"].get("group")) and not run["status"].get("admittedAt")

    async def _start_groups(self) -> None:
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
                        await asyncio.to_thread(self._load_evaluation, key)
                    except Exception:  # noqa: BLE001 - e.g. its Environment was uninstalled: that group only
                        # Its runs still go on (as a plain group's would); they are not graded.
                        logger.exception("evaluation of group %s/%s could not be loaded", *key)
                    else:
                        asyncio.get_running_loop().create_task(self._resume_evaluation(key))
                asyncio.get_running_loop().create_task(self._wake_supervisor(key))

    async def _wake_supervisor(self, key: Key) -> None:
        """Bring the group's supervisor up and tell it every started member's recorded state.

        A supervisor that outlived this control plane's crash kept its admission, but a report
        the dead control plane had not yet forwarded (a run that finished just then) would be
        lost with it, and the run would hold its ``maxActive`` place forever. Repeated reports
        change nothing, so every started member is reported again.
        """
        reports = []
        for name in self._group_members.get(key, []):
            run = self._runs.get((key[0], name))
            state = _admission_state(run) if run else "Queued"
            if run is not None and state != "Queued":
                reports.append(
                    {
                        "run": name,
                        "state": state,
                        "spent": run["status"]["cost"].get("totalUSD") or "0",
                        "reason": run["status"].get("reason"),
                    }
                )
        try:
            supervisor = self._supervisor(key)
            status = await supervisor.load.remote()
            if reports:
                status = await supervisor.reconcile.remote(reports)
        except Exception:  # noqa: BLE001 - it rebuilds itself on its next call anyway
            logger.exception("supervisor of group %s/%s did not load", *key)
            return
        await self._take_status(key, status, {})

    def _supervisor(self, key: Key) -> Any:
        handle = self._group_handles.get(key)
        if handle is None:
            handle = RemoteGroupSupervisor.options(**supervisor_options(*key)).remote(*key)
            self._group_handles[key] = handle
        return handle

    def _release_supervisor(self, key: Key) -> None:
        handle = self._group_handles.pop(key, None)
        if handle is None:
            try:
                handle = ray.get_actor(group_supervisor_name(*key), namespace=NAMESPACE)
            except ValueError:
                return
        ray.kill(handle, no_restart=True)

    async def _persist_group(self, key: Key) -> None:
        group = self._groups.get(key)
        if group is not None:
            await asyncio.to_thread(
                self.storage.write_json, f"{group_storage_prefix(*key)}/group.json", group
            )

    # -- the group resource -----------------------------------------------------------------

    async def get_group(self, project: str, name: str) -> dict[str, Any]:
        await self._ensure_started()
        group = self._groups.get((project, name))
        if group is None or group["metadata"].get("deletionTimestamp"):
            raise NotFound(
                f"agentgroup {name!r} not found in project {project!r}",
                details={"kind": "AgentGroup", "name": name},
            )
        return group

    async def list_groups(self, project: str) -> list[dict[str, Any]]:
        await self._ensure_started()
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
        await self._ensure_started()
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
                given = document.get("spec") if isinstance(document.get("spec"), dict) else {}
                for switch in ("sealed", "state"):
                    if switch not in given:
                        spec[switch] = existing["spec"].get(switch, spec[switch])
                return await self._update_group(key, existing, spec, parsed.metadata.labels)
        if spec.get("evaluation"):
            # Outside the group's lock, which creating members takes. The group is stored first,
            # so a crash from here on is finished by the next start (`_resume_evaluation`).
            await self._prepare_evaluation(key)
        return outcome

    async def _create_group(self, key: Key, parsed: AgentGroup, spec: dict[str, Any]) -> dict[str, Any]:
        project, name = key
        agent = self._agents.get((project, parsed.spec.agent))
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
            evaluation, tasks = await self._plan_evaluation(name, spec, created)
        status = AgentGroupStatus(
            phase="Running",
            message="sealed with no runs" if spec.get("sealed") else None,
            cost=GroupCost(limitUSD=parsed.spec.maxCostUSD),
            agentRevision=agent["status"]["revision"],
        ).model_dump(mode="json")
        status["evaluation"] = evaluation
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
            self._open_evaluation(key, tasks)
        try:
            await self._persist_group(key)
        except BaseException:
            self._groups.pop(key, None)
            self._evaluations.pop(key, None)
            raise
        await self._take_status(key, await self._supervisor(key).load.remote(), {})
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
            status = await self._supervisor(key).configure.remote(
                self._limits_wire(spec), bool(spec.get("sealed")), spec.get("state") == "Cancelled"
            )
            await self._take_status(key, status, {})
            if spec.get("evaluation") and spec.get("state") == "Cancelled":
                await self._cancel_grading(key)
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

    @staticmethod
    def _limits_wire(spec: dict[str, Any]) -> dict[str, Any]:
        limits = spec.get("limits") or {}
        return {
            "maxActive": int(limits.get("maxActive", 10)),
            "maxPending": int(limits.get("maxPending", 10000)),
            "maxCostUSD": spec.get("maxCostUSD"),
        }

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
        return (await self.apply_group(project, document, mode="apply"))["resource"]

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
        self._release_grader(key)
        self._evaluations.pop(key, None)
        limit = asyncio.Semaphore(_DELETE_CONCURRENCY)

        async def delete_member(run: str) -> None:
            async with limit:
                await self._delete_run_now((key[0], run))

        await asyncio.gather(*(delete_member(run) for run in list(self._group_members.get(key, []))))
        await asyncio.to_thread(self.storage.delete_tree, group_storage_prefix(*key))
        self._groups.pop(key, None)
        self._group_members.pop(key, None)

    # -- calls from the supervisor ----------------------------------------------------------

    async def group_snapshot(self, project: str, name: str) -> dict[str, Any]:
        """What a supervisor rebuilds admission from: limits, flags and every member's state."""
        await self._ensure_started()
        key = (project, name)
        group = self._groups.get(key)
        if group is None:
            raise NotFound(f"agentgroup {name!r} not found", details={"kind": "AgentGroup", "name": name})
        members = []
        for run_name in self._group_members.get(key, []):
            run = self._runs.get((project, run_name))
            if run is None:
                continue
            members.append(
                member_wire(
                    run["spec"]["taskKey"],
                    run_name,
                    run["status"]["cost"].get("limitUSD") or "0",
                    run["spec"].get("dependsOn"),
                    state=_admission_state(run),
                    reason=run["status"].get("reason"),
                    spent=run["status"]["cost"].get("totalUSD") or "0",
                )
            )
        spec = group["spec"]
        return {
            "limits": self._limits_wire(spec),
            "sealed": bool(spec.get("sealed")),
            "cancelled": spec.get("state") == "Cancelled",
            "members": members,
        }

    async def start_member(self, project: str, name: str) -> bool:
        """Admitted by its supervisor: record the admission, then give the run its actor. Idempotent.

        The supervisor retries a start that a dying control plane did not answer onto the
        restarted one, which must have loaded its runs first: an unknown run would read as gone,
        and its admitted place would be held forever.
        """
        await self._ensure_started()
        key = (project, name)
        async with self._locks[key]:
            run = self._runs.get(key)
            if run is None or run["status"]["phase"] in TERMINAL_PHASES:
                return False
            if not run["status"].get("admittedAt"):
                run["status"].update({"admittedAt": utc_now(), "reason": None, "message": None})
                await self._persist_run(key)
        self._supervise(key)
        return True

    async def cancel_member(self, project: str, name: str, reason: str) -> None:
        """Cancelled by its supervisor: a failed or cancelled dependency, or a group cancel."""
        await self._ensure_started()
        messages = {
            "DependencyFailed": "a run it depends on failed",
            "DependencyCancelled": "a run it depends on was cancelled",
            "GroupCancelled": "its group was cancelled",
        }
        if (project, name) in self._runs:
            await self._cancel((project, name), reason, messages.get(reason, reason))

    async def group_status(
        self, project: str, name: str, status: dict[str, Any], queued_reasons: dict[str, str]
    ) -> None:
        await self._ensure_started()
        await self._take_status((project, name), status, queued_reasons)

    async def _take_status(self, key: Key, status: dict[str, Any], queued_reasons: dict[str, str]) -> None:
        """Keep the supervisor's latest status; write it when the phase changes.

        Counts and cost between phase changes are not written: a restarted supervisor derives
        them again from the runs, which are written. A group's final status is written, and a
        finished group needs no supervisor any more.
        """
        group = self._groups.get(key)
        if group is None or group["metadata"].get("deletionTimestamp"):
            return
        project = key[0]
        for run_name, why in queued_reasons.items():
            run = self._runs.get((project, run_name))
            if (
                run is not None
                and run["status"]["phase"] == "Pending"
                and not run["status"].get("admittedAt")
            ):
                run["status"]["reason"] = why
        previous = group["status"].get("phase")
        if previous in GROUP_TERMINAL_PHASES:
            return  # final; a late push from a supervisor that is being released changes nothing
        group["status"].update(status)
        if key in self._evaluations:
            # An evaluation ends when its cases do, not when its runs do: grading comes after.
            group["status"].update(self._evaluation_status(key, status.get("phase")))
        phase = group["status"].get("phase")
        if phase != previous:
            if phase in GROUP_TERMINAL_PHASES:
                group["status"]["finishedAt"] = utc_now()
            await self._persist_group(key)
            if phase in GROUP_TERMINAL_PHASES:
                self._release_supervisor(key)
                self._release_grader(key)

    # -- members' progress ------------------------------------------------------------------

    async def _tell_group(self, run_key: Key) -> None:
        """Forward a member's phase and spend to its supervisor (after the run was written)."""
        run = self._runs.get(run_key)
        group_name = run["spec"].get("group") if run else None
        if not group_name or run is None:
            return
        key = (run_key[0], group_name)
        group = self._groups.get(key)
        if (
            group is None
            or group["metadata"].get("deletionTimestamp")
            or group["status"]["phase"] in GROUP_TERMINAL_PHASES
        ):
            return
        state = _admission_state(run)
        if state == "Queued":
            return
        if run["status"]["phase"] in TERMINAL_PHASES:
            self._member_ended(key, run_key[1])
        try:
            await self._supervisor(key).progressed.remote(
                run_key[1], state, run["status"]["cost"].get("totalUSD") or "0", run["status"].get("reason")
            )
        except Exception:  # noqa: BLE001 - a restarted supervisor reads the same state from its snapshot
            logger.warning("could not tell group %s/%s about run %s", *key, run_key[1], exc_info=True)
