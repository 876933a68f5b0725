"""CreditService over real local storage: grants, refusals, reservations, resuming parked runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus.errors import Invalid
from tests.unit.test_control_support import agent_doc, make_plane, run_doc, until


def test_amounts_are_checked_and_grants_are_stored(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path, initial_credits_usd="1.00")
        credits = plane.services.credits
        for amount in ("0", "-1", "abc", "1.0000001", "NaN"):
            with pytest.raises(Invalid) as refused:
                await credits.add_credits("demo", amount)
            assert refused.value.details["field"] == "amountUSD"
        view = await credits.add_credits("demo", "2.50")
        assert (view["grantedUSD"], view["balanceUSD"]) == ("3.50", "3.50")
        assert plane.storage.read_json("projects/demo/credits.json")["grantedUSD"] == "3.50"
        assert await credits.reserve_credits("demo", "r1", "3.00") is True
        assert await credits.reserve_credits("demo", "r2", "1.00") is False  # 0.50 left unreserved

    asyncio.run(scenario())


def test_spend_is_read_back_from_the_runs_after_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path, initial_credits_usd="1.00")
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        await plane.services.runs.report("demo", "r1", {"cost": {"totalUSD": "0.40"}})
        restarted = await plane.restart()
        view = await restarted.services.credits.get_credits("demo")
        assert (view["spentUSD"], view["balanceUSD"]) == ("0.40", "0.60")

    asyncio.run(scenario())


def test_adding_credits_resumes_the_runs_parked_for_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path, initial_credits_usd="0.01")
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        first.end({"phase": "Waiting", "reason": "InsufficientCredits", "creditsNeededUSD": "0.50"})
        await until(lambda: plane.stored_phase("r1") == "Waiting", what="the run parked for credits")
        await until(lambda: first.killed, what="the parked run's actor given back")
        run = await plane.services.runs.get_run("demo", "r1")
        assert (run["status"]["phase"], run["status"]["actorName"]) == ("Waiting", None)
        assert "creditsNeededUSD" not in run["status"]
        await plane.services.credits.add_credits("demo", "1")
        stored = plane.storage.read_json("projects/demo/agentruns/r1/run.json")
        assert (stored["status"]["phase"], stored["status"]["message"]) == ("Running", "credits were added")
        await until(lambda: plane.run_actors.of("r1")[1:], what="a new actor for the resumed run")
        assert len(plane.run_actors.of("r1")) == 2

    asyncio.run(scenario())
