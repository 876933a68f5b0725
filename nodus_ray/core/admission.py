"""AgentGroup admission: which queued runs start now, which are cancelled, and the group's status.

This is the decision core of a group. A "group supervisor" actor wraps it, performs the
decisions (starts and cancels runs) and reports back what the runs do. The module is pure
Python: no Ray, no I/O, no clock, no randomness. Everything it decides follows from the
limits, the sealed/cancelled flags and the members' states, so after a restart
`Admission.rebuild` reconstructs the same object from the runs' recorded phases; the
supervisor persists nothing itself.

The rules (the Agents guide, "Run agents in parallel"):

* A queued run starts when, in this order: every run it depends on has succeeded; fewer than
  ``limits.max_active`` runs are started and unfinished (Active or Waiting: a run waiting for a
  message or for credits keeps its slot); and its own cap fits under what is left of the group
  cap (cap minus everything spent minus the reservations of the started, unfinished runs).
  A started run reserves its remaining allowance ``max(cap - spent, 0)``; since a run's spend
  never passes its cap, spent + reserved never passes the group cap, whatever the runs do.
* Eligible runs are taken in creation order. A run whose cap does not fit is skipped and a later,
  smaller one may start (first fit): with one agent per group all caps are equal, so this is plain
  FIFO; with mixed caps (an agent edited between creations, or BYOK runs at cap 0) it keeps the
  group busy instead of idling behind one large run. The price is that a large run can keep
  waiting while smaller ones spend what is left; the status message says when it is stuck.
* A failed dependency cancels its queued dependents with ``DependencyFailed``, a cancelled one
  with ``DependencyCancelled``; the cascade is transitive (the dependent of a cancelled dependent
  is ``DependencyCancelled``). When one run has both, ``DependencyFailed`` wins.
* The group is Running until it is sealed and every run is terminal, then Succeeded, or Failed
  with ``RunsFailed`` when a run failed or was cancelled because a dependency failed. A run
  cancelled by its user (or ``DependencyCancelled`` because of one) does not fail the group.
  After a group cancel the phase is Cancelling until every run is terminal, then Cancelled.

Delivery of decisions: every call that returns a `Decision` hands out the starts and cancels
made since the previous Decision, exactly once. Admission marks a run Active the moment it puts
it in ``Decision.start`` (and reserves its cap then), so no later decision can start it again
and its cap is never reserved twice. `Admission.started` acknowledges the start; runs admitted
and not yet acknowledged are in `Admission.unconfirmed` for a supervisor that must retry. After a
restart a run whose start never happened reads back as Queued and is admitted again, so starting
a run must be idempotent by run name.
"""

from __future__ import annotations

import bisect
import heapq
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

__all__ = ["GroupLimits", "Member", "Admission", "Decision", "AdmissionError", "GroupStatus"]

QUEUED = "Queued"
ACTIVE = "Active"
WAITING = "Waiting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
CANCELLED = "Cancelled"

_STATES = frozenset({QUEUED, ACTIVE, WAITING, SUCCEEDED, FAILED, CANCELLED})
_STARTED = frozenset({ACTIVE, WAITING})
_TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})

DEPENDENCY_WAIT = "DependencyWait"
GROUP_WAIT = "GroupWait"
MAX_ACTIVE_REACHED = "MaxActiveReached"
MAX_COST_REACHED = "MaxCostReached"
DEPENDENCY_FAILED = "DependencyFailed"
DEPENDENCY_CANCELLED = "DependencyCancelled"
GROUP_CANCELLED = "GroupCancelled"
RUNS_FAILED = "RunsFailed"

MAX_ACTIVE_MIN, MAX_ACTIVE_MAX = 1, 1000

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


# -- errors ------------------------------------------------------------------------------------


class AdmissionError(Exception):
    """A refused request. Nothing was changed.

    ``code`` is the API error class (``"Invalid"``: the request itself is wrong, 422;
    ``"Conflict"``: the group's state refuses it, 409). ``reason`` is the product's word for the
    problem (``GroupSealed``, ``MaxPendingReached``, ``CapLowered``, ``DuplicateTaskKey``,
    ``UnknownDependency``, ``DependencyCycle``, ...), ``field`` the offending field and ``index``
    the position of the offending run in a batch passed to `Admission.add`.
    """

    def __init__(
        self, code: str, reason: str, message: str, *, field: str | None = None, index: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.field = field
        self.index = index

    @property
    def details(self) -> dict[str, Any]:
        """The API error's ``details``: the reason, and the field and batch index when known."""
        details: dict[str, Any] = {"reason": self.reason}
        if self.field is not None:
            details["field"] = self.field
        if self.index is not None:
            details["index"] = self.index
        return details

    def __reduce__(self) -> tuple[Any, ...]:
        # The default pickling passes only args (the message) back to __init__; the refusal has to
        # cross from the group supervisor actor to the API intact.
        return (_rebuild_error, (self.code, self.reason, self.message, self.field, self.index))

    def __str__(self) -> str:
        return self.message


def _rebuild_error(
    code: str, reason: str, message: str, field: str | None, index: int | None
) -> AdmissionError:
    return AdmissionError(code, reason, message, field=field, index=index)


def _invalid(reason: str, message: str, field: str | None = None, index: int | None = None) -> AdmissionError:
    return AdmissionError("Invalid", reason, message, field=field, index=index)


def _conflict(
    reason: str, message: str, field: str | None = None, index: int | None = None
) -> AdmissionError:
    return AdmissionError("Conflict", reason, message, field=field, index=index)


def _usd(amount: Decimal) -> str:
    """Money as the API writes it: a plain decimal string, never exponent notation."""
    return format(amount, "f")


def _check_money(value: object, field: str, what: str, index: int | None = None) -> Decimal:
    # Money is Decimal end to end: a float here would already have lost cents.
    if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
        raise _invalid("InvalidAmount", f"{what} must be a non-negative Decimal, not {value!r}", field, index)
    return value


def _check_int(value: object, low: int, high: int | None, field: str, what: str) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"{low} to {high}" if high is not None else f"at least {low}"
        raise _invalid("OutOfRange", f"{what} must be a whole number {bounds}, not {value!r}", field)
    return value


# -- data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupLimits:
    """The group's limits: ``spec.limits.maxActive``, ``spec.limits.maxPending``, ``spec.maxCostUSD``.

    ``max_cost`` None means the group has no cost cap (each run still has its own).
    """

    max_active: int = 10
    max_pending: int = 10000
    max_cost: Decimal | None = None

    def __post_init__(self) -> None:
        _check_int(self.max_active, MAX_ACTIVE_MIN, MAX_ACTIVE_MAX, "spec.limits.maxActive", "maxActive")
        _check_int(self.max_pending, 1, None, "spec.limits.maxPending", "maxPending")
        if self.max_cost is not None:
            _check_money(self.max_cost, "spec.maxCostUSD", "maxCostUSD")


@dataclass
class Member:
    """One run of the group as admission sees it.

    ``cap`` is the run's own cap (the agent's perRunMaxCostUSD, copied when the run was created);
    ``Decimal(0)`` for a BYOK run, which Nodus does not charge and which therefore reserves
    nothing. ``state`` is Queued (admission's), Active or Waiting (started, unfinished) or a
    terminal state; ``reason`` says why (GroupWait/DependencyWait while queued, the cancel
    reason once cancelled). ``spent`` is the run's model spend so far.
    """

    key: str
    run: str
    cap: Decimal
    depends_on: tuple[str, ...] = ()
    state: str = QUEUED
    reason: str | None = None
    spent: Decimal = Decimal(0)

    @property
    def reservation(self) -> Decimal:
        """What a started, unfinished run may still spend: its cap minus its spend (never below 0)."""
        return max(self.cap - self.spent, Decimal(0)) if self.state in _STARTED else Decimal(0)


@dataclass(frozen=True)
class GroupStatus:
    """The group's ``status``: phase, counts, why queued runs wait (how many for each reason),
    and the cost. Each queued run's own reason is `Admission.queued_reasons`."""

    phase: str
    reason: str | None
    message: str | None
    counts: dict[str, int]
    blocked_reasons: dict[str, int]
    cost_total: Decimal
    cost_limit: Decimal | None
    reserved: Decimal

    def to_dict(self) -> dict[str, Any]:
        """The API's camelCase shape, money as strings (JSON numbers would be floats)."""
        return {
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "counts": dict(self.counts),
            "blockedReasons": dict(self.blocked_reasons),
            "cost": {
                "totalUSD": _usd(self.cost_total),
                "limitUSD": None if self.cost_limit is None else _usd(self.cost_limit),
                "reservedUSD": _usd(self.reserved),
            },
        }


@dataclass(frozen=True)
class Decision:
    """What the supervisor must do now, and the group's status after it.

    ``start``: run names to start, in admission (creation) order; each is already Active and its
    cap reserved. ``cancel``: ``(run name, reason)`` with reason DependencyFailed,
    DependencyCancelled or GroupCancelled. A queued run in ``cancel`` is already Cancelled here
    (the supervisor writes its phase); a started one stays Active/Waiting until it reports a
    terminal state.
    """

    start: list[str]
    cancel: list[tuple[str, str]]
    status: GroupStatus


@dataclass
class _Plan:
    """One admission pass, computed without changing anything."""

    start: list[Member]
    blocked: dict[str, int]  # DependencyWait | MaxActiveReached | MaxCostReached -> queued runs
    busy: int  # started, unfinished runs after the planned starts
    stuck: Member | None  # the first run that waits only for room under the cost cap


# -- admission ---------------------------------------------------------------------------------


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
        self._eligible: list[int] = []  # sorted creation indexes of queued runs with none unmet
        self._needs: Counter[Decimal] = Counter()  # what each eligible run would reserve
        self._recheck: list[int] = []  # heap: queued runs a failed or cancelled dependency may cancel
        self._counts: Counter[str] = Counter()  # members per state
        self._dependency_failed = 0  # Cancelled with DependencyFailed (these fail the group)
        self._spent = Decimal(0)
        self._reserved = Decimal(0)
        self._reason_changes: dict[str, str] = {}  # queued run -> its new reason, since last taken

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
        copies = [admission._copy(member, index, rebuilding=True) for index, member in enumerate(members)]
        keys: dict[str, int] = {}
        runs: set[str] = set()
        for index, member in enumerate(copies):
            if member.key in keys:
                raise _invalid(
                    "DuplicateTaskKey", f"task key {member.key!r} appears twice", "spec.taskKey", index
                )
            if member.run in runs:
                raise _invalid(
                    "DuplicateRunName", f"run {member.run!r} appears twice", "metadata.name", index
                )
            keys[member.key] = index
            runs.add(member.run)
        for index, member in enumerate(copies):
            for position, dependency in enumerate(member.depends_on):
                if dependency not in keys:
                    raise _invalid(
                        "UnknownDependency",
                        f"run {member.run!r} depends on task key {dependency!r}, which is not in the group",
                        f"spec.dependsOn[{position}]",
                        index,
                    )
        _refuse_cycles(copies)
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
        batch = [self._copy(member, index, rebuilding=False) for index, member in enumerate(members)]
        unfinished = sum(1 for member in self._members.values() if member.state not in _TERMINAL)
        if unfinished + len(batch) > self._limits.max_pending:
            raise _conflict(
                "MaxPendingReached",
                f"the group has {unfinished} unfinished runs and takes at most maxPending "
                f"{self._limits.max_pending}; {len(batch)} more do not fit",
                "spec.limits.maxPending",
            )
        self._validate_batch(batch)
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

    def _copy(self, member: Member, index: int, *, rebuilding: bool) -> Member:
        """A checked private copy, so a caller's later edits cannot bypass the rules."""
        if not isinstance(member, Member):
            raise _invalid("InvalidMember", f"expected a Member, not {type(member).__name__}", None, index)
        if not isinstance(member.key, str) or not _DNS_LABEL.match(member.key):
            raise _invalid(
                "InvalidTaskKey",
                f"task key {member.key!r} is not a DNS label (lower-case letters, digits and '-', "
                "starting and ending with a letter or digit, at most 63 characters)",
                "spec.taskKey",
                index,
            )
        if not isinstance(member.run, str) or not member.run:
            raise _invalid("InvalidRunName", f"run name {member.run!r} is not a name", "metadata.name", index)
        _check_money(member.cap, "spec.perRunMaxCostUSD", "a run's cap", index)
        _check_money(member.spent, "status.cost.totalUSD", "a run's spend", index)
        if isinstance(member.depends_on, str) or not isinstance(member.depends_on, Iterable):
            raise _invalid(
                "InvalidDependsOn", "dependsOn must be a list of task keys", "spec.dependsOn", index
            )
        depends_on = tuple(member.depends_on)
        for position, dependency in enumerate(depends_on):
            if not isinstance(dependency, str):
                raise _invalid(
                    "InvalidDependsOn",
                    f"dependsOn entries are task keys, not {dependency!r}",
                    f"spec.dependsOn[{position}]",
                    index,
                )
        if rebuilding:
            if member.state not in _STATES:
                raise _invalid("InvalidState", f"unknown state {member.state!r}", "status.phase", index)
            state, reason, spent = member.state, member.reason, member.spent
        else:
            if member.state != QUEUED or member.spent != 0:
                raise _invalid(
                    "InvalidState",
                    f"a new run starts Queued with nothing spent, not {member.state} with ${_usd(member.spent)}",
                    "status.phase",
                    index,
                )
            state, reason, spent = QUEUED, None, Decimal(0)
        # Repeats in dependsOn mean the same thing once; keep the first occurrence's order.
        return Member(
            key=member.key,
            run=member.run,
            cap=member.cap,
            depends_on=tuple(dict.fromkeys(depends_on)),
            state=state,
            reason=reason,
            spent=spent,
        )

    def _validate_batch(self, batch: list[Member]) -> None:
        keys_in_batch: dict[str, int] = {}
        runs_in_batch: set[str] = set()
        for index, member in enumerate(batch):
            if member.key in self._by_key:
                raise _conflict(
                    "DuplicateTaskKey",
                    f"task key {member.key!r} is already in the group",
                    "spec.taskKey",
                    index,
                )
            if member.key in keys_in_batch:
                raise _invalid(
                    "DuplicateTaskKey",
                    f"task key {member.key!r} appears twice in the batch (runs {keys_in_batch[member.key]} and {index})",
                    "spec.taskKey",
                    index,
                )
            if member.run in self._members or member.run in runs_in_batch:
                raise _conflict(
                    "DuplicateRunName", f"run {member.run!r} already exists", "metadata.name", index
                )
            keys_in_batch[member.key] = index
            runs_in_batch.add(member.run)
        _refuse_cycles(batch)
        for index, member in enumerate(batch):
            for position, dependency in enumerate(member.depends_on):
                if dependency in self._by_key:
                    continue
                later = keys_in_batch.get(dependency)
                if later is not None and later < index:
                    continue
                where = (
                    f"comes later in the batch (run {later}); list it before the runs that depend on it"
                    if later is not None
                    else "is not in the group; create the runs it depends on first"
                )
                raise _invalid(
                    "UnknownDependency",
                    f"run {member.run!r} depends on task key {dependency!r}, which {where}",
                    f"spec.dependsOn[{position}]",
                    index,
                )

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
        self._enter(member)
        if member.state != QUEUED:
            return
        states = [self._by_key[dependency].state for dependency in member.depends_on]
        unmet = sum(1 for state in states if state != SUCCEEDED)
        self._unmet[member.run] = unmet
        if FAILED in states or CANCELLED in states:
            heapq.heappush(self._recheck, index)
        if unmet == 0:
            self._make_eligible(member)
        self._set_queued_reason(member, GROUP_WAIT if unmet == 0 else DEPENDENCY_WAIT)

    def _enter(self, member: Member) -> None:
        self._counts[member.state] += 1
        self._spent += member.spent
        self._reserved += member.reservation
        if member.state == CANCELLED and member.reason == DEPENDENCY_FAILED:
            self._dependency_failed += 1

    def _leave(self, member: Member) -> None:
        self._counts[member.state] -= 1
        self._spent -= member.spent
        self._reserved -= member.reservation
        if member.state == CANCELLED and member.reason == DEPENDENCY_FAILED:
            self._dependency_failed -= 1

    @staticmethod
    def _need(member: Member) -> Decimal:
        """What a queued run would reserve if it started now."""
        return max(member.cap - member.spent, Decimal(0))

    def _make_eligible(self, member: Member) -> None:
        bisect.insort(self._eligible, self._index[member.run])
        self._needs[self._need(member)] += 1

    def _make_ineligible(self, member: Member) -> None:
        index = self._index[member.run]
        position = bisect.bisect_left(self._eligible, index)
        if position < len(self._eligible) and self._eligible[position] == index:
            del self._eligible[position]
            need = self._need(member)
            self._needs[need] -= 1
            if not self._needs[need]:
                del self._needs[need]

    def _set_queued_reason(self, member: Member, reason: str) -> None:
        if member.reason != reason:
            member.reason = reason
            self._reason_changes[member.run] = reason

    def _transition(self, member: Member, state: str, *, spent: Decimal, reason: str | None) -> None:
        """Every change of a member's state or spend goes through here, to keep the counts true."""
        was = member.state
        if was == QUEUED:
            if self._unmet.pop(member.run, 0) == 0:
                self._make_ineligible(member)  # before the spend changes: its need is keyed by it
        self._leave(member)
        member.state, member.spent, member.reason = state, spent, reason
        self._enter(member)
        if state == was:
            return
        if state == SUCCEEDED:
            for run in self._dependents[member.key]:
                dependent = self._members[run]
                if dependent.state == QUEUED:
                    self._unmet[run] -= 1
                    if self._unmet[run] == 0:
                        self._make_eligible(dependent)
                        self._set_queued_reason(dependent, GROUP_WAIT)
        elif state in (FAILED, CANCELLED):
            for run in self._dependents[member.key]:
                if self._members[run].state == QUEUED:
                    heapq.heappush(self._recheck, self._index[run])

    def _dependencies(self, member: Member) -> list[Member]:
        return [self._by_key[key] for key in member.depends_on]

    def _unfinished(self) -> int:
        return self._counts[QUEUED] + self._counts[ACTIVE] + self._counts[WAITING]

    def _finished(self) -> bool:
        return self._sealed and self._unfinished() == 0

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

    def _plan(self) -> _Plan:
        """Which queued runs would start now, and how many of the others wait for each reason.

        Eligible runs (every dependency succeeded) are taken in creation order, first fit. The
        pass stops as soon as nothing more can start: maxActive is reached (every later run
        waits for it), or what is left of the cap is below the smallest need of any eligible
        run (every later run waits for room). So a pass looks at the runs it starts plus about
        one more, however many are queued.
        """
        busy = self._counts[ACTIVE] + self._counts[WAITING]
        room: Decimal | None = None
        if self._limits.max_cost is not None:
            room = self._limits.max_cost - self._spent - self._reserved
        start: list[Member] = []
        cost_blocked = 0
        stuck: Member | None = None
        examined = 0
        smallest = min(self._needs) if self._needs else None
        if not self._cancelled:  # a cancelled group has no queued runs and starts nothing
            for index in self._eligible:
                if busy >= self._limits.max_active:
                    break
                member = self._by_index[index]
                if room is not None and smallest is not None and room < smallest:
                    cost_blocked += len(self._eligible) - examined
                    stuck = stuck or member
                    examined = len(self._eligible)
                    break
                examined += 1
                need = self._need(member)
                if room is not None and need > room:
                    cost_blocked += 1
                    stuck = stuck or member
                    continue
                start.append(member)
                busy += 1
                if room is not None:
                    room -= need
        blocked = {
            DEPENDENCY_WAIT: self._counts[QUEUED] - len(self._eligible),
            MAX_ACTIVE_REACHED: len(self._eligible) - examined if not self._cancelled else 0,
            MAX_COST_REACHED: cost_blocked,
        }
        return _Plan(start=start, blocked=blocked, busy=busy, stuck=stuck)

    def _settle(self) -> Decision:
        """Cascade, admit, and hand out what the supervisor has not been told yet."""
        self._cascade()
        plan = self._plan()
        for member in plan.start:
            self._transition(member, ACTIVE, spent=member.spent, reason=None)
            self._unconfirmed[member.run] = None
        cancel, self._outbox = self._outbox, []
        return Decision(
            start=[member.run for member in plan.start], cancel=cancel, status=self._status(self._plan())
        )

    def _status(self, plan: _Plan) -> GroupStatus:
        counts = {
            state.lower(): self._counts[state]
            for state in (QUEUED, ACTIVE, WAITING, SUCCEEDED, FAILED, CANCELLED)
        }
        total = len(self._members)
        counts["total"] = total
        unfinished = self._unfinished()
        failed = counts["failed"]
        dependency_failed = self._dependency_failed

        reason: str | None = None
        message: str | None = None
        if self._cancelled:
            if unfinished:
                phase = "Cancelling"
                message = f"waiting for {unfinished} unfinished run{_s(unfinished)} to stop"
            else:
                phase = "Cancelled"
                message = f"cancelled; {counts['succeeded']} of {total} runs had succeeded"
        elif self._sealed and not unfinished:
            if failed or dependency_failed:
                phase, reason = "Failed", RUNS_FAILED
                parts = []
                if failed:
                    parts.append(f"{failed} run{_s(failed)} failed")
                if dependency_failed:
                    parts.append(
                        f"{dependency_failed} run{_s(dependency_failed)} "
                        f"{'was' if dependency_failed == 1 else 'were'} cancelled because a dependency failed"
                    )
                message = " and ".join(parts)
            else:
                phase = "Succeeded"
                message = (
                    f"{counts['succeeded']} of {total} runs succeeded" if total else "sealed with no runs"
                )
        else:
            phase = "Running"
            message = self._running_message(plan, total, unfinished)
        return GroupStatus(
            phase=phase,
            reason=reason,
            message=message,
            counts=counts,
            blocked_reasons=dict(plan.blocked),
            # A running sum that came back to zero reads "0.00"; the API says "0".
            cost_total=self._spent or Decimal(0),
            cost_limit=self._limits.max_cost,
            reserved=self._reserved or Decimal(0),
        )

    def _running_message(self, plan: _Plan, total: int, unfinished: int) -> str | None:
        limit = self._limits.max_cost
        if plan.busy == 0 and limit is not None and plan.stuck is not None:
            # Nothing runs and nothing can start: only a larger cap (or smaller run caps) helps.
            stuck = plan.stuck
            if limit < stuck.cap:
                return (
                    f"maxCostUSD ${_usd(limit)} is below a run's cap ${_usd(stuck.cap)}: "
                    "raise the cap or lower perRunMaxCostUSD"
                )
            return (
                f"the group has spent ${_usd(self._spent)} of its maxCostUSD ${_usd(limit)}; the "
                f"${_usd(limit - self._spent)} left is below a run's cap ${_usd(stuck.cap)}: raise the cap"
            )
        if not self._sealed and total and not unfinished:
            return "every run has finished; the group finishes once it is sealed"
        return None


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def _refuse_cycles(members: list[Member]) -> None:
    """Raise `AdmissionError` naming the first dependency cycle among ``members``, if any."""
    cycle = _find_cycle(members)
    if cycle is not None:
        index, position, path = cycle
        raise _invalid(
            "DependencyCycle",
            f"dependency cycle: {' -> '.join(path)}",
            f"spec.dependsOn[{position}]",
            index,
        )


def _find_cycle(members: list[Member]) -> tuple[int, int, list[str]] | None:
    """The first dependency cycle among ``members`` (edges to keys outside them are ignored).

    Returns (index of the member whose dependsOn closes the cycle, position in its dependsOn,
    the cycle's keys), found in a deterministic order.
    """
    index_of = {member.key: index for index, member in enumerate(members)}
    colour = [0] * len(members)  # 0 unseen, 1 on the current path, 2 done
    for root in range(len(members)):
        if colour[root]:
            continue
        path: list[int] = [root]
        edges: list[int] = [0]
        colour[root] = 1
        while path:
            node = path[-1]
            depends_on = members[node].depends_on
            if edges[-1] >= len(depends_on):
                colour[node] = 2
                path.pop()
                edges.pop()
                continue
            position = edges[-1]
            edges[-1] += 1
            target = index_of.get(depends_on[position])
            if target is None or colour[target] == 2:
                continue
            if colour[target] == 1:
                loop = path[path.index(target) :]
                return node, position, [members[i].key for i in loop] + [members[target].key]
            colour[target] = 1
            path.append(target)
            edges.append(0)
    return None


def _stable_topological(members: list[Member]) -> list[Member]:
    """``members`` with every dependency before its dependents, otherwise in the given order.

    Kahn's algorithm taking the earliest ready member first, so an already valid order is
    returned unchanged. Cycles are refused before this is called.
    """
    index_of = {member.key: index for index, member in enumerate(members)}
    waiting_on = [len(member.depends_on) for member in members]
    dependents: list[list[int]] = [[] for _ in members]
    for index, member in enumerate(members):
        for dependency in member.depends_on:
            dependents[index_of[dependency]].append(index)
    ready = [index for index, count in enumerate(waiting_on) if count == 0]
    heapq.heapify(ready)
    ordered: list[Member] = []
    while ready:
        index = heapq.heappop(ready)
        ordered.append(members[index])
        for dependent in dependents[index]:
            waiting_on[dependent] -= 1
            if waiting_on[dependent] == 0:
                heapq.heappush(ready, dependent)
    return ordered
