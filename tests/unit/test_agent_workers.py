"""An Agent's workers: ``spec.minWorkers``/``maxWorkers``/``scaledownWindow`` (issue 17, item 7)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nodus.schema_agent import AgentSpec
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, run_doc, until

# -- the schema -------------------------------------------------------------------------------


def test_worker_fields_are_optional_and_left_out_when_unset() -> None:
    assert not {"minWorkers", "maxWorkers", "scaledownWindow"} & set(
        AgentSpec().model_dump(exclude_none=True)
    )
    spec = AgentSpec(minWorkers=0, maxWorkers=1000, scaledownWindow="24h")
    assert (spec.minWorkers, spec.maxWorkers, spec.scaledownWindow) == (0, 1000, "24h")
    assert AgentSpec(minWorkers=64, maxWorkers=64, scaledownWindow="10s").minWorkers == 64


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"maxWorkers": 0}, "maxWorkers"),
        ({"maxWorkers": 1001}, "maxWorkers"),
        ({"maxWorkers": True}, "maxWorkers"),
        ({"minWorkers": -1}, "minWorkers"),
        ({"minWorkers": 65}, "minWorkers"),
        ({"minWorkers": 3, "maxWorkers": 2}, "spec.minWorkers (3) is more than spec.maxWorkers (2)"),
        ({"scaledownWindow": "9s"}, "10s..24h"),
        ({"scaledownWindow": "24h1s"}, "10s..24h"),
        ({"scaledownWindow": "soon"}, "not a duration"),
    ],
)
def test_worker_fields_out_of_range_are_refused_naming_them(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        AgentSpec(**fields)
    assert named in str(caught.value)


def test_only_the_worker_queue_takes_a_running_run_back_to_pending() -> None:
    from nodus.lifecycle import IllegalTransition, check_run_transition, queue_transition

    patch = queue_transition({"phase": "Running", "reason": None}, "1 of 1 workers busy")
    assert patch == {"phase": "Pending", "reason": "MaxWorkersReached", "message": "1 of 1 workers busy"}
    for phase in ("Pending", "Waiting", "Succeeded", "Failed", "Cancelled"):
        with pytest.raises(IllegalTransition):
            queue_transition({"phase": phase})
    with pytest.raises(IllegalTransition):  # no report or outcome does it
        check_run_transition("Running", "Pending")


# -- spec.maxWorkers: the Agent's concurrency limit ---------------------------------------------


def _status(plane: Plane, run: str) -> tuple[str, str | None]:
    status = plane.services.registry.runs[("demo", run)]["status"]
    return status["phase"], status.get("reason")


def _stored(plane: Plane, run: str) -> dict[str, Any]:
    return dict(plane.storage.read_json(f"projects/demo/agentruns/{run}/run.json")["status"])


def test_runs_over_max_workers_wait_pending_and_start_oldest_first_as_workers_free(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc(maxWorkers=2))
        runs = plane.services.runs
        for name in ("r1", "r2", "z-older", "a-newer"):  # names sort unlike creation order
            await runs.create_run("demo", run_doc(name, keepAlive=True))
        await until(lambda: plane.run_actors.of("r1") and plane.run_actors.of("r2"), what="two actors")
        for name in ("z-older", "a-newer"):
            assert _status(plane, name) == ("Pending", "MaxWorkersReached")
            assert plane.run_actors.of(name) == []
        await until(lambda: _stored(plane, "a-newer").get("reason") == "MaxWorkersReached", what="stored")
        assert _stored(plane, "a-newer")["message"].startswith("2 of 2 workers busy")

        plane.run_actors.of("r1")[0].end({"phase": "Succeeded", "reason": "Completed"})  # one ends
        await until(lambda: plane.run_actors.of("z-older"), what="the oldest queued run started")
        await until(lambda: plane.phase("z-older") == "Running", what="its actor's Running report")
        assert _status(plane, "z-older") == ("Running", None)
        assert _status(plane, "a-newer") == ("Pending", "MaxWorkersReached")

        # A parked run holds no worker: the next queued run starts.
        plane.run_actors.of("r2")[0].end(
            {"phase": "Waiting", "reason": "AwaitingMessage", "messages": {"read": 0}}
        )
        await until(lambda: plane.run_actors.of("a-newer"), what="the next queued run started")
        # Woken while the Agent is at its limit, it waits for a worker (no actor yet).
        await plane.services.messages.send_message("demo", "r2", "go on")
        await until(lambda: _status(plane, "r2") == ("Pending", "MaxWorkersReached"), what="r2 queued")
        assert len(plane.run_actors.of("r2")) == 1
        assert plane.services.supervisor.workers.busy("demo", "helper") == 2
        plane.run_actors.of("a-newer")[0].end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.run_actors.of("r2")[1:], what="r2 started again")
        await until(lambda: plane.phase("r2") == "Running", what="r2 Running")

    asyncio.run(scenario())


def test_a_cancelled_queued_run_leaves_the_queue_and_an_agent_without_a_limit_queues_nothing(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc(maxWorkers=1))
        await plane.services.agents.apply_agent("demo", agent_doc("free"))
        runs = plane.services.runs
        for name in ("a", "b", "c"):
            await runs.create_run("demo", run_doc(name))
        for name in ("f1", "f2", "f3"):
            await runs.create_run("demo", run_doc(name, agent="free"))
        await until(lambda: all(plane.run_actors.of(n) for n in ("a", "f1", "f2", "f3")), what="actors")
        await runs.cancel_run("demo", "b")
        plane.run_actors.of("a")[0].end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.run_actors.of("c"), what="c, skipping the cancelled b")
        assert plane.run_actors.of("b") == [] and plane.phase("b") == "Cancelled"

    asyncio.run(scenario())


def test_a_restarted_control_plane_keeps_the_running_runs_and_the_queue_in_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc(maxWorkers=1))
        for name in ("r1", "r2", "r3"):
            await plane.services.runs.create_run("demo", run_doc(name))
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="r1's actor")
        await until(lambda: plane.stored_phase("r1") == "Running", what="r1 Running stored")
        await until(lambda: _stored(plane, "r3").get("reason") == "MaxWorkersReached", what="r3 queued")
        restarted = await plane.restart()
        await until(lambda: actor.run.calls == 2, what="the restarted control plane re-attached to r1")
        assert plane.run_actors.of("r2") == [] and plane.run_actors.of("r3") == []
        assert _status(restarted, "r2") == ("Pending", "MaxWorkersReached")
        assert restarted.services.supervisor.workers.busy("demo", "helper") == 1
        actor.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.run_actors.of("r2"), what="r2, the oldest queued, started")
        assert plane.run_actors.of("r3") == []
        plane.run_actors.of("r2")[0].end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.run_actors.of("r3"), what="then r3")

    asyncio.run(scenario())


def test_group_members_its_group_admitted_still_wait_for_the_agents_limit(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc(maxWorkers=1))
        await plane.services.runs.create_run("demo", run_doc("solo"))
        await until(lambda: plane.run_actors.of("solo"), what="solo's actor")
        await plane.services.groups.apply_group("demo", group_doc("g"))
        await plane.services.runs.create_run("demo", run_doc("g-m1", group="g", taskKey="m1"))
        assert _status(plane, "g-m1") == ("Pending", "GroupWait")
        assert await plane.services.group_link.start_member("demo", "g-m1")  # its group admits it
        await until(lambda: _status(plane, "g-m1") == ("Pending", "MaxWorkersReached"), what="it waits")
        assert plane.run_actors.of("g-m1") == []
        assert plane.services.registry.runs[("demo", "g-m1")]["status"]["admittedAt"]
        plane.run_actors.of("solo")[0].end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.run_actors.of("g-m1"), what="the member started")

    asyncio.run(scenario())


def test_a_raised_limit_starts_the_oldest_queued_runs_when_the_next_one_comes(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc(maxWorkers=1))
        for name in ("a", "b"):
            await plane.services.runs.create_run("demo", run_doc(name))
        await until(lambda: plane.run_actors.of("a"), what="a's actor")
        assert _status(plane, "b") == ("Pending", "MaxWorkersReached")
        await plane.services.agents.apply_agent("demo", agent_doc(maxWorkers=2))
        await plane.services.runs.create_run("demo", run_doc("c"))
        await until(lambda: plane.run_actors.of("b"), what="b, older than c, took the new worker")
        assert plane.run_actors.of("c") == [] and _status(plane, "c") == ("Pending", "MaxWorkersReached")

    asyncio.run(scenario())


def test_a_queued_runs_deadline_still_runs(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc(maxWorkers=1))
        await plane.services.runs.create_run("demo", run_doc("busy"))
        await plane.services.runs.create_run("demo", run_doc("late", deadline="1s"))
        await until(lambda: plane.phase("late") == "Failed", what="the queued run's deadline")
        assert _status(plane, "late") == ("Failed", "DeadlineExceeded") and plane.run_actors.of("late") == []

    asyncio.run(scenario())


# -- spec.minWorkers / scaledownWindow: parked run actors kept for the Agent --------------------


def test_reservations_follow_the_agents_specs() -> None:
    from nodus_ray.control.agent_slots import Reservation, reservations

    agents = {
        ("demo", "warm"): {"spec": {"minWorkers": 2, "scaledownWindow": "1m"}},
        ("demo", "stopped"): {"spec": {"minWorkers": 2, "state": "Stopped"}},
        ("demo", "plain"): {"spec": {"maxWorkers": 3}},
    }
    # A stopped agent keeps none (what it had retires at the next check: it has no window).
    assert reservations(agents) == {("demo", "warm"): Reservation(2, 60.0)}


def _pool(monkeypatch: pytest.MonkeyPatch, nodes: list[str]) -> Any:
    from nodus_ray.control import run_pool

    killed: list[str] = []
    monkeypatch.setattr(run_pool.RunActorPool, "_alive_nodes", lambda self: nodes)
    monkeypatch.setattr(run_pool.RunActorPool, "_create", staticmethod(lambda slots, warm: None))
    monkeypatch.setattr(run_pool.ray, "kill", lambda handle, no_restart=True: killed.append(handle))
    pool = run_pool.RunActorPool(per_node=1)
    pool.killed = killed  # type: ignore[attr-defined]
    return pool


async def _park_all(pool: Any) -> None:
    """Every created slot's actor starts and parks in its ``__init__`` (`claim`)."""
    for slot in list(pool._slots.values()):
        if slot.waiter is None:
            slot.handle = slot.name
            asyncio.get_running_loop().create_task(pool.claim(slot.name))
    await asyncio.sleep(0)


def test_the_pool_keeps_min_workers_for_the_agent_its_runs_take_them_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nodus_ray.control.agent_slots import Reservation

    async def scenario() -> None:
        pool = _pool(monkeypatch, ["node-a", "node-b"])
        warm = ("demo", "warm")
        pool.reservations = {warm: Reservation(3)}
        await pool._refill()
        await _park_all(pool)
        kept = [slot for slot in pool._slots.values() if slot.agent == warm]
        assert len(kept) == 3 and {slot.node for slot in kept} == {"node-a", "node-b"}  # spread
        assert sum(1 for slot in pool._slots.values() if slot.agent is None) == 2  # one generic per node
        taken = pool.take(warm)
        assert taken is not None and taken.agent == warm
        other = pool.take(("demo", "cold"))
        assert other is not None and other.agent is None  # another agent's run never takes them
        await pool._refill()  # a taken one is replaced
        assert sum(1 for slot in pool._slots.values() if slot.agent == warm) == 3

    asyncio.run(scenario())


def test_an_idle_kept_actor_beyond_min_workers_retires_after_the_scaledown_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nodus_ray.control import agent_slots
    from nodus_ray.control.agent_slots import Reservation

    async def scenario() -> None:
        pool = _pool(monkeypatch, ["node-a"])
        warm, gone = ("demo", "warm"), ("demo", "gone")
        pool.reservations = {warm: Reservation(2), gone: Reservation(1)}
        await pool._refill()
        await _park_all(pool)
        pool.reservations = {warm: Reservation(1, window=60.0)}  # lowered; "gone" was deleted
        await pool._refill()
        assert sum(1 for slot in pool._slots.values() if slot.agent == gone) == 0  # no window: at once
        assert sum(1 for slot in pool._slots.values() if slot.agent == warm) == 2  # idle < 60 s: stays
        later = agent_slots.plan(pool._slots.values(), ["node-a"], pool.reservations, 1e12, pool._ready)
        assert later[0] == [] and len(later[1]) == 1  # once idle for the window, one retires
        assert len(pool.killed) == 1

    asyncio.run(scenario())


def test_an_agents_cpu_and_memory_are_its_run_actors_ray_resources() -> None:
    from nodus_ray.runtime.run_config import actor_resources

    assert actor_resources({}) == {}
    assert actor_resources({"cpu": 0.5, "memory": "512Mi"}) == {"num_cpus": 0.5, "memory": float(512 << 20)}
    assert actor_resources({"memory": "2Gi"}) == {"memory": float(2 << 30)}
