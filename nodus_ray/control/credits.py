"""Credits in the API: a project's balance, grants, and the reservation a run makes per call.

The ledger itself (`money.credits.CreditLedger`) keeps the accounts; this service checks what
the API sends, and when credits are added, gives every run of the project that parked for
credits an actor again (each checks its next call again).
"""

from __future__ import annotations

import asyncio
from decimal import Decimal, InvalidOperation
from typing import Any

from nodus.errors import Invalid
from nodus.lifecycle import RunPhase, RunReason, run_transition
from nodus_ray.control.registry import Registry, check_project
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.money.credits import CreditLedger

__all__ = ["CreditService"]


class CreditService:
    """Balances, grants and reservations of each project."""

    def __init__(self, registry: Registry, ledger: CreditLedger, supervisor: RunSupervisor) -> None:
        self._registry = registry
        self._ledger = ledger
        self._supervisor = supervisor

    def recover(self) -> None:
        """After a (re)start: each run's billed total, as its status says, counts as spent."""
        for (project, name), run in self._registry.runs.items():
            self._ledger.record_run_spend(
                project, name, Decimal(run["status"]["cost"].get("totalUSD") or "0")
            )

    async def get_credits(self, project: str) -> dict[str, Any]:
        check_project(project)
        return await asyncio.to_thread(self._ledger.view, project)

    async def add_credits(self, project: str, amount: str) -> dict[str, Any]:
        """Grant ``amount`` dollars (at most 6 decimals); runs parked for credits go on."""
        check_project(project)
        try:
            value = Decimal(str(amount))
            if not value.is_finite() or value <= 0 or value != value.quantize(Decimal("0.000001")):
                raise InvalidOperation
        except InvalidOperation:
            raise Invalid(
                f"amountUSD: {str(amount)[:40]!r} is not a positive amount of dollars (at most 6 decimals)",
                details={"field": "amountUSD"},
            ) from None
        view = await asyncio.to_thread(self._ledger.add, project, value)
        await self._resume_runs_waiting_for_credits(project)
        return view

    async def _resume_runs_waiting_for_credits(self, project: str) -> None:
        """Every run of the project parked for credits gets an actor; each checks its next call again."""
        registry = self._registry
        for key, run in list(registry.runs.items()):
            if key[0] != project or run["status"].get("reason") != RunReason.INSUFFICIENT_CREDITS:
                continue
            async with registry.locks[key]:
                status = run["status"]
                if (
                    status["phase"] != RunPhase.WAITING
                    or status.get("reason") != RunReason.INSUFFICIENT_CREDITS
                ):
                    continue
                status.update(run_transition(status, RunPhase.RUNNING, None, "credits were added"))
                await registry.persist_run(key)
            self._supervisor.supervise(key)

    async def reserve_credits(self, project: str, name: str, amount: str, attempt: int | None = None) -> bool:
        """Hold ``amount`` for the run's next model call if the project can afford it; never for
        an actor of an older attempt than the run's (a zombie: it is fenced, see `durable.fencing`)."""
        run = self._registry.runs.get((project, name))
        if attempt is not None and run is not None and int(run["status"].get("attempts") or 0) > attempt:
            return False
        return self._ledger.reserve(project, name, Decimal(amount))

    def record_run_spend(self, project: str, name: str, total: Decimal) -> None:
        self._ledger.record_run_spend(project, name, total)
