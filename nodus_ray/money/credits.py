"""Project credits: what runs on the server's own key may spend.

Spending is derived, not counted: a project's spend is the sum of its runs' recorded costs
(each run's ``status.cost.totalUSD``, which the run recomputes from its journal) plus what
deleted runs had spent. A report that repeats after a replay therefore never charges twice,
and a crash between a run's report and a credits write cannot lose a charge, because there is
no separate credits write to lose. Only grants (and the spend of deleted runs) are stored.

Before a call, a run reserves the call's worst case; the balance available to others is the
balance minus every outstanding reservation, so concurrent runs cannot overdraw the project.
Reservations live in memory: after a control-plane restart each run reserves again before its
next call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

__all__ = ["CreditLedger", "ProjectCredits"]


@dataclass
class ProjectCredits:
    granted: Decimal
    deleted_spend: Decimal = Decimal(0)
    run_spend: dict[str, Decimal] = field(default_factory=dict)
    reservations: dict[str, Decimal] = field(default_factory=dict)

    @property
    def spent(self) -> Decimal:
        return self.deleted_spend + sum(self.run_spend.values(), Decimal(0))

    @property
    def balance(self) -> Decimal:
        return self.granted - self.spent

    @property
    def available(self) -> Decimal:
        return self.balance - sum(self.reservations.values(), Decimal(0))


class CreditLedger:
    def __init__(self, storage: Storage, initial_grant: Decimal):
        self._storage = storage
        self._initial = initial_grant
        self._projects: dict[str, ProjectCredits] = {}
        # Deletes forget runs from several threads at once (a group's members in parallel): each
        # change and its save happen under one lock, or a save of an older total can land last
        # and a restart would forget a deleted run's spend.
        self._lock = threading.Lock()

    def _path(self, project: str) -> str:
        return layout.credits(project)

    def project(self, project: str) -> ProjectCredits:
        """The project's account, opened (with the initial grant) on first use."""
        account = self._projects.get(project)
        if account is None:
            try:
                stored = self._storage.read_json(self._path(project))
                account = ProjectCredits(
                    Decimal(stored["grantedUSD"]), Decimal(stored.get("deletedSpendUSD", "0"))
                )
            except FileNotFoundError:
                account = ProjectCredits(self._initial)
                self._save(project, account)
            self._projects[project] = account
        return account

    def _save(self, project: str, account: ProjectCredits) -> None:
        self._storage.write_json(
            self._path(project),
            {"grantedUSD": str(account.granted), "deletedSpendUSD": str(account.deleted_spend)},
        )

    def view(self, project: str) -> dict[str, Any]:
        with self._lock:  # not in the middle of a delete's change (a thread of its own)
            account = self.project(project)
            return {
                "project": project,
                "balanceUSD": str(account.balance),
                "grantedUSD": str(account.granted),
                "spentUSD": str(account.spent),
                "reservedUSD": str(sum(account.reservations.values(), Decimal(0))),
            }

    def record_run_spend(self, project: str, run: str, total: Decimal) -> None:
        """The run's billed total as its journal says; releases the run's reservation."""
        account = self.project(project)
        account.run_spend[run] = total
        account.reservations.pop(run, None)

    def forget_run(self, project: str, run: str) -> None:
        """A deleted run's spend stays spent."""
        with self._lock:
            account = self.project(project)
            account.deleted_spend += account.run_spend.pop(run, Decimal(0))
            account.reservations.pop(run, None)
            self._save(project, account)

    def add(self, project: str, amount: Decimal) -> dict[str, Any]:
        with self._lock:
            account = self.project(project)
            account.granted += amount
            self._save(project, account)
        return self.view(project)

    def reserve(self, project: str, run: str, amount: Decimal) -> bool:
        """Hold ``amount`` for the run's next call if the project can afford it."""
        account = self.project(project)
        account.reservations.pop(run, None)
        if amount > account.available:
            return False
        account.reservations[run] = amount
        return True
