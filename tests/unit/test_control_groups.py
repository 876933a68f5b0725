"""GroupService and GroupLink over real local storage, with fake supervisors: groups, updates, members."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus.errors import Conflict, Invalid, NotFound
from nodus_ray.core.admission import AdmissionError
from tests.unit.test_control_support import agent_doc, group_doc, make_plane, run_doc, until


def test_a_group_is_stored_and_its_supervisor_loaded(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        groups = plane.services.groups
        with pytest.raises(NotFound) as no_agent:
            await groups.apply_group("demo", group_doc("g"))
        assert no_agent.value.details["field"] == "spec.agent"
        await plane.services.agents.apply_agent("demo", agent_doc())
        with pytest.raises(Invalid) as cancelled:
            await groups.apply_group("demo", group_doc("g", state="Cancelled"))
        assert cancelled.value.details["field"] == "spec.state"
        created = await groups.apply_group("demo", group_doc("g", maxCostUSD="2.00"), mode="create")
        assert created["result"] == "created" and created["resource"]["status"]["phase"] == "Running"
        assert (
            plane.storage.read_json("projects/demo/agentgroups/g/group.json")["spec"]["maxCostUSD"] == "2.00"
        )
        assert plane.group_actors.supervisors[("demo", "g")].called("load")
        with pytest.raises(Conflict) as exists:
            await groups.apply_group("demo", group_doc("g"), mode="create")
        assert exists.value.code == "AlreadyExists"
        assert (await groups.apply_group("demo", group_doc("g", maxCostUSD="2.00")))["result"] == "unchanged"

    asyncio.run(scenario())


def test_one_way_switches_and_the_cap_refuse_going_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        groups = plane.services.groups
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.agents.apply_agent("demo", agent_doc("other"))
        await groups.apply_group("demo", group_doc("g", maxCostUSD="2.00", sealed=True))
        with pytest.raises(Conflict) as lowered:
            await groups.apply_group("demo", group_doc("g", maxCostUSD="1.00", sealed=True))
        assert lowered.value.code == "CapLowered"
        with pytest.raises(Conflict) as unsealed:
            await groups.patch_group("demo", "g", {"spec": {"sealed": False}})
        assert unsealed.value.code == "GroupSealed"
        with pytest.raises(Invalid) as agent:
            await groups.apply_group("demo", group_doc("g", agent="other", maxCostUSD="2.00"))
        assert agent.value.code == "FieldImmutable"
        assert (
            plane.storage.read_json("projects/demo/agentgroups/g/group.json")["spec"]["maxCostUSD"] == "2.00"
        )
        raised = await groups.apply_group("demo", group_doc("g", maxCostUSD="3.00"))  # sealed is kept
        assert raised["result"] == "configured" and raised["resource"]["spec"]["sealed"] is True
        supervisor = plane.group_actors.supervisors[("demo", "g")]
        assert supervisor.called("configure")[-1] == (
            {"maxActive": 10, "maxPending": 10000, "maxCostUSD": "3.00"},
            True,
            False,
        )

    asyncio.run(scenario())


def test_a_member_waits_queued_until_its_supervisor_admits_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        groups, runs, link = plane.services.groups, plane.services.runs, plane.services.group_link
        await plane.services.agents.apply_agent("demo", agent_doc())
        await groups.apply_group("demo", group_doc("g"))
        created = await runs.create_run("demo", run_doc("g-t1", group="g", taskKey="t1"))
        assert created["resource"]["status"]["reason"] == "GroupWait"
        assert created["resource"]["status"]["groupIndex"] == 0
        # An ungrouped run created after it gets its actor: by then a queued one would have had its own.
        await runs.create_run("demo", run_doc("alone"))
        await until(lambda: plane.run_actors.of("alone"), what="the ungrouped run's actor")
        assert plane.run_actors.of("g-t1") == []  # queued: no actor
        supervisor = plane.group_actors.supervisors[("demo", "g")]
        (wires,) = supervisor.called("add")[0]
        assert [(w.key, w.run, w.cap) for w in wires] == [("t1", "g-t1", "1.00")]
        assert await link.start_member("demo", "g-t1") is True
        assert plane.storage.read_json("projects/demo/agentruns/g-t1/run.json")["status"]["admittedAt"]
        assert await link.start_member("demo", "g-t1") is True  # idempotent: a retried start
        await until(lambda: plane.run_actors.of("g-t1"), what="the admitted member's actor")
        assert len(plane.run_actors.of("g-t1")) == 1
        await runs.report("demo", "g-t1", {"phase": "Running"})
        assert supervisor.called("progressed")[-1] == ("g-t1", "Active", "0", None)
        snapshot = await link.group_snapshot("demo", "g")
        assert [(m.run, m.state) for m in snapshot["members"]] == [("g-t1", "Active")]
        with pytest.raises(Conflict) as member:
            await runs.delete_run("demo", "g-t1")
        assert member.value.code == "GroupMember"

    asyncio.run(scenario())


def test_members_are_refused_by_reason_and_nothing_is_stored(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        groups, runs = plane.services.groups, plane.services.runs
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.agents.apply_agent("demo", agent_doc("other"))
        await groups.apply_group("demo", group_doc("g"))
        with pytest.raises(Invalid) as mismatch:
            await runs.create_run("demo", run_doc("g-t1", agent="other", group="g", taskKey="t1"))
        assert mismatch.value.code == "AgentMismatch"
        with pytest.raises(NotFound) as no_group:
            await runs.create_run("demo", run_doc("nope-t1", group="nope", taskKey="t1"))
        assert no_group.value.details["field"] == "spec.group"
        supervisor = plane.group_actors.supervisors[("demo", "g")]
        supervisor.refusal = AdmissionError(
            "Conflict", "MaxPendingReached", "the group has 1 pending runs", index=0
        )
        with pytest.raises(Conflict) as full:
            await runs.create_run("demo", run_doc("g-t1", group="g", taskKey="t1"))
        assert full.value.code == "MaxPendingReached"
        supervisor.refusal = None
        await groups.patch_group("demo", "g", {"spec": {"sealed": True}})
        with pytest.raises(Conflict) as sealed:
            await runs.create_run("demo", run_doc("g-t1", group="g", taskKey="t1"))
        assert sealed.value.code == "GroupSealed"
        assert plane.storage.list_dir("projects/demo/agentruns") == []

    asyncio.run(scenario())


def test_deleting_a_group_deletes_its_runs_and_a_restart_resumes_only_admitted_members(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        groups, runs, link = plane.services.groups, plane.services.runs, plane.services.group_link
        await plane.services.agents.apply_agent("demo", agent_doc())
        await groups.apply_group("demo", group_doc("g"))
        await runs.create_run("demo", run_doc("g-a", group="g", taskKey="a"))
        await runs.create_run("demo", run_doc("g-q", group="g", taskKey="q"))
        await link.start_member("demo", "g-a")
        await until(lambda: plane.stored_phase("g-a") == "Running", what="the started member's report")
        plane.run_actors.live.clear()  # the cluster went down with the control plane
        restarted = await plane.restart()
        await until(lambda: plane.run_actors.of("g-a")[1:], what="the started member's actor replaced")
        assert len(plane.run_actors.of("g-a")) == 2 and plane.run_actors.of("g-q") == []
        supervisor = plane.group_actors.supervisors[("demo", "g")]
        assert supervisor.called("reconcile")[-1][0][0]["run"] == "g-a"  # started members re-reported
        assert [
            r["metadata"]["name"] for r in await restarted.services.runs.list_runs("demo", group="g")
        ] == [
            "g-a",
            "g-q",
        ]

        await restarted.services.groups.delete_group("demo", "g")
        assert plane.storage.list_dir("projects/demo/agentruns") == []
        assert plane.storage.list_dir("projects/demo/agentgroups") == []
        assert ("demo", "g") in plane.group_actors.released
        with pytest.raises(NotFound):
            await restarted.services.groups.get_group("demo", "g")

    asyncio.run(scenario())
