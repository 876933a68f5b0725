"""The link between groups and their supervisors: admission asked, progress told, decisions done.

Admission belongs to a group's supervisor actor (`group_supervisor`). The link asks it before
runs are accepted (`check_members`), forwards what members do (`tell_group`, on every run
change), keeps the status it answers (`take_status`), and carries out what it decides
(``start_member``, ``cancel_member``, ``group_status``).

A member run is created queued: it gets no actor until its supervisor admits it, and the
admission is recorded (``status.admittedAt``) before it starts, so after a restart an admitted
run is resumed and a queued one waits for the rebuilt supervisor (`wake`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from nodus.errors import Conflict, Invalid, NotFound
from nodus.lifecycle import (
    GROUP_TERMINAL_PHASES,
    RUN_TERMINAL_PHASES,
    GroupPhase,
    RunPhase,
    RunReason,
    check_group_transition,
    run_transition,
)
from nodus.resources import AgentRun
from nodus_ray.control.evaluations import EvaluationService
from nodus_ray.control.group_actors import GroupSupervisors, admission_refusal, limits_wire
from nodus_ray.control.registry import Key, Registry, admission_state
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.core.admission import AdmissionError
from nodus_ray.runtime.group_supervisor import MemberWire, member_wire
from nodus_ray.store.timestamps import utc_now

__all__ = ["GroupLink", "NewRun", "run_cap"]

logger = logging.getLogger(__name__)

NewRun = tuple[int, AgentRun, dict[str, Any]]  # (index in the request, the run, its agent)


def run_cap(agent: dict[str, Any]) -> str:
    """The run's own cap, copied from the agent; a BYOK run costs Nodus nothing and has none."""
    byok = (agent["spec"].get("model") or {}).get("access") == "BYOK"
    return "0" if byok else str(agent["spec"]["perRunMaxCostUSD"])


class GroupLink:
    """Each group's supervisor as the control plane sees it; listens to every run change."""

    def __init__(
        self,
        registry: Registry,
        supervisor: RunSupervisor,
        group_actors: GroupSupervisors,
        evaluations: EvaluationService,
    ) -> None:
        self._registry = registry
        self._runs = registry.runs
        self._groups = registry.groups
        self._group_members = registry.group_members
        self._locks = registry.locks
        self._supervisor = supervisor
        self._group_actors = group_actors
        self._evaluations = evaluations
        registry.on_run_changed(self.tell_group)
        # What the project's Budget can still hold (None: no Budget), from `control.budgets`
        # (wired by `compose`); each group's supervisor is told it, and admits only while it
        # holds the next member's cap. The value last told each group, to tell only changes.
        self.budget_left: Callable[[str], Decimal | None] = lambda project: None
        self._told_budget: dict[Key, Decimal | None] = {}

    def _supervisor_of(self, key: Key) -> Any:
        return self._group_actors.handle(key)

    def _release_supervisor(self, key: Key) -> None:
        self._group_actors.release(key)

    async def wake(self, key: Key) -> None:
        """Bring the group's supervisor up and tell it every started member's recorded state.

        A supervisor that outlived this control plane's crash kept its admission, but a report
        the dead control plane had not yet forwarded (a run that finished just then) would be
        lost with it, and the run would hold its ``maxActive`` place forever. Repeated reports
        change nothing, so every started member is reported again.
        """
        reports = []
        for name in self._group_members.get(key, []):
            run = self._runs.get((key[0], name))
            state = admission_state(run) if run else "Queued"
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
            supervisor = self._supervisor_of(key)
            status = await supervisor.load.remote()
            if reports:
                status = await supervisor.reconcile.remote(reports)
        except Exception:  # noqa: BLE001 - it rebuilds itself on its next call anyway
            logger.exception("supervisor of group %s/%s did not load", *key)
            return
        await self.take_status(key, status, {})

    # -- new members ------------------------------------------------------------------------

    async def check_members(
        self,
        project: str,
        fresh: list[NewRun],
        groups: list[str],
        evaluation_member: bool = False,
    ) -> dict[str, list[MemberWire]]:
        """Ask each group's supervisor whether it takes its new members; nothing is stored yet.

        Called with each group's lock held (``("group", project, name)``), as is `add_members`.

        An evaluation group takes only the members its evaluation creates (``evaluation_member``).
        """
        members: dict[str, list[MemberWire]] = {}
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
                member_wire(run.spec.taskKey, run.metadata.name, run_cap(agent), run.spec.dependsOn)
            )
            positions.setdefault(group_name, []).append(index)
        for group_name in groups:
            try:
                await self._supervisor_of((project, group_name)).check.remote(members[group_name])
            except Exception as error:  # noqa: BLE001 - Ray wraps the refusal; its cause is what counts
                cause = getattr(error, "cause", error)
                if not isinstance(cause, AdmissionError):
                    raise
                index_map = positions[group_name] if len(fresh) > 1 else None
                raise admission_refusal(cause, index_map=index_map) from None
        return members

    async def add_members(self, project: str, group: str, wires: list[MemberWire]) -> None:
        """Hand the stored new members to their group's supervisor, and keep the status it gives."""
        status = await self._supervisor_of((project, group)).add.remote(wires)
        await self.take_status((project, group), status, {})

    # -- calls from the supervisor ----------------------------------------------------------

    async def group_snapshot(self, project: str, name: str) -> dict[str, Any]:
        """What a supervisor rebuilds admission from: limits, flags and every member's state."""
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
                    state=admission_state(run),
                    reason=run["status"].get("reason"),
                    spent=run["status"]["cost"].get("totalUSD") or "0",
                )
            )
        spec = group["spec"]
        left = self.budget_left(project)
        self._told_budget[key] = left
        return {
            "budgetLeftUSD": None if left is None else str(left),
            "limits": limits_wire(spec),
            "sealed": bool(spec.get("sealed")),
            "cancelled": spec.get("state") == "Cancelled",
            "members": members,
        }

    async def start_member(self, project: str, name: str) -> bool:
        """Admitted by its supervisor: record the admission, then give the run its actor. Idempotent.

        The supervisor retries a start that a dying control plane did not answer onto the
        restarted one, which must have loaded its runs first: an unknown run would read as gone,
        and its admitted place would be held forever.

        A keep-alive member a message came to (Waiting / GroupWait) is resumed the same way: it
        goes Running and gets an actor, which reads the message.
        """
        key = (project, name)
        resumed = False
        async with self._locks[key]:
            run = self._runs.get(key)
            if run is None or run["status"]["phase"] in RUN_TERMINAL_PHASES:
                return False
            status = run["status"]
            if (status["phase"], status.get("reason")) == (RunPhase.WAITING, RunReason.GROUP_WAIT):
                status.update(run_transition(status, RunPhase.RUNNING, None, "a message arrived"))
                await self._registry.persist_run(key)
                resumed = True
            elif not status.get("admittedAt"):
                status.update({"admittedAt": utc_now(), "reason": None, "message": None})
                await self._registry.persist_run(key)
        if resumed:
            await self._registry.run_changed(key)
        self._supervisor.supervise(key)
        return True

    async def cancel_member(self, project: str, name: str, reason: str) -> None:
        """Cancelled by its supervisor: a failed or cancelled dependency, or a group cancel."""
        messages = {
            "DependencyFailed": "a run it depends on failed",
            "DependencyCancelled": "a run it depends on was cancelled",
            "GroupCancelled": "its group was cancelled",
        }
        if (project, name) in self._runs:
            await self._supervisor.cancel((project, name), reason, messages.get(reason, reason))

    async def group_status(
        self, project: str, name: str, status: dict[str, Any], queued_reasons: dict[str, str]
    ) -> None:
        await self.take_status((project, name), status, queued_reasons)

    async def take_status(self, key: Key, status: dict[str, Any], queued_reasons: dict[str, str]) -> None:
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
                and run["status"]["phase"] == RunPhase.PENDING
                and not run["status"].get("admittedAt")
            ):
                run["status"]["reason"] = why
        previous = group["status"].get("phase")
        if previous in GROUP_TERMINAL_PHASES:
            return  # final; a late push from a supervisor that is being released changes nothing
        update = dict(status)
        if self._evaluations.has(key):
            # An evaluation ends when its cases do, not when its runs do: grading comes after.
            update.update(self._evaluations.status(key, status.get("phase")))
        update["cost"] = {
            **(update.get("cost") or group["status"].get("cost") or {}),
            **self._sandbox_cost(key),
        }
        if "phase" in update:  # every change of a group's phase is checked against the lifecycle
            check_group_transition(str(previous or GroupPhase.RUNNING), str(update["phase"]))
        group["status"].update(update)
        phase = group["status"].get("phase")
        if phase != previous:
            if phase in GROUP_TERMINAL_PHASES:
                group["status"]["finishedAt"] = utc_now()
            await self._registry.persist_group(key)
            await self._registry.group_changed(key)  # its webhooks (`webhook_service`)
            if phase in GROUP_TERMINAL_PHASES:
                self._release_supervisor(key)
                self._evaluations.release_grader(key)

    def _sandbox_cost(self, key: Key) -> dict[str, str]:
        """The group's sandbox figures (decision 44): ``gradingUSD``, its grading's compute (from
        the case records), and ``sandboxUSD``, its members' sandbox compute and the grading."""
        grading = self._evaluations.grading_usd(key)
        # The group's members by its index, not a walk of every stored run of every project:
        # this runs on each status the group publishes (issue 19: the walk was 40% of the
        # control plane's CPU in a 2,000-run group).
        members = Decimal(0)
        for name in self._group_members.get(key, ()):
            run = self._runs.get((key[0], name))
            sandbox = (run["status"].get("cost") or {}).get("sandboxUSD") if run is not None else None
            if sandbox and sandbox != "0":
                members += Decimal(str(sandbox))
        return {"gradingUSD": str(grading), "sandboxUSD": str(members + grading)}

    # -- members' progress ------------------------------------------------------------------

    async def tell_group(self, run_key: Key) -> None:
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
        state = admission_state(run)
        if state == "Queued":
            return
        if run["status"]["phase"] in RUN_TERMINAL_PHASES:
            self._evaluations.member_ended(key, run_key[1])
        try:
            await self._supervisor_of(key).progressed.remote(
                run_key[1], state, run["status"]["cost"].get("totalUSD") or "0", run["status"].get("reason")
            )
        except Exception:  # noqa: BLE001 - a restarted supervisor reads the same state from its snapshot
            logger.warning("could not tell group %s/%s about run %s", *key, run_key[1], exc_info=True)
        await self.tell_budget(key)

    async def tell_budget(self, key: Key) -> None:
        """Tell the group's supervisor what the project's Budget can hold now, if that changed."""
        left = self.budget_left(key[0])
        if key not in self._told_budget and left is None:
            return  # a project without a Budget: nothing to tell
        if key in self._told_budget and self._told_budget[key] == left:
            return
        group = self._groups.get(key)
        if group is None or group["status"]["phase"] in GROUP_TERMINAL_PHASES:
            self._told_budget.pop(key, None)
            return
        self._told_budget[key] = left
        try:
            status = await self._supervisor_of(key).budget.remote(None if left is None else str(left))
        except Exception:  # noqa: BLE001 - told again on the next change; a restarted one reads its snapshot
            self._told_budget.pop(key, None)
            logger.warning("could not tell group %s/%s about the Budget", *key, exc_info=True)
            return
        await self.take_status(key, status, {})

    async def budget_changed(self, project: str) -> None:
        """The project's Budget was raised, deleted or began a new period: its groups admit again."""
        for key in [key for key in self._groups if key[0] == project]:
            await self.tell_budget(key)
