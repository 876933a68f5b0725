"""Suspend, resume and retry without Ray, and an Agent's maxCostUSD over all its runs."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

import pytest

from nodus.errors import Conflict
from nodus_ray.durable.journal import Journal
from nodus_ray.store import layout
from tests.unit.test_control_support import agent_doc, group_doc, make_plane, run_doc, until
from tests.unit.test_wake_timers import in_seconds, python_agent


def test_a_suspended_run_holds_no_actor_until_it_is_resumed(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        await until(lambda: plane.phase("r1") == "Running", what="the run running")
        controls = plane.services.controls
        suspended = await controls.suspend_run("demo", "r1")
        assert (suspended["status"]["phase"], suspended["status"]["reason"]) == ("Waiting", "Suspended")
        assert "on request" in suspended["status"]["message"]
        assert first.killed and not first.cancelled  # killed, not cancelled: its workspace stays
        await asyncio.sleep(0.05)
        assert len(plane.run_actors.of("r1")) == 1 and plane.run_actors.live == {}  # not replaced
        run = await plane.services.runs.get_run("demo", "r1")
        assert not run["status"].get("actorLosses")  # a suspend is no lost actor
        assert plane.stored_phase("r1") == "Waiting"
        assert (await controls.suspend_run("demo", "r1"))["status"]["reason"] == "Suspended"  # idempotent
        # A late outcome of the killed actor changes nothing.
        assert not await plane.services.supervisor.finish(
            ("demo", "r1"), {"phase": "Succeeded", "reason": "Completed"}, actor_outcome=True
        )
        assert plane.phase("r1") == "Waiting"
        resumed = await controls.resume_run("demo", "r1")
        assert resumed["status"]["phase"] == "Running"
        second = (await until(lambda: plane.run_actors.of("r1")[1:], what="a new actor replays"))[0]
        with pytest.raises(Conflict) as again:
            await controls.resume_run("demo", "r1")
        assert again.value.code == "NotSuspended"
        second.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.phase("r1") == "Succeeded", what="the run done")
        with pytest.raises(Conflict) as finished:
            await controls.suspend_run("demo", "r1")
        assert finished.value.code == "AgentRunFinished"

    asyncio.run(scenario())


def test_suspending_a_sleeping_run_stops_its_timer_and_resuming_replays_into_the_sleep(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        first.end({"phase": "Waiting", "reason": "Sleeping", "wakeAt": in_seconds(0.2)})
        await until(lambda: first.killed, what="parked asleep")
        timers = plane.services.supervisor.wake_timers
        suspended = await plane.services.controls.suspend_run("demo", "r1")
        assert suspended["status"]["wakeAt"] is None and len(timers) == 0
        await asyncio.sleep(0.4)
        assert (
            plane.phase("r1") == "Waiting" and len(plane.run_actors.of("r1")) == 1
        )  # the timer did not fire
        await plane.services.controls.resume_run("demo", "r1")
        second = (await until(lambda: plane.run_actors.of("r1")[1:], what="a new actor"))[0]
        second.end({"phase": "Waiting", "reason": "Sleeping", "wakeAt": in_seconds(3600)})  # not due: again
        await until(lambda: len(timers) == 1, what="asleep again, its timer armed")
        assert plane.phase("r1") == "Waiting"

    asyncio.run(scenario())


def test_a_suspended_runs_deadline_still_fires(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py", deadline="1s"))
        await until(lambda: plane.phase("r1") == "Running", what="the run running")
        await plane.services.controls.suspend_run("demo", "r1")
        await until(lambda: plane.phase("r1") == "Failed", timeout=5, what="the deadline")
        run = await plane.services.runs.get_run("demo", "r1")
        assert run["status"]["reason"] == "DeadlineExceeded" and "Suspended" in run["status"]["message"]

    asyncio.run(scenario())


def test_only_a_running_or_waiting_run_is_suspended(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.groups.apply_group("demo", group_doc("g", agent="py"))
        await plane.services.runs.create_run("demo", run_doc("g-t1", agent="py", group="g", taskKey="t1"))
        with pytest.raises(Conflict) as queued:
            await plane.services.controls.suspend_run("demo", "g-t1")
        assert queued.value.code == "NotStarted" and "Pending" in str(queued.value)

    asyncio.run(scenario())


def test_a_retried_run_runs_its_failed_steps_again_and_keeps_its_completed_ones(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py", deadline="1h"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        journal = Journal(plane.storage, layout.journal_folder("demo", "r1"))
        await asyncio.to_thread(journal.load)
        await asyncio.to_thread(
            journal.append, "fetch-1", "step", "Completed", {"result": 1}, cost_usd="0.10"
        )
        await asyncio.to_thread(journal.append, "post-1", "step", "Failed", {"error": {"message": "503"}})
        controls = plane.services.controls
        with pytest.raises(Conflict) as running:
            await controls.retry_run("demo", "r1")
        assert running.value.code == "NotFailed" and "Running" in str(running.value)
        first.end(
            {
                "phase": "Failed",
                "reason": "ProgramFailed",
                "message": "RuntimeError: 503",
                "cost": {"totalUSD": "0.10"},
            }
        )
        await until(lambda: plane.phase("r1") == "Failed", what="the run failed")
        credits = plane.services.credits
        spent = (await credits.get_credits("demo"))["spentUSD"]
        retried = await controls.retry_run("demo", "r1")
        status = retried["status"]
        assert (status["phase"], status["reason"], status["finishedAt"]) == ("Running", None, None)
        assert status["retries"] == 1 and "1 failed step" in status["message"]
        records = await asyncio.to_thread(Journal(plane.storage, layout.journal_folder("demo", "r1")).load)
        assert [(r.step_id, r.state) for r in records] == [
            ("fetch-1", "Completed"),
            ("post-1", "Failed"),
            ("post-1", "NoEffect"),
        ]
        second = (await until(lambda: plane.run_actors.of("r1")[1:], what="the retry's actor"))[0]
        assert second.config.attempt == 2
        assert (await credits.get_credits("demo"))["spentUSD"] == spent  # nothing charged twice
        second.end({"phase": "Succeeded", "reason": "Completed", "cost": {"totalUSD": "0.15"}})
        await until(lambda: plane.phase("r1") == "Succeeded", what="the retried run done")
        after = await credits.get_credits("demo")
        assert Decimal(after["spentUSD"]) == Decimal(spent) + Decimal("0.05")  # its cost went on

    asyncio.run(scenario())


def test_a_retried_run_counts_its_lost_actors_afresh(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path, max_actor_restarts=1)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py"))
        for count in (1, 2):
            actor = (await until(lambda c=count: plane.run_actors.of("r1")[c - 1 :], what="an actor"))[0]  # type: ignore[misc]
            plane.run_actors.kill(actor)
        await until(lambda: plane.phase("r1") == "Failed", what="lost too often")
        await plane.services.controls.retry_run("demo", "r1")
        third = (await until(lambda: plane.run_actors.of("r1")[2:], what="the retry's actor"))[0]
        plane.run_actors.kill(third)  # one loss after the retry: replaced, not failed
        await until(lambda: plane.run_actors.of("r1")[3:], what="a replacement")
        assert plane.phase("r1") != "Failed"

    asyncio.run(scenario())


def test_a_group_member_is_not_retried_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.groups.apply_group("demo", group_doc("g", agent="py"))
        await plane.services.runs.create_run("demo", run_doc("g-t1", agent="py", group="g", taskKey="t1"))
        with pytest.raises(Conflict) as member:
            await plane.services.controls.retry_run("demo", "g-t1")
        assert member.value.code == "InGroup"

    asyncio.run(scenario())


def test_an_agents_max_cost_caps_all_its_runs_together(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent(
            "demo", agent_doc("capped", perRunMaxCostUSD="0.40", maxCostUSD="1.00")
        )
        runs = plane.services.runs
        limits = []
        for name in ("r1", "r2", "r3"):
            created = await runs.create_run("demo", run_doc(name, agent="capped"))
            limits.append(created["resource"]["status"]["cost"]["limitUSD"])
        assert limits == ["0.40", "0.40", "0.20"]
        with pytest.raises(Conflict) as full:
            await runs.create_run("demo", run_doc("r4", agent="capped"))
        assert full.value.code == "MaxCostReached" and "spec.maxCostUSD" in str(full.value)
        assert full.value.details["field"] == "spec.maxCostUSD"
        assert "r4" not in {name for _, name in plane.services.registry.runs}
        # A finished run holds what it cost, no longer its cap.
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="r1's actor")
        actor.end({"phase": "Succeeded", "reason": "Completed", "cost": {"totalUSD": "0.10"}})
        await until(lambda: plane.phase("r1") == "Succeeded", what="r1 done")
        created = await runs.create_run("demo", run_doc("r4", agent="capped"))
        assert created["resource"]["status"]["cost"]["limitUSD"] == "0.30"
        # A batch's runs count each other: all of them or none.
        batch = {"apiVersion": "nodus.dev/v1", "kind": "AgentRunList", "items": []}
        batch["items"] = [run_doc(name, agent="capped") for name in ("b1", "b2")]
        with pytest.raises(Conflict):
            await runs.create_runs("demo", batch)
        assert not {"b1", "b2"} & {name for _, name in plane.services.registry.runs}

    asyncio.run(scenario())


def test_a_child_counts_inside_its_unfinished_parents_hold_of_the_agents_max_cost(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane, perRunMaxCostUSD="0.60", maxCostUSD="1.00")
        runs = plane.services.runs
        await runs.create_run("demo", run_doc("p", agent="py"))  # holds 0.60
        (parent,) = await until(lambda: plane.run_actors.of("p"), what="the parent's actor")
        child = await plane.services.children.spawn_child("demo", "p", "a", "x", None, "0.30")
        assert (await runs.get_run("demo", child["name"]))["status"]["cost"]["limitUSD"] == "0.30"
        # The child's 0.30 is out of the parent's 0.60: 0.40 is left, not 0.10.
        other = await runs.create_run("demo", run_doc("q", agent="py"))
        assert other["resource"]["status"]["cost"]["limitUSD"] == "0.40"
        # Once the parent has finished it holds its own cost; its unfinished child holds its cap.
        parent.end({"phase": "Succeeded", "reason": "Completed", "cost": {"totalUSD": "0.05"}})
        await until(lambda: plane.phase("p") == "Succeeded", what="the parent done")
        assert plane.services.runs._budget.held("demo", "py") == Decimal("0.75")  # 0.05 + 0.30 + 0.40

    asyncio.run(scenario())
