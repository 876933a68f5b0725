"""Every phase change of a run or a group goes through the lifecycle, and an illegal one raises.

The control plane's services over real local storage, with the fake actors of
`test_control_support`: what a run actor reports or returns, and what a group's supervisor
pushes, is checked against `nodus.lifecycle` before anything is written. An illegal change is
a bug somewhere, so it is made loud: the report is refused, and an outcome that cannot be
recorded fails the run (InternalError, naming the transition) instead of leaving it hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nodus.lifecycle import IllegalTransition
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, run_doc

T = TypeVar("T")


async def _until(condition: Callable[[], T | None], what: str, timeout: float = 10.0) -> T:
    """Let the services' tasks run until ``condition`` holds; fail naming ``what`` after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0)


def _stored(plane: Plane, run: str) -> dict[str, Any]:
    status: dict[str, Any] = plane.storage.read_json(f"projects/demo/agentruns/{run}/run.json")["status"]
    return status


async def _running(plane: Plane, run: str) -> Any:
    await plane.services.agents.apply_agent("demo", agent_doc())
    await plane.services.runs.create_run("demo", run_doc(run))
    actor = await _until(lambda: (plane.run_actors.of(run) or [None])[0], "the run's actor")
    await _until(lambda: _stored(plane, run)["phase"] == "Running", "the actor's Running report")
    return actor


def test_a_report_that_moves_a_run_backwards_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await _running(plane, "r1")
        before = _stored(plane, "r1")
        with pytest.raises(IllegalTransition) as illegal:
            await plane.services.runs.report("demo", "r1", {"phase": "Pending", "reason": "GroupWait"})
        assert (illegal.value.frm, illegal.value.to) == ("Running", "Pending")
        assert _stored(plane, "r1") == before
        assert (await plane.services.runs.get_run("demo", "r1"))["status"]["phase"] == "Running"
        # A legal report still goes through.
        await plane.services.runs.report("demo", "r1", {"cost": {"totalUSD": "0.01"}})
        assert _stored(plane, "r1")["cost"]["totalUSD"] == "0.01"

    asyncio.run(scenario())


def test_an_outcome_the_lifecycle_forbids_fails_the_run_naming_the_transition(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        actor = await _running(plane, "r1")
        actor.end({"phase": "Pending", "reason": "GroupWait"})  # no program ends by going back
        status = await _until(
            lambda: _stored(plane, "r1") if _stored(plane, "r1")["phase"] == "Failed" else None,
            "the run to fail",
        )
        assert status["reason"] == "InternalError"
        assert "'Running' to 'Pending'" in status["message"]
        assert await _until(lambda: plane.run_actors.live == {}, "the actor to be ended")

    asyncio.run(scenario())


def test_a_finished_run_stays_finished_whatever_is_reported_after(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        actor = await _running(plane, "r1")
        actor.end({"phase": "Succeeded", "reason": "Completed"})
        await _until(lambda: _stored(plane, "r1")["phase"] == "Succeeded", "the run to succeed")
        # A late report of an actor that was being ended is dropped, not an illegal transition.
        await plane.services.runs.report("demo", "r1", {"phase": "Running"})
        assert _stored(plane, "r1")["phase"] == "Succeeded"

    asyncio.run(scenario())


def test_a_group_cannot_leave_cancelling_for_running(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.groups.apply_group("demo", group_doc("g"), mode="create")
        link = plane.services.group_link
        await link.group_status("demo", "g", {"phase": "Cancelling"}, {})
        with pytest.raises(IllegalTransition) as illegal:
            await link.group_status("demo", "g", {"phase": "Running"}, {})
        assert (illegal.value.kind, illegal.value.frm, illegal.value.to) == (
            "AgentGroup",
            "Cancelling",
            "Running",
        )
        group = await plane.services.groups.get_group("demo", "g")
        assert group["status"]["phase"] == "Cancelling"
        await link.group_status("demo", "g", {"phase": "Cancelled"}, {})
        assert (await plane.services.groups.get_group("demo", "g"))["status"]["phase"] == "Cancelled"

    asyncio.run(scenario())
