"""The admission state of one group: its members, the requests it takes, the decisions it makes.

See :mod:`nodus_ray.core.admission` for the rules. The checks are in :mod:`.checks`, the sums and
the admission pass in :mod:`.ledger`, the status in :mod:`.status`; this module keeps the
members, their dependency bookkeeping, and the order in which decisions are handed out.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from nodus_ray.core.admission.checks import _check_batch, _check_rebuild, _checked_member, _stable_topological
from nodus_ray.core.admission.errors import _check_money, _conflict, _invalid, _usd
from nodus_ray.core.admission.ledger import _Ledger, _Plan
from nodus_ray.core.admission.model import (
    _STARTED,
    _STATES,
    _TERMINAL,
    ACTIVE,
    CANCELLED,
    DEPENDENCY_CANCELLED,
    DEPENDENCY_FAILED,
    DEPENDENCY_WAIT,
    FAILED,
    GROUP_CANCELLED,
    GROUP_WAIT,
    QUEUED,
    SUCCEEDED,
    WAITING,
    Decision,
    GroupLimits,
    GroupStatus,
    Member,
)
from nodus_ray.core.admission.status import _group_status

__all__ = ["Admission"]


class Admission:
    """The admission state of one group. Not thread-safe: the supervisor actor serialises calls."""

    def __init__(self, limits: GroupLimits, *, sealed: bool = False, cancelled: bool = False) -> None:
        if not isinstance(limits, GroupLimits):
            raise TypeError(f"limits must be GroupLimits, not {type(limits).__name__}")
        self._limits = limits
        self._sealed = bool(sealed)
        self._cancelled = bool(cancelled)
        self._members: dict[str, Member] = {}  # run name -> member, in creation order
        self._by_key: dict[str, Member] = {}
        self._by_index: list[Member] = []  # creation index -> member
        self._index: dict[str, int] = {}  # run name -> creation index
        self._dependents: dict[str, list[str]] = {}  # task key -> runs that depend on it
        self._unconfirmed: dict[str, None] = {}  # admitted, start not yet acknowledged (ordered set)
        self._orders: dict[str, str] = {}  # started run -> cancel reason it was told
        self._outbox: list[tuple[str, str]] = []  # cancels not yet handed out in a Decision
        # Kept up to date on every change, so that a decision costs about the runs it starts,
        # not the size of the group (a group holds up to maxPending unfinished runs):
        self._unmet: dict[str, int] = {}  # queued run -> its dependencies not yet Succeeded
        self._recheck: list[int] = []  # heap: queued runs a failed or cancelled dependency may cancel
        self._ledger = _Ledger()  # counts, spend, reservations, the eligible queue
        # What the project's Budget can still hold, as the control plane last said (None: the
        # project has no Budget); see `set_budget_left`.
        self.budget_left: Decimal | None = None
        self._reason_changes: dict[str, str] = {}  # queued run -> its new reason, since last taken
        # Keep-alive runs a message came to, waiting (Waiting / GroupWait) for a free maxActive
        # slot to read it, in the order they asked (an ordered set): resumed before queued runs.
        self._resumes: dict[str, None] = {}

    # -- restart ---------------------------------------------------------------------------

    @classmethod
    def rebuild(
        cls, limits: GroupLimits, members: Sequence[Member], *, sealed: bool, cancelled: bool
    ) -> Admission:
        """The admission of a group after a restart, from its runs' recorded states.

        ``members`` should come in creation order (it decides FIFO); a member listed before one
        of its dependencies is moved after it (stable topological order), so a listing by
        creation time with ties is accepted. Active/Waiting members keep their reservation.
        Cancels that the previous supervisor may not have carried out (a queued run whose
        dependency failed, the unfinished runs of a cancelled group) are handed out again by
        the next Decision; nothing is started until `decide` is called.
        """
        admission = cls(limits, sealed=sealed, cancelled=cancelled)
        copies = [_checked_member(member, index, rebuilding=True) for index, member in enumerate(members)]
        _check_rebuild(copies)
        for member in _stable_topological(copies):
            admission._insert(member)
        admission._cascade()
        if admission._cancelled:
            admission._cancel_unfinished()
        return admission

    # -- reads -----------------------------------------------------------------------------

    @property
    def members(self) -> list[Member]:
        """Copies of the members in creation order (changing them changes nothing here)."""
        return [replace(member) for member in self._members.values()]

    def has_run(self, run: str) -> bool:
        return run in self._members

    @property
    def limits(self) -> GroupLimits:
        return self._limits

    @property
    def sealed(self) -> bool:
        return self._sealed

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def unconfirmed(self) -> list[str]:
        """Runs handed out in ``Decision.start`` whose start `started` has not acknowledged yet."""
        return list(self._unconfirmed)

    @property
    def pending_cancels(self) -> dict[str, str]:
        """Started runs told to cancel that have not reported a terminal state yet (run -> reason)."""
        return dict(self._orders)

    @property
    def status(self) -> GroupStatus:
        """The status now, without admitting anything (the status of the last Decision)."""
        return self._status(self._plan())

    @property
    def queued_reasons(self) -> dict[str, str]:
        """Each queued run's own reason: DependencyWait, or GroupWait (waiting for room)."""
        return {
            member.run: member.reason or GROUP_WAIT
            for member in self._members.values()
            if member.state == QUEUED
        }

    def take_reason_changes(self) -> dict[str, str]:
        """Queued runs whose reason changed since the last call (a supervisor publishes these)."""
        changes, self._reason_changes = self._reason_changes, {}
        return {run: why for run, why in changes.items() if self._members[run].state == QUEUED}

    def restore_reason_changes(self, changes: dict[str, str]) -> None:
        """Put back changes taken but not delivered; newer changes of the same runs win."""
        self._reason_changes = {**changes, **self._reason_changes}

    # -- requests --------------------------------------------------------------------------

    def add(self, members: Sequence[Member]) -> Decision:
        """Take in a batch of new runs, all or none.

        Every member is checked before any is added: the group must be neither cancelled nor
        sealed, the batch must fit under maxPending (unfinished runs), each task key must be a
        DNS label new to the group and the batch, and each dependency must name a task key
        already in the group or earlier in the batch (so a batch can never form a cycle; a
        cycle is still named as one because it is the likelier mistake). On refusal it raises
        `AdmissionError` and the group is unchanged.
        """
        batch = self._checked(members)
        for member in batch:
            self._insert(member)
        return self._settle()

    def check(self, members: Sequence[Member]) -> None:
        """Raise the `AdmissionError` that `add` would raise for ``members``; change nothing.

        The supervisor answers this before the control plane writes a batch to storage, so a
        refused batch leaves no trace anywhere.
        """
        self._checked(members)

    def _checked(self, members: Sequence[Member]) -> list[Member]:
        if self._cancelled:
            raise _conflict("GroupCancelled", "the group is cancelled and takes no new runs", "spec.group")
        if self._sealed:
            raise _conflict("GroupSealed", "the group is sealed and takes no new runs", "spec.group")
        batch = [_checked_member(member, index, rebuilding=False) for index, member in enumerate(members)]
        unfinished = sum(1 for member in self._members.values() if member.state not in _TERMINAL)
        if unfinished + len(batch) > self._limits.max_pending:
            raise _conflict(
                "MaxPendingReached",
                f"the group has {unfinished} unfinished runs and takes at most maxPending "
                f"{self._limits.max_pending}; {len(batch)} more do not fit",
                "spec.limits.maxPending",
            )
        _check_batch(batch, group_keys=self._by_key, group_runs=self._members)
        return batch

    def started(self, run: str) -> None:
        """Acknowledge that a run handed out in ``Decision.start`` has been started.

        The run is already Active (admission moved it when it handed it out, which is what keeps
        it from being handed out twice); this only takes it off `unconfirmed`. A repeated
        acknowledgement, or one after the run has reported, is a no-op. Acknowledging a run that
        was never admitted is a supervisor bug and is refused.
        """
        member = self._get(run)
        if run in self._unconfirmed:
            del self._unconfirmed[run]
        elif member.state == QUEUED:
            raise _conflict("NotAdmitted", f"run {run!r} is queued and was not admitted", "metadata.name")

    def progressed(self, run: str, *, state: str, spent: Decimal, reason: str | None = None) -> Decision:
        """A member reports its state and its spend so far.

        ``state`` is Active, Waiting, Succeeded, Failed or Cancelled (Queued is admission's own).
        Spend only grows: a lower figure is a stale report and is ignored. A terminal state
        releases the run's reservation (its spend stays counted), cascades a failure or
        cancellation to its queued dependents and may admit others. A terminal state is final:
        a different one later is refused. ``reason`` (optional) is the run's own reason; a
        run that admission told to cancel keeps the reason it was told. A run reporting Active
        without having been admitted is taken as started (the report is a fact), but admission
        itself never starts more than maxActive.
        """
        member = self._get(run)
        if state not in _STATES or state == QUEUED:
            raise _invalid(
                "InvalidState",
                f"a run reports Active, Waiting, Succeeded, Failed or Cancelled, not {state!r}",
                "status.phase",
            )
        _check_money(spent, "status.cost.totalUSD", "spent")
        if member.state in _TERMINAL:
            if state != member.state:
                raise _conflict(
                    "RunFinished",
                    f"run {run!r} already finished as {member.state} and cannot become {state}",
                    "status.phase",
                )
            self._transition(member, member.state, spent=max(member.spent, spent), reason=member.reason)
            return self._settle()
        ordered = self._orders.pop(run, None) if state in _TERMINAL else self._orders.get(run)
        self._transition(
            member,
            state,
            spent=max(member.spent, spent),
            reason=(ordered or reason) if state == CANCELLED else reason,
        )
        self._unconfirmed.pop(run, None)
        return self._settle()

    def patch(
        self,
        *,
        max_active: int | None = None,
        max_cost: Decimal | None = None,
        max_pending: int | None = None,
    ) -> Decision:
        """Change the limits of a live group; may admit more.

        maxActive may go up or down (1 to 1000; lowering stops nothing, it only delays starts).
        maxCostUSD may only be raised: started runs reserved against the old cap, and lowering
        could leave spent + reserved above the new one. An uncapped group cannot get a cap.
        """
        changes: dict[str, Any] = {}
        if max_active is not None:
            changes["max_active"] = max_active
        if max_pending is not None:
            changes["max_pending"] = max_pending
        if max_cost is not None:
            _check_money(max_cost, "spec.maxCostUSD", "maxCostUSD")
            current = self._limits.max_cost
            if current is None:
                raise _conflict(
                    "CapLowered",
                    "the group has no cost cap, and a cap cannot be lowered onto it",
                    "spec.maxCostUSD",
                )
            if max_cost < current:
                raise _conflict(
                    "CapLowered",
                    f"maxCostUSD can be raised, not lowered (from ${_usd(current)} to ${_usd(max_cost)})",
                    "spec.maxCostUSD",
                )
            changes["max_cost"] = max_cost
        self._limits = replace(self._limits, **changes)  # GroupLimits checks the ranges
        return self._settle()

    def set_budget_left(self, left: Decimal | None) -> Decision:
        """What the project's Budget can still hold now (None: no Budget); may admit more, or
        stop admitting (`_Ledger.plan`). Sent by the control plane when the Budget or the
        project's spend changes."""
        self.budget_left = left
        return self._settle()

    def seal(self) -> Decision:
        """No more runs are coming; the group can finish. Idempotent and cannot be undone."""
        self._sealed = True
        return self._settle()

    def cancel(self) -> Decision:
        """Cancel every unfinished run and keep the finished ones.

        Queued runs are cancelled here (reason GroupCancelled, nothing to stop); started runs are
        told to cancel and the group is Cancelling until each reports a terminal state (a run that
        finishes first keeps its result), then Cancelled. Cancelling a finished group (sealed,
        every run terminal) changes nothing: Succeeded and Failed are final. Idempotent.
        """
        if not self._cancelled and not self._finished():
            self._cancelled = True
            self._cancel_unfinished()
        return self._settle()

    def decide(self) -> Decision:
        """What to start now and the status.

        Its only effects: runs it returns in ``start`` become Active with their caps reserved,
        and cancels not yet handed out are handed out. Calling it again returns nothing new.
        """
        return self._settle()

    # -- internals -------------------------------------------------------------------------

    def _get(self, run: str) -> Member:
        member = self._members.get(run)
        if member is None:
            raise _invalid("UnknownRun", f"run {run!r} is not in the group", "metadata.name")
        return member

    # -- the kept-up-to-date state --------------------------------------------------------

    def _insert(self, member: Member) -> None:
        """Take in a checked copy whose dependencies are members already."""
        index = len(self._by_index)
        self._by_index.append(member)
        self._index[member.run] = index
        self._members[member.run] = member
        self._by_key[member.key] = member
        self._dependents.setdefault(member.key, [])
        for dependency in member.depends_on:
            self._dependents[dependency].append(member.run)
        self._ledger.enter(member)
        if member.state == WAITING and member.reason == GROUP_WAIT:
            self._resumes[member.run] = None  # rebuilt: a message came and it waits for a slot
        if member.state != QUEUED:
            return
        states = [self._by_key[dependency].state for dependency in member.depends_on]
        unmet = sum(1 for state in states if state != SUCCEEDED)
        self._unmet[member.run] = unmet
        if FAILED in states or CANCELLED in states:
            heapq.heappush(self._recheck, index)
        if unmet == 0:
            self._ledger.make_eligible(index, member)
        self._set_queued_reason(member, GROUP_WAIT if unmet == 0 else DEPENDENCY_WAIT)

    def _set_queued_reason(self, member: Member, reason: str) -> None:
        if member.reason != reason:
            member.reason = reason
            self._reason_changes[member.run] = reason

    def _transition(self, member: Member, state: str, *, spent: Decimal, reason: str | None) -> None:
        """Every change of a member's state or spend goes through here, to keep the counts true."""
        was = member.state
        if was == QUEUED:
            if self._unmet.pop(member.run, 0) == 0:
                self._ledger.make_ineligible(
                    self._index[member.run], member
                )  # before the spend changes: its need is keyed by it
        self._ledger.leave(member)
        member.state, member.spent, member.reason = state, spent, reason
        self._ledger.enter(member)
        if state == WAITING and reason == GROUP_WAIT:
            self._resumes[member.run] = None
        else:
            self._resumes.pop(member.run, None)
        if state == was:
            return
        if state == SUCCEEDED:
            for run in self._dependents[member.key]:
                dependent = self._members[run]
                if dependent.state == QUEUED:
                    self._unmet[run] -= 1
                    if self._unmet[run] == 0:
                        self._ledger.make_eligible(self._index[run], dependent)
                        self._set_queued_reason(dependent, GROUP_WAIT)
        elif state in (FAILED, CANCELLED):
            for run in self._dependents[member.key]:
                if self._members[run].state == QUEUED:
                    heapq.heappush(self._recheck, self._index[run])

    def _dependencies(self, member: Member) -> list[Member]:
        return [self._by_key[key] for key in member.depends_on]

    def _finished(self) -> bool:
        return self._sealed and self._ledger.unfinished() == 0

    def _cascade(self) -> None:
        """Cancel queued runs whose dependency failed or was cancelled, level by level.

        Runs are looked at in creation order, and dependencies precede their dependents, so a
        run is decided only after every dependency that this cascade cancels: one with a failed
        dependency is ``DependencyFailed`` even if another dependency was cancelled.
        """
        while self._recheck:
            member = self._by_index[heapq.heappop(self._recheck)]
            if member.state != QUEUED:
                continue
            states = {dependency.state for dependency in self._dependencies(member)}
            reason = (
                DEPENDENCY_FAILED
                if FAILED in states
                else DEPENDENCY_CANCELLED
                if CANCELLED in states
                else None
            )
            if reason is not None:
                self._transition(member, CANCELLED, spent=member.spent, reason=reason)
                self._outbox.append((member.run, reason))

    def _cancel_unfinished(self) -> None:
        for member in self._members.values():
            if member.state == QUEUED:
                self._transition(member, CANCELLED, spent=member.spent, reason=GROUP_CANCELLED)
                self._outbox.append((member.run, GROUP_CANCELLED))
            elif member.state in _STARTED and member.run not in self._orders:
                self._orders[member.run] = GROUP_CANCELLED
                self._outbox.append((member.run, GROUP_CANCELLED))

    def _settle(self) -> Decision:
        """Cascade, admit, and hand out what the supervisor has not been told yet."""
        self._cascade()
        resumed = self._resume()
        plan = self._plan()
        for member in plan.start:
            self._transition(member, ACTIVE, spent=member.spent, reason=None)
            self._unconfirmed[member.run] = None
        cancel, self._outbox = self._outbox, []
        return Decision(
            start=resumed + [member.run for member in plan.start],
            cancel=cancel,
            status=self._status(self._plan()),
        )

    def _resume(self) -> list[str]:
        """Give free maxActive slots to keep-alive runs a message came to, oldest request first.

        Such a run kept its reservation while it waited, so it needs no room under the cost cap:
        only a slot. It goes before every queued run: a conversation that started goes on
        before new work begins. It is handed out in ``Decision.start`` like an admitted run.
        """
        resumed: list[str] = []
        if self._cancelled:
            return resumed  # a cancelled group's started runs are told to cancel instead
        for run in list(self._resumes):
            if self._ledger.busy() >= self._limits.max_active:
                break
            member = self._members[run]
            self._transition(member, ACTIVE, spent=member.spent, reason=None)
            self._unconfirmed[run] = None
            resumed.append(run)
        return resumed

    def _plan(self) -> _Plan:
        """Which queued runs would start now (see `_Ledger.plan`); changes nothing."""
        return self._ledger.plan(
            self._limits, cancelled=self._cancelled, by_index=self._by_index, budget_left=self.budget_left
        )

    def _status(self, plan: _Plan) -> GroupStatus:
        """The group's status after ``plan`` (see :mod:`.status`)."""
        return _group_status(
            plan,
            self._ledger,
            self._limits,
            sealed=self._sealed,
            cancelled=self._cancelled,
            total=len(self._members),
        )
