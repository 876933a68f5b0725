"""The project Budget in the API: create, read, patch and delete it; the reservations runs make;
and what lets parked runs go on (a raised Budget, a new period).

The ledger (`money.budgets.BudgetLedger`) keeps the spend and reservations; this service checks
what the API sends (a Budget below what the period has spent already is refused with the figure),
resumes every run of the project that parked with ``BudgetExceeded`` when the Budget has room
again, and keeps one timer per project with a ``month`` or ``day`` Budget for the next period's
start (armed again at recovery: the time lives in the Budget's period, not in memory).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from nodus.errors import Conflict, Invalid, NotFound
from nodus.lifecycle import RUN_TERMINAL_PHASES, RunPhase, RunReason, run_transition
from nodus.resources import parse_resource
from nodus.schema_budget import Budget
from nodus.schema_common import ObjectMeta
from nodus_ray.control.registry import Key, Registry, check_project, parked
from nodus_ray.core.patch import patched_document
from nodus_ray.money.budgets import BudgetLedger, Spender
from nodus_ray.store.timestamps import utc_now

__all__ = ["BudgetService", "billed_of", "grading_of"]

logger = logging.getLogger(__name__)

# The longest one timer sleeps: a month's end is re-armed from a fresh clock reading.
_MAX_TIMER_SECONDS = 6 * 3600.0


def billed_of(run: Mapping[str, Any]) -> Decimal:
    """What the Budget counts for a run: ``status.cost.billedUSD`` (model + sandbox), or
    ``totalUSD`` + ``sandboxUSD`` when that is more (a report that changed one figure and not
    the sum, a run stored before ``billedUSD`` existed): never less than what is known spent."""
    cost = (run.get("status") or {}).get("cost") or {}
    parts = Decimal(str(cost.get("totalUSD") or "0")) + Decimal(str(cost.get("sandboxUSD") or "0"))
    return max(Decimal(str(cost.get("billedUSD") or "0")), parts)


def grading_of(group: Mapping[str, Any]) -> Decimal:
    """What the Budget counts for a group itself: its grading compute (``status.cost.gradingUSD``)."""
    cost = (group.get("status") or {}).get("cost") or {}
    return Decimal(str(cost.get("gradingUSD") or "0"))


def _active(run: Mapping[str, Any]) -> bool:
    """Whether the run may still spend what it reserved: unfinished and not parked."""
    return run["status"]["phase"] not in RUN_TERMINAL_PHASES and not parked(dict(run))


class BudgetService:
    """One Budget per project; the reservations and resumptions that keep it never passed."""

    def __init__(
        self,
        registry: Registry,
        start: Callable[[Key], None],
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._registry = registry
        self._start = start
        self.ledger = BudgetLedger(registry.storage, self._runs_of, self._groups_of, now)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._resuming: set[asyncio.Task[None]] = set()
        # Called when the project's Budget has room again (groups admit again): `GroupLink` wiring.
        self.on_room: list[Callable[[str], Awaitable[None]]] = []
        # What each run parked with BudgetExceeded needs for its next step (memory only, as the
        # reservations): when a run ends or parks and so frees what it held, the parked runs
        # that now fit go on without waiting for a raise (`_run_changed`).
        self._needs: dict[Key, Decimal] = {}
        self._highest: dict[Key, Decimal] = {}  # each run's highest billed total seen (`_runs_of`)
        # A group's grading as its case records say (`EvaluationService.grading_usd`, wired by
        # `compose`): fresher than the group's status, which is written on phase changes only.
        self.grading: Callable[[Key], Decimal] = lambda key: Decimal(0)
        # Set when a project's Budget may have room again: what `hold_grading` waits on.
        self._room: dict[str, asyncio.Event] = {}
        registry.on_run_changed(self._run_changed)

    def _runs_of(self, project: str) -> dict[str, Spender]:
        """Each run's billed total, never below the highest seen: a resumed run's actor reports
        its cost again as it replays its journal, from zero up, and what was spent stays spent."""
        spenders = {}
        for key, run in list(self._registry.runs.items()):
            if key[0] != project:
                continue
            billed = max(billed_of(run), self._highest.get(key, Decimal(0)))
            if billed > 0:
                self._highest[key] = billed
            spenders[key[1]] = Spender(billed, _active(run))
        return spenders

    def _groups_of(self, project: str) -> dict[str, Decimal]:
        return {
            key[1]: max(grading_of(group), self.grading(key))
            for key, group in list(self._registry.groups.items())
            if key[0] == project
        }

    # -- recovery and timers ------------------------------------------------------------------

    async def recover(self) -> None:
        """After a (re)start: the Budgets from storage, a timer for each with a calendar period,
        and a period that began while the service was down begins now (its parked runs go on)."""
        await asyncio.to_thread(self.ledger.load)
        # What each parked run needs (its status keeps it, `waitingFor.budgetUSD`), so a freed
        # hold after a restart still lets the runs it fits go on; a run parked by an older
        # service, with no figure kept, needs nothing known: the first freed hold tries it.
        for key, run in self._registry.runs.items():
            status = run["status"]
            if status.get("phase") != RunPhase.WAITING or status.get("reason") != RunReason.BUDGET_EXCEEDED:
                continue
            try:
                self._needs[key] = Decimal(str((status.get("waitingFor") or {}).get("budgetUSD") or "0"))
            except InvalidOperation:
                self._needs[key] = Decimal(0)
        for project in self.ledger.projects():
            if await asyncio.to_thread(self.ledger.roll_over, project):
                await self._resume(project)
            self._arm(project)

    def _arm(self, project: str) -> None:
        old = self._timers.pop(project, None)
        if old is not None:
            old.cancel()
        end = self.ledger.period_end(project)
        if end is None:
            return
        delay = min(_MAX_TIMER_SECONDS, max(0.0, (end - datetime.now(UTC)).total_seconds()))
        self._timers[project] = asyncio.get_running_loop().call_later(delay, self._fire, project)

    def _fire(self, project: str) -> None:
        self._timers.pop(project, None)
        task = asyncio.get_running_loop().create_task(self._new_period(project))
        self._resuming.add(task)
        task.add_done_callback(self._resuming.discard)

    async def _new_period(self, project: str) -> None:
        try:
            if await asyncio.to_thread(self.ledger.roll_over, project):
                await self._resume(project)
        finally:
            if self.ledger.budget(project) is not None:
                self._arm(project)

    # -- the API ------------------------------------------------------------------------------

    def _view(self, project: str, stored: dict[str, Any]) -> dict[str, Any]:
        return {**stored, "status": self.ledger.view(project)}

    async def apply_budget(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        """Create (``mode="create"``) or create-or-update the project's Budget.

        Refused, with nothing changed: a second Budget of another name (one per project), a
        ``maxCostUSD`` below what the period has spent (the message says the figure), a period
        that is not ``total``, ``month`` or ``day``.
        """
        check_project(project)
        budget = parse_resource(document, expected_kind="Budget")
        assert isinstance(budget, Budget)
        name = budget.metadata.name
        async with self._registry.locks[("budget", project)]:
            existing = self.ledger.budget(project)
            if existing is not None and existing["metadata"]["name"] != name:
                raise Conflict(
                    f"project {project!r} has the Budget {existing['metadata']['name']!r} already "
                    "(one per project); patch or delete it",
                    code="AlreadyExists",
                    details={
                        "kind": "Budget",
                        "name": existing["metadata"]["name"],
                        "field": "metadata.name",
                    },
                )
            if existing is not None and mode == "create":
                raise Conflict(
                    f"budget {name!r} already exists",
                    code="AlreadyExists",
                    details={"kind": "Budget", "name": name},
                )
            spec = budget.spec.model_dump(mode="json")
            if (
                existing is not None
                and existing["spec"] == spec
                and (existing["metadata"].get("labels", {}) == budget.metadata.labels)
            ):
                return {"resource": self._view(project, existing), "result": "unchanged"}
            limit = Decimal(spec["maxCostUSD"])

            def check(spent: Decimal) -> None:
                if limit < spent:
                    raise Invalid(
                        f"Budget spec.maxCostUSD: ${limit} is below what the project has spent "
                        f"{'in this period' if spec['period'] != 'total' else 'already'}: spent ${spent}",
                        details={"field": "spec.maxCostUSD", "kind": "Budget", "spentUSD": str(spent)},
                    )

            generation = int(existing["metadata"].get("generation") or 0) + 1 if existing else 1
            resource = Budget(
                metadata=ObjectMeta(
                    name=name,
                    project=project,
                    uid=existing["metadata"]["uid"] if existing else uuid.uuid4().hex,
                    generation=generation,
                    creationTimestamp=existing["metadata"]["creationTimestamp"] if existing else utc_now(),
                    labels=budget.metadata.labels,
                ),
                spec=budget.spec,
            ).model_dump(mode="json", exclude_none=True)
            resource["spec"] = spec
            await asyncio.to_thread(self.ledger.store_budget, project, resource, check)
        self._arm(project)
        await self._resume(project)  # a raised (or new, or longer-period) Budget may have room
        return {
            "resource": self._view(project, resource),
            "result": "created" if existing is None else "configured",
        }

    def _stored(self, project: str, name: str) -> dict[str, Any]:
        check_project(project)
        stored = self.ledger.budget(project)
        if stored is None or stored["metadata"]["name"] != name:
            raise NotFound(
                f"budget {name!r} not found in project {project!r}", details={"kind": "Budget", "name": name}
            )
        return stored

    async def get_budget(self, project: str, name: str) -> dict[str, Any]:
        return self._view(project, self._stored(project, name))

    async def list_budgets(self, project: str) -> list[dict[str, Any]]:
        check_project(project)
        stored = self.ledger.budget(project)
        return [] if stored is None else [self._view(project, stored)]

    async def patch_budget(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        current = self._stored(project, name)
        return await self.apply_budget(project, patched_document(current, patch, name), mode="apply")

    async def delete_budget(self, project: str, name: str) -> dict[str, Any]:
        """No Budget: nothing holds the project back any more; its parked runs go on."""
        stored = self._stored(project, name)
        view = self._view(project, stored)
        async with self._registry.locks[("budget", project)]:
            await asyncio.to_thread(self.ledger.delete_budget, project)
        timer = self._timers.pop(project, None)
        if timer is not None:
            timer.cancel()
        await self._resume(project)
        return view

    # -- what runs and groups ask -------------------------------------------------------------

    async def reserve_budget(self, project: str, name: str, amount: str, attempt: int | None = None) -> bool:
        """Hold ``amount`` of the Budget for the run's next step; True when the project has no
        Budget. Never for an actor of an older attempt than the run's (a fenced zombie)."""
        run = self._registry.runs.get((project, name))
        if attempt is not None and run is not None and int(run["status"].get("attempts") or 0) > attempt:
            return False
        if self.ledger.budget(project) is None:
            return True
        try:
            value = Decimal(str(amount))
        except InvalidOperation:
            return False
        return await asyncio.to_thread(self.ledger.reserve, project, name, value)

    def left(self, project: str) -> Decimal | None:
        """What the project's Budget can still hold now (None: no Budget)."""
        if self.ledger.budget(project) is None:
            return None
        return self.ledger.left(project)

    def forget_run(self, project: str, name: str) -> None:
        """A run about to be deleted: what it billed stays spent (call before it is removed)."""
        run = self._registry.runs.get((project, name))
        billed = billed_of(run) if run is not None else Decimal(0)
        billed = max(billed, self._highest.pop((project, name), Decimal(0)))
        self.ledger.forget_run(project, name, billed)

    def forget_group(self, project: str, name: str) -> None:
        group = self._registry.groups.get((project, name))
        grading = max(grading_of(group) if group is not None else Decimal(0), self.grading((project, name)))
        self.ledger.forget_group(project, name, grading)

    # -- resuming -----------------------------------------------------------------------------

    async def _resume(self, project: str) -> None:
        """Every run of the project parked with BudgetExceeded gets an actor (each reserves its
        next step again: those that do not fit park again); groups admit again."""
        registry = self._registry
        for key, run in list(registry.runs.items()):
            if key[0] != project or run["status"].get("reason") != RunReason.BUDGET_EXCEEDED:
                continue
            async with registry.locks[key]:
                status = run["status"]
                if status["phase"] != RunPhase.WAITING or status.get("reason") != RunReason.BUDGET_EXCEEDED:
                    continue
                status.update(run_transition(status, RunPhase.RUNNING, None, "the Budget has room again"))
                await registry.persist_run(key)
            self._needs.pop(key, None)
            await registry.run_changed(key)
            self._start(key)
        self._notify_room(project)
        for listener in self.on_room:
            try:
                await listener(project)
            except Exception:  # noqa: BLE001 - a group's wake-up must not stop the others
                logger.warning("project %s: a Budget listener failed", project, exc_info=True)

    def affordable(self, project: str, needed: str | None, run: str | None = None) -> bool:
        """Whether a run that parked for ``needed`` could go on at once (the Budget was raised
        while its actor was finishing); if not, ``run``'s need is kept for `_run_changed`."""
        left = self.left(project)
        if left is None:
            return True
        try:
            need = Decimal(needed) if needed is not None else None
        except InvalidOperation:
            need = None
        if need is not None and need <= left:
            return True
        if run is not None and need is not None:
            self._needs[(project, run)] = need
        return False

    async def _run_changed(self, key: Key) -> None:
        """A run that finished or parked holds nothing any more: the runs parked for the Budget
        whose next step fits what is left now go on, oldest need first, each counted against
        what is left before the next (so a freed hold does not start more than it can pay)."""
        project = key[0]
        run = self._registry.runs.get(key)
        if run is not None and _active(run):
            return  # still running (a progress report): it frees nothing
        if run is None or run["status"].get("reason") != RunReason.BUDGET_EXCEEDED:
            self._needs.pop(key, None)
        waiting = [k for k in self._needs if k[0] == project and k != key]
        if not waiting or self.ledger.budget(project) is None:
            return
        self._notify_room(project)
        left = self.left(project)
        if left is None:
            return
        for other in waiting:
            need = self._needs[other]
            if need > left:
                continue
            left -= need
            del self._needs[other]
            await self._resume_one(other)

    def _notify_room(self, project: str) -> None:
        event = self._room.get(project)
        if event is not None:
            event.set()

    # -- grading ------------------------------------------------------------------------------

    async def hold_grading(self, group: Key, run: str, amount: Decimal, within: float) -> bool:
        """Hold a case's grading at its largest price against the project's Budget, waiting up
        to ``within`` seconds for room (a raise, a new period, work that ends); False if none came."""
        project, hold_id = group[0], f"grading/{group[1]}/{run}"
        event = self._room.setdefault(project, asyncio.Event())
        deadline = asyncio.get_running_loop().time() + within
        while True:
            event.clear()  # before trying: room that comes after the refusal sets it again
            if await asyncio.to_thread(self.ledger.hold, project, hold_id, amount):
                return True
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(event.wait(), timeout=remaining)
            except TimeoutError:
                return False

    def release_grading(self, group: Key, run: str) -> None:
        """The case's record (with its grading charge) is stored: its hold goes."""
        self.ledger.release_hold(group[0], f"grading/{group[1]}/{run}")
        self._notify_room(group[0])

    async def _resume_one(self, key: Key) -> None:
        registry = self._registry
        async with registry.locks[key]:
            run = registry.runs.get(key)
            if run is None:
                return
            status = run["status"]
            if status["phase"] != RunPhase.WAITING or status.get("reason") != RunReason.BUDGET_EXCEEDED:
                return
            status.update(run_transition(status, RunPhase.RUNNING, None, "the Budget has room again"))
            await registry.persist_run(key)
        await registry.run_changed(key)
        self._start(key)
