"""The sums admission keeps up to date, and the admission pass that reads them.

Counts per state, the group's spend, the started runs' reservations, and the queue of eligible
runs (every dependency succeeded) with what each would reserve. They change on every member
transition (:meth:`_Ledger.enter` / :meth:`_Ledger.leave`), so that a decision costs about the
runs it starts, not the size of the group (a group holds up to maxPending unfinished runs).

The reservation rule: a started run reserves its remaining allowance ``max(cap - spent, 0)``,
so spent + reserved never passes the group cap whatever the runs do.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from nodus_ray.core.admission.model import (
    _IDLE_REASONS,
    ACTIVE,
    CANCELLED,
    DEPENDENCY_FAILED,
    DEPENDENCY_WAIT,
    MAX_ACTIVE_REACHED,
    MAX_COST_REACHED,
    QUEUED,
    WAITING,
    GroupLimits,
    Member,
)

__all__ = ["BUDGET_EXCEEDED", "_Ledger", "_Plan"]

BUDGET_EXCEEDED = "BudgetExceeded"  # nodus.lifecycle.BlockedReason.BUDGET_EXCEEDED


@dataclass
class _Plan:
    """One admission pass, computed without changing anything."""

    start: list[Member]
    blocked: dict[str, int]  # DependencyWait | MaxActiveReached | MaxCostReached -> queued runs
    busy: int  # started, unfinished runs after the planned starts
    stuck: Member | None  # the first run that waits only for room under the cost cap


class _Ledger:
    """Counts, spend, reservations and the eligible queue of one group's members.

    Members are referred to by their creation index (the queue is kept sorted by it: creation
    order is admission order). Every change of a member's state or spend must ``leave`` before
    and ``enter`` after, or the sums go wrong.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()  # members per state
        self.waiting: Counter[str] = Counter()  # Waiting members per their own reason (NeedsResolution...)
        self.dependency_failed = 0  # Cancelled with DependencyFailed (these fail the group)
        self.spent = Decimal(0)
        self.reserved = Decimal(0)
        self.eligible: list[int] = []  # sorted creation indexes of queued runs with none unmet
        self.needs: Counter[Decimal] = Counter()  # what each eligible run would reserve

    def enter(self, member: Member) -> None:
        self.counts[member.state] += 1
        if member.state == WAITING and member.reason:
            self.waiting[member.reason] += 1
        self.spent += member.spent
        self.reserved += member.reservation
        if member.state == CANCELLED and member.reason == DEPENDENCY_FAILED:
            self.dependency_failed += 1

    def leave(self, member: Member) -> None:
        self.counts[member.state] -= 1
        if member.state == WAITING and member.reason:
            self.waiting[member.reason] -= 1
            if not self.waiting[member.reason]:
                del self.waiting[member.reason]
        self.spent -= member.spent
        self.reserved -= member.reservation
        if member.state == CANCELLED and member.reason == DEPENDENCY_FAILED:
            self.dependency_failed -= 1

    @staticmethod
    def need(member: Member) -> Decimal:
        """What a queued run would reserve if it started now."""
        return max(member.cap - member.spent, Decimal(0))

    def make_eligible(self, index: int, member: Member) -> None:
        bisect.insort(self.eligible, index)
        self.needs[self.need(member)] += 1

    def make_ineligible(self, index: int, member: Member) -> None:
        position = bisect.bisect_left(self.eligible, index)
        if position < len(self.eligible) and self.eligible[position] == index:
            del self.eligible[position]
            need = self.need(member)
            self.needs[need] -= 1
            if not self.needs[need]:
                del self.needs[need]

    def unfinished(self) -> int:
        return self.counts[QUEUED] + self.counts[ACTIVE] + self.counts[WAITING]

    def idle(self) -> int:
        """Started runs that hold no maxActive slot: keep-alive runs waiting for a message, or
        for a free slot to read the one that came (see ``model._IDLE_REASONS``)."""
        return sum(self.waiting[reason] for reason in _IDLE_REASONS)

    def busy(self) -> int:
        """Started, unfinished runs that hold a maxActive slot."""
        return self.counts[ACTIVE] + self.counts[WAITING] - self.idle()

    def plan(
        self,
        limits: GroupLimits,
        *,
        cancelled: bool,
        by_index: Sequence[Member],
        budget_left: Decimal | None = None,
    ) -> _Plan:
        """Which queued runs would start now, and how many of the others wait for each reason.

        Eligible runs (every dependency succeeded) are taken in creation order, first fit. The
        pass stops as soon as nothing more can start: maxActive is reached (every later run
        waits for it), or what is left of the cap is below the smallest need of any eligible
        run (every later run waits for room). So a pass looks at the runs it starts plus about
        one more, however many are queued.

        ``budget_left`` is what the project's Budget can still hold (None: the project has no
        Budget). Less what this group's started runs may still spend, it must hold the next
        run's cap (and be above zero), or nothing more starts: every eligible run waits with
        ``BudgetExceeded`` (the Budget is the project's, so the first refusal stops the pass).
        """
        busy = self.busy()
        room: Decimal | None = None
        if limits.max_cost is not None:
            room = limits.max_cost - self.spent - self.reserved
        budget_room = None if budget_left is None else budget_left - self.reserved
        start: list[Member] = []
        cost_blocked = 0
        budget_blocked = 0
        stuck: Member | None = None
        examined = 0
        smallest = min(self.needs) if self.needs else None
        if not cancelled:  # a cancelled group has no queued runs and starts nothing
            for index in self.eligible:
                if busy >= limits.max_active:
                    break
                member = by_index[index]
                if room is not None and smallest is not None and room < smallest:
                    cost_blocked += len(self.eligible) - examined
                    stuck = stuck or member
                    examined = len(self.eligible)
                    break
                examined += 1
                need = self.need(member)
                if room is not None and need > room:
                    cost_blocked += 1
                    stuck = stuck or member
                    continue
                if budget_room is not None and (budget_room <= 0 or need > budget_room):
                    budget_blocked += len(self.eligible) - examined + 1  # this run and every later one
                    examined = len(self.eligible)
                    break
                start.append(member)
                busy += 1
                if room is not None:
                    room -= need
                if budget_room is not None:
                    budget_room -= need
        blocked = {
            DEPENDENCY_WAIT: self.counts[QUEUED] - len(self.eligible),
            MAX_ACTIVE_REACHED: len(self.eligible) - examined if not cancelled else 0,
            MAX_COST_REACHED: cost_blocked,
        }
        if budget_left is not None:  # the key is there only in a project with a Budget
            blocked[BUDGET_EXCEEDED] = budget_blocked
        return _Plan(start=start, blocked=blocked, busy=busy, stuck=stuck)
