"""The group supervisor: one detached actor per unfinished AgentGroup.

It owns the group's admission (`admission.Admission`): which queued run starts next under
``maxActive`` and the cost cap, the cost reservations of started runs, the dependency cascade,
and the group's status. It persists nothing. Its state follows from the members' recorded
phases, so when it starts (first use, a crash, a restart of the whole cluster) it asks the
control plane for a snapshot of the group and rebuilds the same admission from it.

Division of labour with the control plane, which alone writes resources:

* the control plane asks here before it accepts runs (`check`), then tells what it stored
  (`add`), forwards every change of a member's phase or spend (`progressed`), and forwards
  limit changes, the seal and the cancel (`configure`);
* this actor decides and asks the control plane to carry decisions out: ``start_member`` and
  ``cancel_member`` per run, and ``group_status`` with the new status.

Every method here is safe to repeat (the control plane's calls are retried onto a restarted
supervisor by Ray), and decisions are carried out by one executor task, never inside a call,
so no call here waits on the control plane while the control plane waits on it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import ray

from nodus_ray import metrics
from nodus_ray.control.client import ControlPlaneClient
from nodus_ray.core.admission import Admission, AdmissionError, Decision, GroupLimits, GroupStatus, Member
from nodus_ray.faults import crash_point
from nodus_ray.settings import NAMESPACE

__all__ = [
    "GroupSupervisor",
    "MemberWire",
    "RemoteGroupSupervisor",
    "group_supervisor_name",
    "member_wire",
    "supervisor_options",
]

logger = logging.getLogger(__name__)


def group_supervisor_name(project: str, name: str) -> str:
    return f"group.{project}.{name}"


@dataclass(frozen=True)
class MemberWire:
    """A member as it crosses from the control plane to the supervisor (money as strings)."""

    key: str
    run: str
    cap: str
    depends_on: tuple[str, ...] = ()
    state: str = "Queued"
    reason: str | None = None
    spent: str = "0"

    def member(self) -> Member:
        return Member(
            key=self.key,
            run=self.run,
            cap=Decimal(self.cap),
            depends_on=self.depends_on,
            state=self.state or "Queued",
            reason=self.reason,
            spent=Decimal(self.spent or "0"),
        )


def member_wire(
    key: str,
    run: str,
    cap: str,
    depends_on: list[str] | None,
    *,
    state: str = "Queued",
    reason: str | None = None,
    spent: str = "0",
) -> MemberWire:
    """The wire of one member, from what the control plane stored of its run."""
    return MemberWire(
        key=key,
        run=run,
        cap=cap,
        depends_on=tuple(depends_on or ()),
        state=state,
        reason=reason,
        spent=spent,
    )


def _limits(wire: dict[str, Any]) -> GroupLimits:
    max_cost = wire.get("maxCostUSD")
    return GroupLimits(
        max_active=int(wire["maxActive"]),
        max_pending=int(wire["maxPending"]),
        max_cost=None if max_cost is None else Decimal(max_cost),
    )


class GroupSupervisor:
    """Admission for one group; decisions carried out by the executor task."""

    def __init__(self, project: str, name: str) -> None:
        self.project = project
        self.name = name
        self._admission: Admission | None = None
        self._loading: asyncio.Future[None] | None = None
        self._control_plane = ControlPlaneClient.for_engine()
        self._starts: list[str] = []
        self._cancels: list[tuple[str, str]] = []
        self._status: GroupStatus | None = None
        self._status_dirty = False
        self._wake: asyncio.Event | None = None
        self._executor: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"GroupSupervisor(group={self.project}/{self.name})"

    # -- loading ---------------------------------------------------------------------------

    async def _loaded(self) -> Admission:
        if self._admission is None:
            if self._loading is None or (self._loading.done() and self._loading.exception() is not None):
                self._loading = asyncio.ensure_future(self._load())
            await asyncio.shield(self._loading)
        assert self._admission is not None
        return self._admission

    async def _load(self) -> None:
        snapshot = await self._control_plane.group_snapshot(self.project, self.name)
        admission = Admission.rebuild(
            _limits(snapshot["limits"]),
            [wire.member() for wire in snapshot["members"]],
            sealed=bool(snapshot["sealed"]),
            cancelled=bool(snapshot["cancelled"]),
        )
        left = snapshot.get("budgetLeftUSD")
        admission.budget_left = None if left is None else Decimal(str(left))
        self._admission = admission
        self._wake = asyncio.Event()
        self._executor = asyncio.get_running_loop().create_task(self._execute())
        self._take(admission.decide())

    # -- requests from the control plane ---------------------------------------------------

    async def load(self) -> dict[str, Any]:
        """Rebuild from the control plane's snapshot (once) and return the status."""
        await self._loaded()
        return self._status_view()

    async def check(self, members: list[MemberWire]) -> None:
        """Raise the `AdmissionError` the group would answer to these new runs; change nothing."""
        admission = await self._loaded()
        admission.check([wire.member() for wire in members if not admission.has_run(wire.run)])

    async def add(self, members: list[MemberWire]) -> dict[str, Any]:
        """Take in runs the control plane has stored; runs already known are skipped.

        Skipping makes this safe to repeat, and covers a supervisor that (re)loaded its snapshot
        after the runs were stored and before this call arrived.
        """
        admission = await self._loaded()
        new = [wire.member() for wire in members if not admission.has_run(wire.run)]
        if new:
            self._take(admission.add(new))
        return self._status_view()

    async def progressed(self, run: str, state: str, spent: str, reason: str | None) -> None:
        """A member's phase or spend changed. Stale or repeated reports are ignored."""
        admission = await self._loaded()
        if not admission.has_run(run):
            logger.warning("group %s/%s: report for unknown run %s ignored", self.project, self.name, run)
            return
        try:
            self._take(admission.progressed(run, state=state, spent=Decimal(spent), reason=reason))
        except AdmissionError as refused:
            # A non-terminal report that arrives after the terminal one: the terminal one stands.
            logger.info("group %s/%s: stale report for %s ignored: %s", self.project, self.name, run, refused)

    async def reconcile(self, reports: list[dict[str, Any]]) -> dict[str, Any]:
        """Members' recorded states, sent again by a restarted control plane (see
        `GroupControl._wake_supervisor`); what admission already knows changes nothing."""
        for report in reports:
            await self.progressed(report["run"], report["state"], report["spent"], report.get("reason"))
        return self._status_view()

    async def configure(self, limits: dict[str, Any], sealed: bool, cancelled: bool) -> dict[str, Any]:
        """Bring limits, seal and cancel in line with the group's stored spec.

        The control plane has already refused what cannot change (a lowered cap, an unseal);
        what is left can only move forward, so repeating the call changes nothing.
        """
        admission = await self._loaded()
        wanted = _limits(limits)
        current = admission.limits
        if wanted != current:
            self._take(
                admission.patch(
                    max_active=wanted.max_active if wanted.max_active != current.max_active else None,
                    max_pending=wanted.max_pending if wanted.max_pending != current.max_pending else None,
                    max_cost=wanted.max_cost if wanted.max_cost != current.max_cost else None,
                )
            )
        if sealed and not admission.sealed:
            self._take(admission.seal())
        if cancelled and not admission.cancelled:
            self._take(admission.cancel())
        return self._status_view()

    async def budget(self, left: str | None) -> dict[str, Any]:
        """What the project's Budget can still hold now (None: no Budget): admission starts
        members only while it holds the next one's cap (blocked key ``BudgetExceeded``)."""
        admission = await self._loaded()
        value = None if left is None else Decimal(left)
        if value != admission.budget_left:
            self._take(admission.set_budget_left(value))
        return self._status_view()

    async def status(self) -> dict[str, Any]:
        await self._loaded()
        return self._status_view()

    # -- carrying decisions out ------------------------------------------------------------

    def _status_view(self) -> dict[str, Any]:
        assert self._status is not None
        return self._status.to_dict()

    def _take(self, decision: Decision) -> None:
        metrics.admission_decisions(self.project, self.name, len(decision.start), len(decision.cancel))
        self._starts.extend(decision.start)
        self._cancels.extend(decision.cancel)
        if decision.status != self._status:
            self._status = decision.status
            self._status_dirty = True
        assert self._wake is not None
        self._wake.set()

    async def _execute(self) -> None:
        """Carry out starts and cancels, then publish the status; forever, one batch at a time."""
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._drain()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad batch; it retries
                logger.exception(
                    "group %s/%s: carrying out decisions failed; retrying", self.project, self.name
                )
                await asyncio.sleep(1.0)
                self._wake.set()

    async def _drain(self) -> None:
        while self._starts or self._cancels or self._status_dirty:
            starts, self._starts = self._starts, []
            cancels, self._cancels = self._cancels, []
            try:
                await asyncio.gather(*(self._start(run) for run in starts))
                await asyncio.gather(*(self._cancel(run, reason) for run, reason in cancels))
            except BaseException:
                # Put back what may not have happened; starts and cancels are idempotent.
                self._starts[:0] = starts
                self._cancels[:0] = cancels
                raise
            if self._status_dirty:
                self._status_dirty = False
                await self._publish()

    async def _start(self, run: str) -> None:
        crash_point("admission-decided", f"{self.project}/{self.name}/{run}")
        await self._control_plane.start_member(self.project, run)
        assert self._admission is not None
        try:
            self._admission.started(run)
        except AdmissionError:
            pass  # the run reported (or was cancelled) before the acknowledgement: nothing to do

    async def _cancel(self, run: str, reason: str) -> None:
        await self._control_plane.cancel_member(self.project, run, reason)

    async def _publish(self) -> None:
        assert self._status is not None and self._admission is not None
        changed = self._admission.take_reason_changes()
        metrics.set_group_runs(self.project, self.name, self._status.counts)
        try:
            await self._control_plane.group_status(self.project, self.name, self._status.to_dict(), changed)
        except BaseException:
            self._status_dirty = True  # publish again, with these reasons, on the next round
            self._admission.restore_reason_changes(changed)
            raise


RemoteGroupSupervisor = ray.remote(  # type: ignore[call-overload]  # Ray's stubs lack max_concurrency
    num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=1000
)(GroupSupervisor)


def supervisor_options(project: str, name: str) -> dict[str, Any]:
    """How the control plane creates (or finds) a group's supervisor."""
    return {
        "name": group_supervisor_name(project, name),
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
    }
