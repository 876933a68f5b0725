"""RunSupervisor without Ray: outcomes, replaced actors, lost runners, parked runs, deadlines."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodus_ray.store.timestamps import utc_now
from tests.unit.test_control_support import agent_doc, make_plane, run_doc, until


def test_an_ended_program_is_recorded_and_its_actor_ended(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        uid = (await plane.services.runs.get_run("demo", "r1"))["metadata"]["uid"]
        assert actor.config.workspace == str(tmp_path / "sandboxes" / "demo" / f"r1-{uid}")  # its own
        assert str(tmp_path / "storage") in actor.config.hidden_paths  # the sandbox cannot see storage
        actor.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.stored_phase("r1") == "Succeeded", what="the outcome stored")
        await until(lambda: actor.killed, what="the ended run's actor killed")
        stored = plane.storage.read_json("projects/demo/agentruns/r1/run.json")
        assert stored["status"]["phase"] == "Succeeded" and stored["status"]["finishedAt"]
        assert actor.killed and plane.run_actors.live == {}

    asyncio.run(scenario())


def test_a_dead_actor_is_replaced_by_the_next_attempt_until_the_run_is_lost(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path, max_actor_restarts=1)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        first = (await until(lambda: plane.run_actors.of("r1"), what="the first actor"))[0]
        plane.run_actors.kill(first)  # the node died
        second = (await until(lambda: plane.run_actors.of("r1")[1:], what="the second actor"))[0]
        run = await plane.services.runs.get_run("demo", "r1")
        assert run["status"]["attempts"] == 2 and run["status"]["actorLosses"] == 1
        assert run["status"]["actorName"] == second.name != first.name
        plane.run_actors.kill(second)
        await until(lambda: plane.phase("r1") == "Failed", what="the run failed")
        run = await plane.services.runs.get_run("demo", "r1")
        assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "RunnerLost")
        assert len(plane.run_actors.of("r1")) == 2

    asyncio.run(scenario())


def test_a_run_that_parks_gives_its_actor_back_and_a_message_brings_a_new_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1", keepAlive=True))
        first = (await until(lambda: plane.run_actors.of("r1"), what="the first actor"))[0]
        first.end({"phase": "Waiting", "reason": "AwaitingMessage", "messages": {"read": 0}})
        await until(lambda: plane.phase("r1") == "Waiting", what="the run parked")
        await until(lambda: first.killed, what="the parked run's actor given back")
        run = await plane.services.runs.get_run("demo", "r1")
        assert run["status"]["phase"] == "Waiting" and run["status"]["actorName"] is None
        assert first.killed and len(plane.run_actors.of("r1")) == 1
        receipt = await plane.services.messages.send_message("demo", "r1", "go on")
        assert receipt["seq"] == 1
        await until(lambda: plane.run_actors.of("r1")[1:], what="a new actor for the woken run")
        assert run["status"]["phase"] == "Running"
        assert len(plane.run_actors.of("r1")) == 2  # a new actor replays the journal

    asyncio.run(scenario())


def test_a_message_that_came_while_the_actor_was_ending_resumes_the_run_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1", keepAlive=True))
        await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        await plane.services.messages.send_message("demo", "r1", "early")  # seq 1, not read yet
        plane.run_actors.of("r1")[0].end(
            {"phase": "Waiting", "reason": "AwaitingMessage", "messages": {"read": 0}}
        )
        await until(lambda: plane.run_actors.of("r1")[1:], what="the next actor, at once")
        run = await plane.services.runs.get_run("demo", "r1")
        assert run["status"]["phase"] == "Running" and run["status"]["reason"] is None
        assert len(plane.run_actors.of("r1")) == 2

    asyncio.run(scenario())


def test_a_parked_run_past_its_deadline_fails_without_an_actor(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        run = plane.services.registry.runs[("demo", "r1")]
        run["status"]["deadlineAt"] = utc_now()  # already due
        plane.run_actors.of("r1")[0].end({"phase": "Waiting", "reason": "NeedsResolution", "step": "s1"})
        await until(lambda: plane.stored_phase("r1") == "Failed", what="the parked run failed, stored")
        assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "DeadlineExceeded")
        assert "while waiting (NeedsResolution)" in run["status"]["message"]
        stored = plane.storage.read_json("projects/demo/agentruns/r1/run.json")
        assert stored["status"]["reason"] == "DeadlineExceeded"

    asyncio.run(scenario())


def test_after_a_restart_a_parked_run_waits_and_an_unfinished_one_gets_an_actor(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("parked", keepAlive=True))
        await plane.services.runs.create_run("demo", run_doc("working"))
        await until(lambda: plane.stored_phase("working") == "Running", what="the working run's report")
        parked = (await until(lambda: plane.run_actors.of("parked"), what="the parked run's actor"))[0]
        parked.end({"phase": "Waiting", "reason": "AwaitingMessage"})
        await until(lambda: plane.stored_phase("parked") == "Waiting", what="the run parked, stored")
        await until(lambda: parked.killed, what="the parked run's actor given back")
        for actor in list(plane.run_actors.live.values()):
            plane.run_actors.live.pop(actor.name)  # the whole cluster went down (nothing reports)
        restarted = await plane.restart()
        await until(lambda: plane.run_actors.of("working")[1:], what="the working run's actor replaced")
        assert len(plane.run_actors.of("parked")) == 1  # still parked: no actor for it
        assert len(plane.run_actors.of("working")) == 2  # replaced: attempt 2
        working = await restarted.services.runs.get_run("demo", "working")
        assert working["status"]["attempts"] == 2

    asyncio.run(scenario())


def test_losses_fail_a_run_only_in_a_row_and_its_cost_is_then_the_journals(tmp_path: Path) -> None:
    """A keep-alive run may lose many actors over its life, one at a time: only more than
    NODUS_MAX_ACTOR_RESTARTS in a row (no park between) fail it. Failed by the supervisor, its
    cost is what its journal recorded (the lost actor's last report may lag), and the ledger
    charges exactly that."""
    from nodus_ray.durable.journal import Journal
    from nodus_ray.store import layout

    async def scenario() -> None:
        plane = await make_plane(tmp_path, max_actor_restarts=1)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1", keepAlive=True))
        actors = lambda: plane.run_actors.of("r1")  # noqa: E731
        plane.run_actors.kill((await until(actors, what="the first actor"))[0])  # loss 1
        second = (await until(lambda: actors()[1:], what="the second actor"))[0]
        second.end({"phase": "Waiting", "reason": "AwaitingMessage", "messages": {"read": 0}})
        await until(lambda: plane.phase("r1") == "Waiting", what="the run parked")
        await plane.services.messages.send_message("demo", "r1", "go on")
        third = (await until(lambda: actors()[2:], what="an actor for the message"))[0]
        plane.run_actors.kill(third)  # loss 2 in all, 1 in a row: the run goes on
        fourth = (await until(lambda: actors()[3:], what="the fourth actor"))[0]
        run = await plane.services.runs.get_run("demo", "r1")
        assert (run["status"]["phase"], run["status"]["actorLosses"]) == ("Running", 2)
        # The fourth actor records a model call and dies before it can report it.
        journal = Journal(plane.storage, layout.journal_folder("demo", "r1"))
        await asyncio.to_thread(journal.load)
        await asyncio.to_thread(journal.append, "turn-2/model-1", "model", "Started")
        await asyncio.to_thread(
            journal.append, "turn-2/model-1", "model", "Completed", {"result": {}}, cost_usd="0.0042"
        )
        plane.run_actors.kill(fourth)  # 2 in a row: lost
        await until(lambda: plane.phase("r1") == "Failed", what="the run lost")
        run = await plane.services.runs.get_run("demo", "r1")
        assert run["status"]["reason"] == "RunnerLost", run["status"]
        assert "2 times in a row (3 in all)" in run["status"]["message"]
        assert run["status"]["cost"]["totalUSD"] == "0.0042"
        credits = await plane.services.credits.get_credits("demo")
        assert credits["spentUSD"] == "0.0042" and credits["reservedUSD"] == "0"

    asyncio.run(scenario())
