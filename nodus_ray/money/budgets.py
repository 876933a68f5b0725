"""The project Budget's ledger: what a project spent in the current period, what is held, what is left.

Spending is derived, not counted, as for credits (`money.credits`): a project's spend is the sum
of its runs' billed totals (``status.cost.billedUSD``, model + sandbox, which each run recomputes
from its journal), its groups' grading (``status.cost.gradingUSD``), and what deleted runs and
groups had spent. Only what cannot be derived is stored (``budget-spend.json``): the spend of
deleted runs and groups, and for a ``month`` or ``day`` Budget the period's baseline: each run's
and group's billed total when the period began. The spend in the period is what each one billed
above its baseline, plus what runs deleted in the period had billed above theirs.

The baseline of a new period is written before any reservation of that period is granted, so a
restart cannot forget it. A charge made late from an older period's reservation lands above the
new baseline and counts in the new period: conservative, never under-counted.

Never exceeded: before a run's next model call or command, it reserves the step's largest price;
the reservation is granted only when spent + reserved + amount <= maxCostUSD. One reservation per
run (a new one replaces the run's previous); what the run billed since it reserved consumes its
reservation, and a run with no actor (finished, parked, queued) holds nothing. Reservations live
in memory: after a control-plane restart each run reserves again before its next step.
"""

from __future__ import annotations

import calendar
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import format_timestamp

__all__ = ["Spender", "ProjectSpend", "BudgetLedger", "period_bounds"]

_ZERO = Decimal(0)


@dataclass(frozen=True)
class Spender:
    """A run as the ledger sees it: its billed total, and whether it has (or gets) an actor."""

    billed: Decimal
    active: bool


RunsOf = Callable[[str], Mapping[str, Spender]]  # project -> its runs
GroupsOf = Callable[[str], Mapping[str, Decimal]]  # project -> its groups' grading spend


def period_bounds(period: str, now: datetime) -> tuple[datetime | None, datetime | None]:
    """The UTC calendar period holding ``now``: ``(start, end)``; ``(None, None)`` for ``total``."""
    if period == "day":
        start = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    if period == "month":
        start = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        days = calendar.monthrange(start.year, start.month)[1]
        return start, start + timedelta(days=days)
    return None, None


@dataclass
class ProjectSpend:
    """What is stored of a project's spend, and its reservations (memory only)."""

    deleted: Decimal = _ZERO  # every deleted run's and group's billed total, ever
    period: str = "total"  # the period the baseline is for
    start: str | None = None  # its start (RFC 3339), None for total
    run_base: dict[str, Decimal] = field(default_factory=dict)
    group_base: dict[str, Decimal] = field(default_factory=dict)
    deleted_in_period: Decimal = _ZERO  # deleted in this period, above their baselines
    # run -> (the amount, what the run had billed when it reserved)
    reservations: dict[str, tuple[Decimal, Decimal]] = field(default_factory=dict)
    # Holds for work that is not a run's step (an evaluation case's grading): held until released.
    holds: dict[str, Decimal] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "deletedUSD": str(self.deleted),
            "period": {
                "kind": self.period,
                "start": self.start,
                "runs": {name: str(value) for name, value in self.run_base.items()},
                "groups": {name: str(value) for name, value in self.group_base.items()},
                "deletedUSD": str(self.deleted_in_period),
            },
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> ProjectSpend:
        period = stored.get("period") or {}
        return cls(
            deleted=Decimal(str(stored.get("deletedUSD") or "0")),
            period=str(period.get("kind") or "total"),
            start=period.get("start"),
            run_base={k: Decimal(str(v)) for k, v in (period.get("runs") or {}).items()},
            group_base={k: Decimal(str(v)) for k, v in (period.get("groups") or {}).items()},
            deleted_in_period=Decimal(str(period.get("deletedUSD") or "0")),
        )


class BudgetLedger:
    """Each project's Budget (the stored resource), spend and reservations.

    ``runs_of`` and ``groups_of`` read the control plane's registry (the runs' and groups' status
    as last written); ``now`` is the clock (a test's fake). Every change and its save happen under
    one lock: reservations come from many runs at once, deletes from several threads.
    """

    def __init__(
        self,
        storage: Storage,
        runs_of: RunsOf,
        groups_of: GroupsOf,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._storage = storage
        self._runs_of = runs_of
        self._groups_of = groups_of
        self._now = now
        self._budgets: dict[str, dict[str, Any]] = {}  # project -> the Budget resource
        self._spend: dict[str, ProjectSpend] = {}
        self._lock = threading.RLock()

    # -- loading and storing ------------------------------------------------------------------

    def load(self) -> None:
        """Read every project's Budget back from storage (blocking: call it in a thread)."""
        with self._lock:
            self._budgets.clear()
            self._spend.clear()
            for project in self._storage.list_dir(layout.projects_folder()):
                for file in self._storage.list_dir(layout.budgets_folder(project)):
                    if not file.endswith(".json"):
                        continue
                    try:
                        self._budgets[project] = self._storage.read_json(
                            layout.budget(project, file.removesuffix(".json"))
                        )
                    except FileNotFoundError:
                        continue

    def _account(self, project: str) -> ProjectSpend:
        account = self._spend.get(project)
        if account is None:
            try:
                account = ProjectSpend.from_json(self._storage.read_json(layout.budget_spend(project)))
            except FileNotFoundError:
                account = ProjectSpend()
            self._spend[project] = account
        return account

    def _save(self, project: str, account: ProjectSpend) -> None:
        self._storage.write_json(layout.budget_spend(project), account.to_json())

    # -- the Budget resource ------------------------------------------------------------------

    def budget(self, project: str) -> dict[str, Any] | None:
        """The project's Budget resource as stored (without status), or None."""
        return self._budgets.get(project)

    def projects(self) -> list[str]:
        return list(self._budgets)

    def store_budget(self, project: str, document: dict[str, Any], check: Callable[[Decimal], None]) -> None:
        """Write the project's Budget; ``check(spent)`` (under the lock, with the spend in the
        period the Budget would have) may refuse it, and then nothing changes."""
        with self._lock:
            spec = document["spec"]
            account = self._account(project)
            previous = self._budgets.get(project)
            rolled = self._rolled(project, account, str(spec.get("period") or "total"))
            spent = self._spent(project, rolled)
            check(spent)
            if rolled is not account:
                self._save(project, rolled)
                self._spend[project] = rolled
            self._storage.write_json(layout.budget(project, document["metadata"]["name"]), document)
            if previous is not None and previous["metadata"]["name"] != document["metadata"]["name"]:
                self._storage.delete(layout.budget(project, previous["metadata"]["name"]))
            self._budgets[project] = document

    def delete_budget(self, project: str) -> dict[str, Any] | None:
        with self._lock:
            previous = self._budgets.pop(project, None)
            if previous is not None:
                self._storage.delete(layout.budget(project, previous["metadata"]["name"]))
            return previous

    # -- periods ------------------------------------------------------------------------------

    def _rolled(self, project: str, account: ProjectSpend, period: str) -> ProjectSpend:
        """The account for the period holding now: ``account`` itself when it is that period's,
        else a new one whose baseline is every run's and group's billed total now."""
        start, _ = period_bounds(period, self._now())
        start_text = format_timestamp(start) if start is not None else None
        if account.period == period and account.start == start_text:
            return account
        if period == "total":  # everything ever billed counts: no baseline
            return ProjectSpend(
                deleted=account.deleted, reservations=account.reservations, holds=account.holds
            )
        runs = self._runs_of(project)
        return ProjectSpend(
            deleted=account.deleted,
            period=period,
            start=start_text,
            run_base={name: run.billed for name, run in runs.items() if run.billed > 0},
            group_base={name: value for name, value in self._groups_of(project).items() if value > 0},
            reservations=account.reservations,  # still held: what they cover counts in this period
            holds=account.holds,
        )

    def roll_over(self, project: str) -> bool:
        """Begin the project's new period if it is due (the baseline written first); True if so."""
        with self._lock:
            budget = self._budgets.get(project)
            if budget is None:
                return False
            account = self._account(project)
            rolled = self._rolled(project, account, str(budget["spec"].get("period") or "total"))
            if rolled is account:
                return False
            self._save(project, rolled)
            self._spend[project] = rolled
            return True

    def period_end(self, project: str) -> datetime | None:
        budget = self._budgets.get(project)
        if budget is None:
            return None
        return period_bounds(str(budget["spec"].get("period") or "total"), self._now())[1]

    # -- spend --------------------------------------------------------------------------------

    def _spent(self, project: str, account: ProjectSpend) -> Decimal:
        runs = self._runs_of(project)
        groups = self._groups_of(project)
        if account.period == "total":
            return (
                account.deleted
                + sum((run.billed for run in runs.values()), _ZERO)
                + sum(groups.values(), _ZERO)
            )
        in_runs = sum(
            (max(_ZERO, run.billed - account.run_base.get(name, _ZERO)) for name, run in runs.items()), _ZERO
        )
        in_groups = sum(
            (max(_ZERO, value - account.group_base.get(name, _ZERO)) for name, value in groups.items()), _ZERO
        )
        return account.deleted_in_period + in_runs + in_groups

    def _reserved(self, project: str, account: ProjectSpend) -> Decimal:
        runs = self._runs_of(project)
        held = sum(account.holds.values(), _ZERO)
        for name, (amount, billed_then) in list(account.reservations.items()):
            run = runs.get(name)
            if run is None or not run.active:
                del account.reservations[name]  # no actor: it spends nothing more until it reserves
                continue
            held += max(_ZERO, amount - max(_ZERO, run.billed - billed_then))
        return held

    def view(self, project: str) -> dict[str, Any] | None:
        """The Budget's status now (rolling the period over first if it is due), or None."""
        with self._lock:
            self.roll_over(project)
            budget = self._budgets.get(project)
            if budget is None:
                return None
            account = self._account(project)
            limit = Decimal(str(budget["spec"]["maxCostUSD"]))
            spent, reserved = self._spent(project, account), self._reserved(project, account)
            start, end = period_bounds(str(budget["spec"].get("period") or "total"), self._now())
            return {
                "spentUSD": str(spent),
                "reservedUSD": str(reserved),
                "leftUSD": str(max(_ZERO, limit - spent - reserved)),
                "periodStart": format_timestamp(start) if start is not None else None,
                "periodEnd": format_timestamp(end) if end is not None else None,
            }

    def left(self, project: str) -> Decimal | None:
        """What the Budget can still hold (None: the project has no Budget)."""
        view = self.view(project)
        return None if view is None else Decimal(view["leftUSD"])

    def reserve(self, project: str, run: str, amount: Decimal) -> bool:
        """Hold ``amount`` for the run's next step if spent + reserved + amount fits the Budget."""
        with self._lock:
            budget = self._budgets.get(project)
            if budget is None:
                return True
            self.roll_over(project)  # the new period's baseline is stored before it grants anything
            account = self._account(project)
            account.reservations.pop(run, None)
            limit = Decimal(str(budget["spec"]["maxCostUSD"]))
            if self._spent(project, account) + self._reserved(project, account) + amount > limit:
                return False
            current = self._runs_of(project).get(run)
            account.reservations[run] = (amount, current.billed if current is not None else _ZERO)
            return True

    def hold(self, project: str, hold_id: str, amount: Decimal) -> bool:
        """Hold ``amount`` for work that is no run's step (a case's grading) until `release_hold`,
        if spent + reserved + amount fits the Budget (always, with no Budget)."""
        with self._lock:
            budget = self._budgets.get(project)
            if budget is None:
                return True
            self.roll_over(project)
            account = self._account(project)
            account.holds.pop(hold_id, None)
            limit = Decimal(str(budget["spec"]["maxCostUSD"]))
            if self._spent(project, account) + self._reserved(project, account) + amount > limit:
                return False
            account.holds[hold_id] = amount
            return True

    def release_hold(self, project: str, hold_id: str) -> None:
        """The held work's charge is recorded (where the spend is derived from): let go."""
        with self._lock:
            account = self._spend.get(project)
            if account is not None:
                account.holds.pop(hold_id, None)

    def release(self, project: str, run: str) -> None:
        with self._lock:
            account = self._spend.get(project)
            if account is not None:
                account.reservations.pop(run, None)

    def forget_run(self, project: str, run: str, billed: Decimal) -> None:
        """A deleted run's spend stays spent (in all, and in its period above its baseline)."""
        self._forget(project, run, billed, group=False)

    def forget_group(self, project: str, group: str, grading: Decimal) -> None:
        self._forget(project, group, grading, group=True)

    def _forget(self, project: str, name: str, billed: Decimal, *, group: bool) -> None:
        with self._lock:
            account = self._account(project)
            base = (account.group_base if group else account.run_base).pop(name, _ZERO)
            account.reservations.pop(name, None)
            if billed <= 0 and base == 0:
                return
            account.deleted += billed
            if account.period != "total":
                account.deleted_in_period += max(_ZERO, billed - base)
            self._save(project, account)
