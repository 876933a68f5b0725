"""Child runs of Python programs without Ray: spawn once, report, wake the parent, cancel the tree."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus.errors import Conflict, Invalid, NotFound
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, run_doc, until
from tests.unit.test_wake_timers import python_agent


async def _parent(plane: Plane, name: str = "p", **spec: object) -> None:
    await plane.services.runs.create_run("demo", run_doc(name, agent="py", **spec))
    await until(lambda: plane.run_actors.of(name), what=f"{name}'s actor")


def test_a_child_is_created_once_of_its_parents_agent_revision(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane, perRunMaxCostUSD="0.50")
        await _parent(plane, deadline="10m")
        children = plane.services.children
        # A redeploy after the parent started: its children still run the parent's revision.
        await python_agent(plane, perRunMaxCostUSD="0.50", system="changed")
        assert plane.services.registry.agents[("demo", "py")]["status"]["revision"] == 2
        answer = await children.spawn_child("demo", "p", "part-1", '{"part": 1}', None, "0.20")
        assert answer == {"name": "p-part-1"}
        child = await plane.services.runs.get_run("demo", "p-part-1")
        parent = await plane.services.runs.get_run("demo", "p")
        assert child["status"]["parent"] == "p" and child["spec"]["agent"] == "py"
        assert child["status"]["agentRevision"] == 1 == parent["status"]["agentRevision"]
        assert plane.storage.read_json(
            "projects/demo/agentruns/p-part-1/agent.json"
        ) == plane.storage.read_json("projects/demo/agentruns/p/agent.json")
        assert child["status"]["cost"]["limitUSD"] == "0.20"  # the program's cap, under the Agent's
        assert child["status"]["program"] == "Python" and "group" not in child["spec"]
        assert child["status"]["deadlineAt"] == parent["status"]["deadlineAt"]  # never past its parent's
        await until(lambda: plane.run_actors.of("p-part-1"), what="the child's actor")
        # The same key and input again (a replay): the same child, nothing created.
        assert await children.spawn_child("demo", "p", "part-1", '{"part": 1}') == {"name": "p-part-1"}
        assert len(plane.run_actors.of("p-part-1")) == 1
        with pytest.raises(Conflict) as reused:
            await children.spawn_child("demo", "p", "part-1", '{"part": 2}')
        assert reused.value.code == "ChildKeyReused"
        assert reused.value.details == {"field": "key", "key": "part-1"}
        big = await children.spawn_child("demo", "p", "big", "x", "1h", "5")
        assert (await plane.services.runs.get_run("demo", big["name"]))["status"]["cost"][
            "limitUSD"
        ] == "0.50"

    asyncio.run(scenario())


def test_bad_keys_and_finished_or_missing_parents_are_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await _parent(plane)
        children = plane.services.children
        for key in ("Part", "-a", "a_b", "", "a" * 62):
            with pytest.raises(Invalid) as refused:
                await children.spawn_child("demo", "p", key, "x")
            assert refused.value.details["field"] == "key"
        with pytest.raises(Invalid) as deadline:
            await children.spawn_child("demo", "p", "k", "x", "forever")
        assert deadline.value.details["field"] == "deadline"
        with pytest.raises(NotFound):
            await children.spawn_child("demo", "nobody", "k", "x")
        await plane.services.runs.create_run("demo", run_doc("p-taken", agent="py"))
        with pytest.raises(Conflict) as taken:
            await children.spawn_child("demo", "p", "taken", "hello")
        assert taken.value.code == "AlreadyExists"
        plane.run_actors.of("p")[0].end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.phase("p") == "Succeeded", what="the parent done")
        with pytest.raises(Conflict) as finished:
            await children.spawn_child("demo", "p", "late", "x")
        assert finished.value.code == "AgentRunFinished"

    asyncio.run(scenario())


def test_children_are_listed_and_reported_in_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await _parent(plane)
        children = plane.services.children
        for key in ("b", "a"):
            await children.spawn_child("demo", "p", key, key)
        listed = await plane.services.runs.list_runs("demo", parent="p")
        assert [run["metadata"]["name"] for run in listed] == ["p-a", "p-b"]
        assert await plane.services.runs.list_runs("demo", parent="p-a") == []
        await until(lambda: plane.run_actors.of("p-a"), what="the child's actor")
        plane.run_actors.of("p-a")[0].end(
            {
                "phase": "Failed",
                "reason": "ProgramFailed",
                "message": "ValueError: no",
                "cost": {"totalUSD": "0.01"},
            }
        )
        await until(lambda: plane.phase("p-a") == "Failed", what="the child failed")
        await until(lambda: plane.phase("p-b") == "Running", what="the other child running")
        status = await children.children_status("demo", "p", ["p-b", "p-a", "p-gone"])
        assert [(s["name"], s["phase"]) for s in status] == [
            ("p-b", "Running"),
            ("p-a", "Failed"),
            ("p-gone", "Cancelled"),
        ]
        assert status[1] == {
            "name": "p-a",
            "phase": "Failed",
            "reason": "ProgramFailed",
            "message": "ValueError: no",
            "costUSD": "0.01",
        }

    asyncio.run(scenario())


def test_a_parent_waiting_for_its_children_wakes_once_they_have_all_ended(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await _parent(plane)
        children = plane.services.children
        names = [(await children.spawn_child("demo", "p", key, key))["name"] for key in ("a", "b")]
        plane.run_actors.of("p")[0].end(
            {"phase": "Waiting", "reason": "AwaitingChildren", "waitingFor": {"children": names}}
        )
        await until(lambda: plane.phase("p") == "Waiting", what="the parent parked")
        await until(lambda: plane.run_actors.of("p")[0].killed, what="the parent's actor given back")
        for name in names:
            await until(lambda name=name: plane.run_actors.of(name), what=f"{name}'s actor")  # type: ignore[misc]
        plane.run_actors.of("p-a")[0].end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.phase("p-a") == "Succeeded", what="one child done")
        await asyncio.sleep(0.05)
        assert plane.phase("p") == "Waiting" and len(plane.run_actors.of("p")) == 1  # one still runs
        plane.run_actors.of("p-b")[0].end({"phase": "Failed", "reason": "ProgramFailed"})
        await until(lambda: plane.run_actors.of("p")[1:], what="the parent woken by its last child")
        parent = await plane.services.runs.get_run("demo", "p")
        assert parent["status"]["phase"] == "Running" and parent["status"]["waitingFor"] is None

    asyncio.run(scenario())


def test_a_parent_parking_for_children_that_ended_meanwhile_goes_on_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await _parent(plane)
        (name,) = [(await plane.services.children.spawn_child("demo", "p", "a", "a"))["name"]]
        (child,) = await until(lambda: plane.run_actors.of(name), what="the child's actor")
        child.end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.phase(name) == "Succeeded", what="the child done")
        plane.run_actors.of("p")[0].end(
            {"phase": "Waiting", "reason": "AwaitingChildren", "waitingFor": {"children": [name]}}
        )
        await until(lambda: plane.run_actors.of("p")[1:], what="the parent going on at once")
        assert plane.phase("p") == "Running"

    asyncio.run(scenario())


def test_cancelling_or_deleting_a_parent_cancels_its_unfinished_children_down_the_tree(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await _parent(plane)
        children = plane.services.children
        await children.spawn_child("demo", "p", "a", "a")
        await children.spawn_child("demo", "p", "b", "b")
        await children.spawn_child("demo", "p-a", "x", "x")  # a grandchild
        await until(lambda: plane.run_actors.of("p-b"), what="p-b's actor")
        plane.run_actors.of("p-b")[0].end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.phase("p-b") == "Succeeded", what="p-b done")
        await plane.services.runs.cancel_run("demo", "p")
        await until(lambda: plane.phase("p-a-x") == "Cancelled", what="the grandchild cancelled")
        await plane.services.children.settled()
        for name in ("p-a", "p-a-x"):
            run = await plane.services.runs.get_run("demo", name)
            assert (run["status"]["phase"], run["status"]["reason"]) == ("Cancelled", "Cancelled")
            assert run["status"]["message"] == "its parent run was cancelled"
        assert plane.phase("p-b") == "Succeeded"  # a finished child stays as it is
        # Deleting a parent that has finished still ends its unfinished children.
        await _parent(plane, "q")
        await children.spawn_child("demo", "q", "a", "a")
        plane.run_actors.of("q")[0].end({"phase": "Succeeded", "reason": "Completed"})
        await until(lambda: plane.phase("q") == "Succeeded", what="q done")
        await plane.services.runs.delete_run("demo", "q")
        assert plane.phase("q-a") == "Cancelled"

    asyncio.run(scenario())


def test_a_child_of_a_group_member_is_not_a_member(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.groups.apply_group("demo", group_doc("g", agent="py"))
        await plane.services.runs.create_run("demo", run_doc("g-t1", agent="py", group="g", taskKey="t1"))
        await plane.services.group_link.start_member("demo", "g-t1")
        await plane.services.children.spawn_child("demo", "g-t1", "sub", "x")
        child = await plane.services.runs.get_run("demo", "g-t1-sub")
        assert "group" not in child["spec"] and "groupIndex" not in child["status"]
        assert plane.services.registry.group_members[("demo", "g")] == ["g-t1"]
        await until(lambda: plane.run_actors.of("g-t1-sub"), what="the child's own actor, not admitted")

    asyncio.run(scenario())


def test_a_parent_whose_children_ended_just_before_a_restart_is_woken_by_recovery(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await _parent(plane)
        (name,) = [(await plane.services.children.spawn_child("demo", "p", "a", "a"))["name"]]
        plane.run_actors.of("p")[0].end(
            {"phase": "Waiting", "reason": "AwaitingChildren", "waitingFor": {"children": [name]}}
        )
        await until(lambda: plane.run_actors.of("p")[0].killed, what="the parent parked")
        # The child's end is written, and the control plane stops before it tells the parent.
        registry = plane.services.registry
        registry.runs[("demo", name)]["status"].update({"phase": "Succeeded", "reason": "Completed"})
        await registry.persist_run(("demo", name))
        restarted = await plane.restart()
        await until(lambda: restarted.run_actors.of("p")[1:], what="the parent woken at recovery")
        assert restarted.phase("p") == "Running"

    asyncio.run(scenario())
