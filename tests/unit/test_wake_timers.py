"""Parked Python runs without Ray: status.program, wake timers, and messages by name."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nodus_ray.control.registry import Registry
from nodus_ray.control.wake_timers import WakeTimers
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import format_timestamp
from tests.unit.test_control_support import Plane, agent_doc, make_plane, run_doc, until

PROGRAM = {"main.py": "def main(ctx, input):\n    return input\n"}


async def python_agent(plane: Plane, name: str = "py", **spec: Any) -> dict[str, Any]:
    """A deployed Agent whose runs are a Python program (its source uploaded first)."""
    ref = await plane.services.agents.sources.upload_source("demo", dict(PROGRAM))
    source = {key: ref[key] for key in ("digest", "files", "bytes")}
    document = agent_doc(name, source=source, entrypoint="main:main", **spec)
    return await plane.services.agents.apply_agent("demo", document)


def in_seconds(seconds: float) -> str:
    return format_timestamp(datetime.now(UTC) + timedelta(seconds=seconds))


def test_a_python_agents_run_says_so_and_a_claude_run_does_not(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.agents.apply_agent("demo", agent_doc("claude"))
        python = (await plane.services.runs.create_run("demo", run_doc("p1", agent="py")))["resource"]
        claude = (await plane.services.runs.create_run("demo", run_doc("c1", agent="claude")))["resource"]
        assert python["status"]["program"] == "Python"
        assert "program" not in claude["status"]
        stored = plane.storage.read_json("projects/demo/agentruns/p1/run.json")
        assert stored["status"]["program"] == "Python"

    asyncio.run(scenario())


def test_a_sleeping_run_holds_no_actor_and_its_timer_starts_a_new_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        wake_at = in_seconds(0.3)
        first.end({"phase": "Waiting", "reason": "Sleeping", "wakeAt": wake_at})
        await until(lambda: first.killed, what="the sleeping run's actor given back")
        run = await plane.services.runs.get_run("demo", "r1")
        assert (run["status"]["phase"], run["status"]["reason"]) == ("Waiting", "Sleeping")
        assert run["status"]["wakeAt"] == wake_at and run["status"]["actorName"] is None
        assert plane.run_actors.live == {} and len(plane.services.supervisor.wake_timers) == 1
        second = (await until(lambda: plane.run_actors.of("r1")[1:], what="a new actor"))[0]
        assert datetime.now(UTC) >= datetime.fromisoformat(wake_at.replace("Z", "+00:00"))
        assert run["status"]["phase"] == "Running" and run["status"]["wakeAt"] is None
        assert len(plane.services.supervisor.wake_timers) == 0
        assert run["status"].get("actorLosses") is None  # given back on purpose, not lost
        second.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.phase("r1") == "Succeeded", what="the run done")

    asyncio.run(scenario())


def test_timers_are_armed_again_after_a_restart_and_a_due_one_fires_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        for name in ("soon", "later"):
            await plane.services.runs.create_run("demo", run_doc(name, agent="py"))
        await until(lambda: len(plane.run_actors.started) == 2, what="both actors")
        soon, later = plane.run_actors.of("soon")[0], plane.run_actors.of("later")[0]
        soon.end({"phase": "Waiting", "reason": "Sleeping", "wakeAt": in_seconds(0.5)})
        later.end({"phase": "Waiting", "reason": "Sleeping", "wakeAt": in_seconds(3600)})
        await until(lambda: soon.killed and later.killed, what="both parked")
        old_timers = plane.services.supervisor.wake_timers
        assert len(old_timers) == 2
        for key in [("demo", "soon"), ("demo", "later")]:
            old_timers.disarm(key)  # the old control plane is gone, and its timers with it
        restarted = await plane.restart()
        timers = restarted.services.supervisor.wake_timers
        assert len(timers) == 2
        await until(lambda: len(restarted.run_actors.of("soon")) == 2, what="the due run woken")
        assert restarted.phase("soon") == "Running" and restarted.phase("later") == "Waiting"
        assert len(restarted.run_actors.of("later")) == 1 and len(timers) == 1

    asyncio.run(scenario())


def test_a_thousand_sleeping_runs_are_a_thousand_timers_and_no_actor(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = Registry(Storage(str(tmp_path / "storage")), batches=None)  # type: ignore[arg-type]
        started: list[tuple[str, str]] = []
        timers = WakeTimers(registry, started.append)
        for index in range(1000):
            status = {"phase": "Waiting", "reason": "Sleeping", "wakeAt": in_seconds(600 + index)}
            registry.runs[("demo", f"r{index}")] = {"spec": {}, "status": status}
        timers.recover()
        assert len(timers) == 1000 and started == []
        timers.arm(("demo", "r1"))  # the same time again: still one timer for the run
        assert len(timers) == 1000
        for key in list(registry.runs):
            timers.disarm(key)
        assert len(timers) == 0

    asyncio.run(scenario())


def test_a_timer_does_nothing_for_a_run_that_went_on_or_waits_for_another_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = Registry(Storage(str(tmp_path / "storage")), batches=None)  # type: ignore[arg-type]
        started: list[tuple[str, str]] = []
        timers = WakeTimers(registry, started.append)
        when = in_seconds(-1)
        key = ("demo", "r1")
        registry.runs[key] = {"metadata": {}, "spec": {}, "status": {"phase": "Running", "wakeAt": None}}
        assert not await timers.wake(key, when)  # it went on already
        registry.runs[key]["status"] = {"phase": "Waiting", "reason": "Sleeping", "wakeAt": in_seconds(60)}
        assert not await timers.wake(key, when)  # it sleeps again, till another time
        registry.runs[key]["status"] = {"phase": "Waiting", "reason": "Suspended", "wakeAt": when}
        assert not await timers.wake(key, when)  # a person suspended it
        registry.runs[key]["status"] = {"phase": "Waiting", "reason": "Sleeping", "wakeAt": when}
        assert await timers.wake(key, when) and started == [key]
        assert registry.runs[key]["status"]["phase"] == "Running"
        assert registry.runs[key]["status"]["wakeAt"] is None

    asyncio.run(scenario())


def test_a_python_run_takes_messages_and_wakes_only_for_the_name_it_waits_for(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py"))  # not keepAlive
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        timeout_at = in_seconds(3600)
        first.end(
            {
                "phase": "Waiting",
                "reason": "AwaitingMessage",
                "wakeAt": timeout_at,
                "waitingFor": {"message": "approval", "after": 0},
            }
        )
        await until(lambda: first.killed, what="the waiting run parked")
        messages = plane.services.messages
        await messages.send_message("demo", "r1", "fyi", message_name="note")
        await asyncio.sleep(0.05)
        assert plane.phase("r1") == "Waiting" and len(plane.run_actors.of("r1")) == 1
        await messages.send_message("demo", "r1", "yes", message_name="approval")
        await until(lambda: plane.run_actors.of("r1")[1:], what="the run woken by its message")
        run = await plane.services.runs.get_run("demo", "r1")
        assert run["status"]["phase"] == "Running"
        assert run["status"]["wakeAt"] is None and run["status"]["waitingFor"] is None
        assert (await messages.next_message("demo", "r1", 0, "approval"))["payload"] == "yes"  # type: ignore[index]
        assert (await messages.next_message("demo", "r1", 0))["name"] == "note"  # type: ignore[index]
        assert await messages.next_message("demo", "r1", 2, "approval") is None
        # Its timeout's timer is gone with the wait; had it fired, it would find the run going on.
        assert len(plane.services.supervisor.wake_timers) == 0
        assert not await plane.services.supervisor.wake_timers.wake(("demo", "r1"), timeout_at)

    asyncio.run(scenario())


def test_a_message_of_its_name_that_came_while_parking_resumes_the_run_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        await plane.services.messages.send_message("demo", "r1", "other", message_name="note")  # seq 1
        first.end(
            {"phase": "Waiting", "reason": "AwaitingMessage", "waitingFor": {"message": "go", "after": 0}}
        )
        await until(lambda: plane.phase("r1") == "Waiting", what="parked: no message named go yet")
        await plane.services.messages.send_message("demo", "r1", "now", message_name="go")  # seq 2
        second = (await until(lambda: plane.run_actors.of("r1")[1:], what="woken"))[0]
        await plane.services.messages.send_message("demo", "r1", "again", message_name="go")  # seq 3
        second.end(
            {"phase": "Waiting", "reason": "AwaitingMessage", "waitingFor": {"message": "go", "after": 2}}
        )
        await until(lambda: plane.run_actors.of("r1")[2:], what="resumed at once: seq 3 was there")
        assert plane.phase("r1") == "Running"

    asyncio.run(scenario())


def test_a_claude_run_that_is_not_keep_alive_still_refuses_messages(tmp_path: Path) -> None:
    async def scenario() -> None:
        from nodus.errors import Conflict

        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        try:
            await plane.services.messages.send_message("demo", "r1", "hi")
        except Conflict as refused:
            assert refused.code == "NotKeepAlive"
        else:
            raise AssertionError("a one-turn Claude run took a message")

    asyncio.run(scenario())


def test_a_message_stored_just_before_a_restart_wakes_its_run_at_recovery(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        waiting = {"message": "approval", "after": 0}
        first.end({"phase": "Waiting", "reason": "AwaitingMessage", "waitingFor": waiting})
        await until(lambda: first.killed, what="parked for its message")
        # The message is written, and the control plane stops before the run is started again.
        message = {"seq": 1, "name": "approval", "payload": "yes", "messageKey": None, "receivedAt": "x"}
        plane.storage.write_json(layout.message("demo", "r1", 1), message)
        restarted = await plane.restart()
        await until(lambda: restarted.run_actors.of("r1")[1:], what="the run woken at recovery")
        assert restarted.phase("r1") == "Running"

    asyncio.run(scenario())


def test_a_cancelled_sleeping_run_leaves_no_timer_behind(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py"))
        (first,) = await until(lambda: plane.run_actors.of("r1"), what="the first actor")
        first.end({"phase": "Waiting", "reason": "Sleeping", "wakeAt": in_seconds(3600)})
        await until(lambda: first.killed, what="parked asleep")
        timers = plane.services.supervisor.wake_timers
        assert len(timers) == 1
        await plane.services.runs.cancel_run("demo", "r1")
        assert len(timers) == 0 and plane.phase("r1") == "Cancelled"

    asyncio.run(scenario())
