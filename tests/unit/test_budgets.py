"""The project Budget: the ledger (never exceeded under concurrent reservations, periods roll
over with a stored baseline, deleted runs' spend stays spent) and the service over real local
storage (refusals that change nothing, parked runs resumed when the Budget has room again)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from nodus.errors import Conflict, Invalid
from nodus_ray.money.billing import RunBudget
from nodus_ray.money.budgets import BudgetLedger, Spender, period_bounds
from nodus_ray.money.prices import DEFAULT_PRICE_TABLE
from nodus_ray.money.spend import BudgetExceeded, RunSpend
from nodus_ray.store.storage import Storage
from tests.unit.test_control_support import agent_doc, make_plane, run_doc, until


def budget_doc(max_cost: str, period: str = "total", name: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Budget",
        "metadata": {"name": name},
        "spec": {"maxCostUSD": max_cost, "period": period},
    }


class FakeProject:
    """What the ledger reads of a project: its runs' billed totals and its groups' grading."""

    def __init__(self) -> None:
        self.runs: dict[str, Spender] = {}
        self.groups: dict[str, Decimal] = {}
        self.lock = threading.Lock()

    def runs_of(self, project: str) -> Mapping[str, Spender]:
        with self.lock:
            return dict(self.runs)

    def groups_of(self, project: str) -> Mapping[str, Decimal]:
        return dict(self.groups)

    def bill(self, run: str, amount: Decimal) -> None:
        with self.lock:
            current = self.runs.get(run, Spender(Decimal(0), True))
            self.runs[run] = Spender(current.billed + amount, current.active)


class Clock:
    def __init__(self, moment: datetime) -> None:
        self.moment = moment

    def __call__(self) -> datetime:
        return self.moment


def _ledger(tmp_path: Path, project: FakeProject, clock: Clock | None = None) -> BudgetLedger:
    storage = Storage(str(tmp_path / "storage"))
    if clock is None:
        return BudgetLedger(storage, project.runs_of, project.groups_of)
    return BudgetLedger(storage, project.runs_of, project.groups_of, clock)


def _set(ledger: BudgetLedger, max_cost: str, period: str = "total") -> None:
    document = budget_doc(max_cost, period)
    document["metadata"]["project"] = "p"
    ledger.store_budget("p", document, lambda spent: None)


# -- the ledger -----------------------------------------------------------------------------------


def test_no_budget_grants_everything(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, FakeProject())
    assert ledger.reserve("p", "r1", Decimal("1000000")) is True
    assert ledger.view("p") is None and ledger.left("p") is None


def test_concurrent_reservations_never_pass_the_budget(tmp_path: Path) -> None:
    """Many runs reserve and spend at once (each spends at most what it reserved, then reserves
    again): at every moment spent + held stays within maxCostUSD, and so does the final spend."""
    project = FakeProject()
    ledger = _ledger(tmp_path, project)
    _set(ledger, "5.00")
    limit = Decimal("5.00")
    seen: list[Decimal] = []
    refused = 0

    def worker(run: str, seed: int) -> None:
        nonlocal refused
        rng = random.Random(seed)
        project.runs[run] = Spender(Decimal(0), True)
        for _ in range(200):
            amount = Decimal(rng.randint(1, 40)) / 100
            if not ledger.reserve("p", run, amount):
                refused += 1
                continue
            project.bill(run, Decimal(rng.randint(0, int(amount * 100))) / 100)  # at most what it held
            view = ledger.view("p")
            assert view is not None
            seen.append(Decimal(view["spentUSD"]) + Decimal(view["reservedUSD"]))

    threads = [threading.Thread(target=worker, args=(f"r{i}", i)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = sum((run.billed for run in project.runs.values()), Decimal(0))
    assert total <= limit
    assert max(seen) <= limit
    assert refused > 0  # the Budget did bind: runs were turned away at the limit
    assert total > limit - Decimal("0.40")  # and it was used up to about its last step


def test_a_run_without_an_actor_holds_nothing_and_billing_consumes_the_reservation(tmp_path: Path) -> None:
    project = FakeProject()
    ledger = _ledger(tmp_path, project)
    _set(ledger, "1.00")
    project.runs["r1"] = Spender(Decimal(0), True)
    assert ledger.reserve("p", "r1", Decimal("0.80"))
    assert ledger.reserve("p", "r2", Decimal("0.30")) is False  # 0.80 held of 1.00
    project.bill("r1", Decimal("0.50"))  # what it billed consumes its reservation: 0.30 still held
    assert ledger.view("p") == {
        "spentUSD": "0.50",
        "reservedUSD": "0.30",
        "leftUSD": "0.20",
        "periodStart": None,
        "periodEnd": None,
    }
    project.runs["r1"] = Spender(Decimal("0.50"), False)  # parked or finished: it holds nothing
    assert ledger.reserve("p", "r2", Decimal("0.50")) is True
    assert ledger.reserve("p", "r2", Decimal("0.51")) is False  # a new reservation replaces the old


def test_deleted_runs_and_groups_stay_spent_after_a_restart(tmp_path: Path) -> None:
    project = FakeProject()
    ledger = _ledger(tmp_path, project)
    _set(ledger, "2.00")
    project.runs["r1"] = Spender(Decimal("0.70"), False)
    project.groups["g1"] = Decimal("0.10")
    ledger.forget_run("p", "r1", Decimal("0.70"))
    del project.runs["r1"]
    ledger.forget_group("p", "g1", Decimal("0.10"))
    del project.groups["g1"]
    restarted = _ledger(tmp_path, project)
    restarted.load()
    view = restarted.view("p")
    assert view is not None and (view["spentUSD"], view["leftUSD"]) == ("0.80", "1.20")


def test_periods_are_utc_calendar_days_and_months() -> None:
    moment = datetime(2026, 2, 14, 23, 59, tzinfo=UTC)
    assert period_bounds("day", moment) == (
        datetime(2026, 2, 14, tzinfo=UTC),
        datetime(2026, 2, 15, tzinfo=UTC),
    )
    assert period_bounds("month", moment) == (
        datetime(2026, 2, 1, tzinfo=UTC),
        datetime(2026, 3, 1, tzinfo=UTC),
    )
    assert period_bounds("month", datetime(2026, 12, 31, tzinfo=UTC))[1] == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_bounds("total", moment) == (None, None)


def test_a_new_period_starts_from_a_stored_baseline_and_late_charges_count_in_it(tmp_path: Path) -> None:
    project = FakeProject()
    clock = Clock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))
    ledger = _ledger(tmp_path, project, clock)
    project.runs["r1"] = Spender(Decimal("0.40"), True)
    _set(ledger, "1.00", "day")  # a day Budget counts from when it was set: r1's 0.40 is before
    assert ledger.view("p")["spentUSD"] == "0"  # type: ignore[index]
    assert ledger.reserve("p", "r1", Decimal("0.60"))
    project.bill("r1", Decimal("0.60"))  # 0.60 spent today (r1 billed 1.00 in all)
    assert ledger.reserve("p", "r1", Decimal("0.41")) is False
    assert ledger.view("p")["leftUSD"] == "0.40"  # type: ignore[index]
    clock.moment = datetime(2026, 3, 11, 0, 0, 1, tzinfo=UTC)
    assert ledger.roll_over("p") is True  # the baseline of the 11th is written before any grant
    stored = Storage(str(tmp_path / "storage")).read_json("projects/p/budget-spend.json")
    assert stored["period"] == {
        "kind": "day",
        "start": "2026-03-11T00:00:00Z",
        "runs": {"r1": "1.00"},
        "groups": {},
        "deletedUSD": "0",
    }
    view = ledger.view("p")
    assert view is not None
    assert (view["spentUSD"], view["periodStart"], view["periodEnd"]) == (
        "0",
        "2026-03-11T00:00:00Z",
        "2026-03-12T00:00:00Z",
    )
    assert ledger.reserve("p", "r1", Decimal("0.50"))
    project.bill("r1", Decimal("0.25"))  # a charge reported now counts in the new period
    project.runs["r2"] = Spender(Decimal("0.20"), False)  # a run started today counts whole
    restarted = _ledger(tmp_path, project, clock)  # a restart keeps the period's baseline
    restarted.load()
    view = restarted.view("p")
    assert view is not None and (view["spentUSD"], view["reservedUSD"]) == ("0.45", "0")
    restarted.forget_run("p", "r1", Decimal("1.25"))  # deleted today: what it billed today stays
    del project.runs["r1"]
    assert restarted.view("p")["spentUSD"] == "0.45"  # type: ignore[index]


def test_a_reservation_held_over_a_period_change_still_counts(tmp_path: Path) -> None:
    project = FakeProject()
    clock = Clock(datetime(2026, 3, 31, 23, 0, tzinfo=UTC))
    ledger = _ledger(tmp_path, project, clock)
    _set(ledger, "1.00", "month")
    project.runs["r1"] = Spender(Decimal(0), True)
    assert ledger.reserve("p", "r1", Decimal("0.90"))
    clock.moment = datetime(2026, 4, 1, 0, 0, tzinfo=UTC)
    assert ledger.reserve("p", "r2", Decimal("0.20")) is False  # r1's 0.90 is still held
    assert ledger.reserve("p", "r2", Decimal("0.10")) is True


# -- the run's side ---------------------------------------------------------------------------------


def test_run_spend_reserves_nodus_calls_and_sandbox_work_but_not_byok_calls() -> None:
    held: list[Decimal] = []

    async def credits(amount: Decimal) -> None:
        pass

    async def budget(amount: Decimal) -> None:
        held.append(amount)
        if amount > Decimal("1"):
            raise BudgetExceeded(amount)

    async def scenario() -> None:
        nodus = RunSpend(DEFAULT_PRICE_TABLE, "Nodus", RunBudget(None), credits, budget)
        await nodus.before_call(Decimal("0.2"), Decimal("0.2"))
        await nodus.before_sandbox(Decimal("0.05"))
        with pytest.raises(BudgetExceeded) as over:
            await nodus.before_sandbox(Decimal("2"))
        assert over.value.needed == Decimal("2")
        byok = RunSpend(DEFAULT_PRICE_TABLE, "BYOK", RunBudget(None), credits, budget)
        await byok.before_call(Decimal("0.2"), Decimal("0.2"))  # billed nothing: nothing held
        await byok.before_sandbox(Decimal("0.03"))  # sandbox compute is billed with BYOK too

    asyncio.run(scenario())
    assert held == [Decimal("0.2"), Decimal("0.05"), Decimal("2"), Decimal("0.03")]


def test_a_program_process_hold_stays_in_every_later_reservation_until_its_charge() -> None:
    # The Budget keeps one reservation per run, each replacing the one before: a Python
    # program's process (which spends CPU across the model calls it makes) would otherwise
    # lose its hold at its first model call, and other runs could take that room.
    held: list[Decimal] = []

    async def credits(amount: Decimal) -> None:
        pass

    async def budget(amount: Decimal) -> None:
        held.append(amount)
        if amount > Decimal("1"):
            raise BudgetExceeded(amount)

    async def scenario() -> None:
        spend = RunSpend(DEFAULT_PRICE_TABLE, "Nodus", RunBudget(None), credits, budget)
        await spend.hold_standing(Decimal("0.1"))
        await spend.before_call(Decimal("0.2"), Decimal("0.2"))
        await spend.before_sandbox(Decimal("0.05"))
        spend.release_standing()
        await spend.before_call(Decimal("0.2"), Decimal("0.2"))
        with pytest.raises(BudgetExceeded):  # a refused hold holds nothing afterwards
            await spend.hold_standing(Decimal("3"))
        await spend.before_sandbox(Decimal("0.05"))
        byok = RunSpend(DEFAULT_PRICE_TABLE, "BYOK", RunBudget(None), credits, budget)
        await byok.hold_standing(Decimal("0.1"))
        await byok.before_call(Decimal("0.2"), Decimal("0.2"))  # billed nothing: the hold stands as is

    asyncio.run(scenario())
    assert held == [
        Decimal("0.1"),
        Decimal("0.3"),
        Decimal("0.15"),
        Decimal("0.2"),
        Decimal("3"),
        Decimal("0.05"),
        Decimal("0.1"),
    ]


# -- the service ------------------------------------------------------------------------------------


def test_bad_budgets_are_refused_naming_the_field_and_nothing_changes(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        await plane.services.runs.report("demo", "r1", {"cost": {"totalUSD": "0.30", "billedUSD": "0.45"}})
        with pytest.raises(Invalid) as below:
            await budgets.apply_budget("demo", budget_doc("0.40"))
        assert below.value.details["field"] == "spec.maxCostUSD"
        assert "spent $0.45" in below.value.message
        assert await budgets.list_budgets("demo") == []
        assert not plane.storage.exists("projects/demo/budgets/default.json")
        for bad, field in (
            (budget_doc("1", "week"), "spec.period"),
            (budget_doc("-1"), "spec.maxCostUSD"),
            (budget_doc("ten"), "spec.maxCostUSD"),
            (budget_doc("1.0000001"), "spec.maxCostUSD"),
            ({**budget_doc("1"), "spec": {"maxCostUSD": 1.5}}, "spec.maxCostUSD"),
        ):
            with pytest.raises(Invalid) as refused:
                await budgets.apply_budget("demo", bad)
            assert refused.value.details["field"] == field, bad
        created = await budgets.apply_budget("demo", budget_doc("1.00"))
        assert created["result"] == "created"
        assert created["resource"]["status"]["spentUSD"] == "0.45"
        assert created["resource"]["status"]["leftUSD"] == "0.55"
        with pytest.raises(Invalid) as lowered:  # a patch below the spend is refused the same way
            await budgets.patch_budget("demo", "default", {"spec": {"maxCostUSD": "0.10"}})
        assert "spent $0.45" in lowered.value.message
        with pytest.raises(Invalid):
            await budgets.patch_budget("demo", "default", {"spec": {"period": "year"}})
        assert (await budgets.get_budget("demo", "default"))["spec"] == {
            "maxCostUSD": "1.00",
            "period": "total",
        }
        with pytest.raises(Conflict):  # one Budget per project
            await budgets.apply_budget("demo", budget_doc("5", name="other"))

    asyncio.run(scenario())


def test_deleted_runs_stay_spent_and_reservations_follow_the_budget(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        assert await budgets.reserve_budget("demo", "r1", "1000") is True  # no Budget: all fits
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        await plane.services.runs.report("demo", "r1", {"cost": {"totalUSD": "0.20", "sandboxUSD": "0.05"}})
        await budgets.apply_budget("demo", budget_doc("1"))
        assert await budgets.reserve_budget("demo", "r1", "0.75") is True
        assert await budgets.reserve_budget("demo", "r2", "0.01") is False
        cost = {"totalUSD": "0.20", "sandboxUSD": "0.05"}
        actor.end(
            {"phase": "Succeeded", "reason": "Completed", "cost": cost, "finishedAt": "2026-12-01T00:00:01Z"}
        )
        await until(lambda: plane.stored_phase("r1") == "Succeeded", what="the run finished")
        assert await budgets.reserve_budget("demo", "r2", "0.75") is True  # a finished run holds nothing
        await plane.services.runs.delete_run("demo", "r1")
        await until(lambda: ("demo", "r1") not in plane.services.registry.runs, what="the run deleted")
        restarted = await plane.restart()
        view = await restarted.services.budgets.get_budget("demo", "default")
        assert (view["status"]["spentUSD"], view["status"]["leftUSD"]) == ("0.25", "0.75")

    asyncio.run(scenario())


def test_raising_the_budget_resumes_the_runs_parked_for_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        await budgets.apply_budget("demo", budget_doc("0.10"))
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        assert await budgets.reserve_budget("demo", "r1", "0.50") is False
        first.end({"phase": "Waiting", "reason": "BudgetExceeded", "budgetNeededUSD": "0.50"})
        await until(lambda: plane.stored_phase("r1") == "Waiting", what="the run parked for the Budget")
        await until(lambda: first.killed, what="the parked run's actor given back")
        run = await plane.services.runs.get_run("demo", "r1")
        assert (run["status"]["reason"], run["status"]["actorName"]) == ("BudgetExceeded", None)
        assert "budgetNeededUSD" not in run["status"]
        await budgets.patch_budget("demo", "default", {"spec": {"maxCostUSD": "0.20"}})
        await until(lambda: plane.run_actors.of("r1")[1:], what="a new actor for the resumed run")
        stored = plane.storage.read_json("projects/demo/agentruns/r1/run.json")
        assert (stored["status"]["phase"], stored["status"]["reason"]) == ("Running", None)

    asyncio.run(scenario())


def test_a_new_period_resumes_the_parked_runs(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        clock = Clock(datetime.now(UTC))
        budgets.ledger._now = clock  # noqa: SLF001 - the test's clock
        await budgets.apply_budget("demo", budget_doc("0.10", "day"))
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        await plane.services.runs.report("demo", "r1", {"cost": {"billedUSD": "0.10"}})
        assert await budgets.reserve_budget("demo", "r1", "0.05") is False
        first.end({"phase": "Waiting", "reason": "BudgetExceeded", "budgetNeededUSD": "0.05"})
        await until(lambda: plane.stored_phase("r1") == "Waiting", what="the run parked for the Budget")
        clock.moment += timedelta(days=1)
        await budgets._new_period("demo")  # noqa: SLF001 - what the period's timer calls
        await until(lambda: plane.run_actors.of("r1")[1:], what="a new actor in the new period")
        assert await budgets.reserve_budget("demo", "r1", "0.05") is True

    asyncio.run(scenario())


# -- the API ----------------------------------------------------------------------------------------

_ADMIN, _WRITER = "nodus_test_admin", "nodus_test_writer"


def test_the_api_creates_reads_patches_and_deletes_the_budget(tmp_path: Path) -> None:
    import httpx

    from nodus_ray.control.tokens import token_digest
    from nodus_serve.app import create_app
    from tests.fakes.control_plane import client_over

    async def main() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        roles = {token_digest(_ADMIN): "admin", token_digest(_WRITER): "write"}

        async def call(method: str, *args: Any) -> Any:
            if method == "authenticate":
                role = roles.get(args[0])
                return (
                    None
                    if role is None
                    else {"name": role, "project": "demo", "role": role, "expiresAt": None}
                )
            return await getattr(budgets, method)(*args)

        transport = httpx.ASGITransport(app=create_app(client_over(call)))
        base = "/v1/projects/demo/budgets"
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            admin = {"Authorization": f"Bearer {_ADMIN}"}
            writer = {"Authorization": f"Bearer {_WRITER}"}
            refused = await http.post(base, json=budget_doc("5"), headers=writer)
            assert refused.status_code == 403, refused.text
            created = await http.post(base, json=budget_doc("5", "month"), headers=admin)
            assert created.status_code == 201, created.text
            status = created.json()["status"]
            assert (status["spentUSD"], status["leftUSD"]) == ("0", "5")
            assert status["periodStart"].endswith("-01T00:00:00Z") and status["periodEnd"]
            listed = (await http.get(base, headers=writer)).json()
            assert listed["kind"] == "BudgetList" and [b["metadata"]["name"] for b in listed["items"]] == [
                "default"
            ]
            bad = await http.patch(
                f"{base}/default",
                json={"spec": {"period": "week"}},
                headers={**admin, "Content-Type": "application/merge-patch+json"},
            )
            assert bad.status_code == 422 and bad.json()["details"]["field"] == "spec.period", bad.text
            patched = await http.patch(
                f"{base}/default",
                json={"spec": {"maxCostUSD": "7.50"}},
                headers={**admin, "Content-Type": "application/merge-patch+json"},
            )
            assert patched.status_code == 200, patched.text
            assert patched.json()["spec"] == {"maxCostUSD": "7.50", "period": "month"}
            again = await http.put(f"{base}/default", json=budget_doc("7.50", "month"), headers=admin)
            assert again.headers["X-Nodus-Result"] == "unchanged"
            assert (await http.delete(f"{base}/default", headers=admin)).status_code == 200
            assert (await http.get(f"{base}/default", headers=admin)).status_code == 404

    asyncio.run(main())


# -- groups ----------------------------------------------------------------------------------------


def test_a_group_admits_only_while_the_budget_holds_the_next_members_cap() -> None:
    from nodus_ray.core.admission import Admission, GroupLimits, Member

    def member(key: str) -> Member:
        return Member(key=key, run=f"g-{key}", cap=Decimal("1.00"), depends_on=())

    admission = Admission(GroupLimits(max_active=10))
    admission.budget_left = Decimal("2.50")
    decision = admission.add([member(k) for k in "abcde"])
    assert decision.start == ["g-a", "g-b"]  # 2.50 holds two caps of 1.00, not a third
    assert decision.status.blocked_reasons["BudgetExceeded"] == 3
    assert decision.status.blocked_reasons["MaxActiveReached"] == 0
    # The Budget is raised (the control plane tells the group what it holds now): one more starts.
    decision = admission.set_budget_left(Decimal("3.00"))
    assert decision.start == ["g-c"] and decision.status.blocked_reasons["BudgetExceeded"] == 2
    # At the limit nothing starts, not even a run that would cost Nodus nothing.
    assert admission.set_budget_left(Decimal("0")).start == []
    # The project's Budget deleted: the group admits as before, and the key is gone.
    decision = admission.set_budget_left(None)
    assert decision.start == ["g-d", "g-e"] and "BudgetExceeded" not in decision.status.blocked_reasons


def test_a_deleted_groups_grading_stays_spent(tmp_path: Path) -> None:
    from tests.unit.test_control_support import group_doc

    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.groups.apply_group("demo", group_doc("evals"))
        # What its case records say its grading cost (`EvaluationService.grading_usd`).
        budgets.grading = lambda key: Decimal("0.30") if key == ("demo", "evals") else Decimal(0)
        await budgets.apply_budget("demo", budget_doc("1"))
        assert (await budgets.get_budget("demo", "default"))["status"]["spentUSD"] == "0.30"
        await plane.services.groups.delete_group("demo", "evals")
        await until(lambda: ("demo", "evals") not in plane.services.registry.groups, what="the group gone")
        restarted = await plane.restart()
        view = await restarted.services.budgets.get_budget("demo", "default")
        assert view["status"]["spentUSD"] == "0.30"

    asyncio.run(scenario())


def test_a_parked_run_goes_on_when_another_run_frees_what_it_held(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        await budgets.apply_budget("demo", budget_doc("1.00"))
        await plane.services.agents.apply_agent("demo", agent_doc())
        for name in ("r1", "r2", "r3"):
            await plane.services.runs.create_run("demo", run_doc(name))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="r1's actor")
        (second,) = await until(lambda: plane.run_actors.of("r2"), what="r2's actor")
        (third,) = await until(lambda: plane.run_actors.of("r3"), what="r3's actor")
        assert await budgets.reserve_budget("demo", "r1", "0.80") is True
        assert await budgets.reserve_budget("demo", "r2", "0.30") is False
        assert await budgets.reserve_budget("demo", "r3", "0.60") is False
        second.end({"phase": "Waiting", "reason": "BudgetExceeded", "budgetNeededUSD": "0.30"})
        third.end({"phase": "Waiting", "reason": "BudgetExceeded", "budgetNeededUSD": "0.60"})
        for name in ("r2", "r3"):
            await until(lambda n=name: plane.stored_phase(n) == "Waiting", what=f"{name} parked")
        # r1 ends having spent 0.50 of the 0.80 it held: 0.50 is left, which holds r2's step
        # (not r3's as well): r2 goes on at once, r3 waits.
        cost = {"totalUSD": "0.50", "billedUSD": "0.50"}
        first.end(
            {"phase": "Succeeded", "reason": "Completed", "cost": cost, "finishedAt": "2026-12-01T00:00:01Z"}
        )
        await until(lambda: plane.run_actors.of("r2")[1:], what="a new actor for r2")
        assert plane.run_actors.of("r3") == [third]
        assert plane.stored_phase("r3") == "Waiting"

    asyncio.run(scenario())


def test_a_restarted_service_still_knows_what_each_parked_run_needs(tmp_path: Path) -> None:
    # The need is kept in the parked run's status (waitingFor.budgetUSD): after a restart a
    # freed hold lets the runs it fits go on, as before it.
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        await budgets.apply_budget("demo", budget_doc("1.00"))
        await plane.services.agents.apply_agent("demo", agent_doc())
        for name in ("r1", "r2", "r3"):
            await plane.services.runs.create_run("demo", run_doc(name))
        await until(lambda: plane.run_actors.of("r1"), what="r1's actor")
        (second,) = await until(lambda: plane.run_actors.of("r2"), what="r2's actor")
        (third,) = await until(lambda: plane.run_actors.of("r3"), what="r3's actor")
        assert await budgets.reserve_budget("demo", "r1", "0.80") is True
        second.end({"phase": "Waiting", "reason": "BudgetExceeded", "budgetNeededUSD": "0.30"})
        third.end({"phase": "Waiting", "reason": "BudgetExceeded", "budgetNeededUSD": "0.60"})
        for name in ("r2", "r3"):
            await until(lambda n=name: plane.stored_phase(n) == "Waiting", what=f"{name} parked")
        assert plane.services.registry.runs[("demo", "r2")]["status"]["waitingFor"] == {"budgetUSD": "0.30"}
        restarted = await plane.restart()
        services = restarted.services
        # A run the restarted service alone supervises frees what it held: 0.50 is left, which
        # holds r2's step (not r3's as well).
        await services.runs.create_run("demo", run_doc("r4"))
        (fourth,) = await until(lambda: restarted.run_actors.of("r4"), what="r4's actor")
        assert await services.budgets.reserve_budget("demo", "r4", "0.80") is True
        cost = {"totalUSD": "0.50", "billedUSD": "0.50"}
        fourth.end(
            {"phase": "Succeeded", "reason": "Completed", "cost": cost, "finishedAt": "2026-12-01T00:00:01Z"}
        )
        await until(lambda: restarted.run_actors.of("r2")[1:], what="a new actor for r2")
        assert restarted.run_actors.of("r3") == [third]
        assert services.registry.runs[("demo", "r3")]["status"]["phase"] == "Waiting"

    asyncio.run(scenario())


def test_a_replaying_runs_lower_report_does_not_give_back_what_it_spent(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        await budgets.apply_budget("demo", budget_doc("1.00"))
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        await until(lambda: plane.run_actors.of("r1"), what="r1's actor")
        await plane.services.runs.report("demo", "r1", {"cost": {"totalUSD": "0.40", "billedUSD": "0.40"}})
        assert (await budgets.get_budget("demo", "default"))["status"]["spentUSD"] == "0.40"
        # A resumed actor reports its cost again as it replays its journal, from zero up.
        await plane.services.runs.report("demo", "r1", {"cost": {"totalUSD": "0.10", "billedUSD": "0.10"}})
        assert (await budgets.get_budget("demo", "default"))["status"]["spentUSD"] == "0.40"
        assert await budgets.reserve_budget("demo", "r2", "0.61") is False

    asyncio.run(scenario())


def test_the_control_plane_tells_a_projects_groups_what_the_budget_holds(tmp_path: Path) -> None:
    from tests.unit.test_control_support import group_doc

    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        await plane.services.agents.apply_agent("demo", agent_doc(perRunMaxCostUSD="0.10"))
        await plane.services.groups.apply_group("demo", group_doc("batch"))
        snapshot = await plane.services.group_link.group_snapshot("demo", "batch")
        assert snapshot["budgetLeftUSD"] is None  # no Budget: nothing holds the group back
        await budgets.apply_budget("demo", budget_doc("2.00"))
        supervisor = plane.group_actors.supervisors[("demo", "batch")]
        assert supervisor.called("budget")[-1] == ("2.00",)
        await budgets.patch_budget("demo", "default", {"spec": {"maxCostUSD": "3.00"}})
        assert supervisor.called("budget")[-1] == ("3.00",)
        snapshot = await plane.services.group_link.group_snapshot("demo", "batch")
        assert snapshot["budgetLeftUSD"] == "3.00"
        await budgets.delete_budget("demo", "default")
        assert supervisor.called("budget")[-1] == (None,)

    asyncio.run(scenario())


def test_grading_is_held_against_the_budget_and_waits_for_room(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        budgets = plane.services.budgets
        group = ("demo", "evals")
        assert await budgets.hold_grading(group, "evals-a", Decimal("0.003"), 0) is True  # no Budget
        budgets.release_grading(group, "evals-a")
        await budgets.apply_budget("demo", budget_doc("0.002"))
        assert await budgets.hold_grading(group, "evals-a", Decimal("0.003"), 0) is False
        waiting = asyncio.ensure_future(budgets.hold_grading(group, "evals-a", Decimal("0.003"), 30))
        await asyncio.sleep(0)  # it tried, and waits for room
        assert not waiting.done()
        await budgets.patch_budget("demo", "default", {"spec": {"maxCostUSD": "0.004"}})
        assert await waiting is True
        view = await budgets.get_budget("demo", "default")
        assert (view["status"]["reservedUSD"], view["status"]["leftUSD"]) == ("0.003", "0.001")
        assert await budgets.reserve_budget("demo", "r1", "0.002") is False  # the hold counts
        budgets.release_grading(group, "evals-a")
        assert (await budgets.get_budget("demo", "default"))["status"]["reservedUSD"] == "0"

    asyncio.run(scenario())
