"""RunService over real local storage: acceptance, batches, idempotency, reports, cancel, delete."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus.errors import Conflict, NotFound
from tests.unit.test_control_support import agent_doc, make_plane, run_doc, until


def test_a_run_is_stored_pinned_to_its_agent_then_given_an_actor(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc(perRunMaxCostUSD="0.50"))
        created = await plane.services.runs.create_run("demo", run_doc("r1", deadline="10m"))
        run = created["resource"]
        assert created["result"] == "created"
        assert run["status"]["phase"] == "Pending" and run["status"]["agentRevision"] == 1
        assert run["status"]["cost"]["limitUSD"] == "0.50"
        assert run["status"]["sandbox"]["uid"] == 300_000 and run["status"]["deadlineAt"]
        assert (
            plane.storage.read_json("projects/demo/agentruns/r1/run.json")["metadata"]["uid"]
            == run["metadata"]["uid"]
        )
        assert plane.storage.read_json("projects/demo/agentruns/r1/agent.json")["status"]["revision"] == 1
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        live = await plane.services.runs.get_run("demo", "r1")  # the answer was a copy, as written
        assert actor.name == live["status"]["actorName"] and live["status"]["attempts"] == 1
        assert (
            plane.storage.read_json("projects/demo/agentruns/r1/run.json")["status"]["actorName"]
            == actor.name
        )
        second = await plane.services.runs.create_run("demo", run_doc("r2"))
        assert second["resource"]["status"]["sandbox"]["uid"] == 300_001  # one uid per run

    asyncio.run(scenario())


def test_refusals_of_a_run_name_their_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        runs = plane.services.runs
        with pytest.raises(NotFound) as no_agent:
            await runs.create_run("demo", run_doc("r1"))
        assert no_agent.value.details["field"] == "spec.agent"
        await plane.services.agents.apply_agent("demo", agent_doc())
        await runs.create_run("demo", run_doc("r1"))
        with pytest.raises(Conflict) as exists:
            await runs.create_run("demo", run_doc("r1"))
        assert exists.value.code == "AlreadyExists"
        assert (await runs.create_run("demo", run_doc("r1"), mode="apply"))["result"] == "unchanged"
        with pytest.raises(Conflict, match="cannot change"):
            await runs.create_run("demo", run_doc("r1", input="other"), mode="apply")
        await plane.services.agents.apply_agent("demo", agent_doc("stopped", state="Stopped"))
        with pytest.raises(Conflict) as stopped:
            await runs.create_run("demo", run_doc("r2", agent="stopped"))
        assert stopped.value.code == "AgentStopped"
        assert plane.storage.list_dir("projects/demo/agentruns") == ["r1"]

    asyncio.run(scenario())


def _batch(*names: str, agent: str = "helper") -> dict[str, object]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRunList",
        "items": [run_doc(n, agent=agent) for n in names],
    }


def test_a_batch_is_all_or_nothing_and_an_idempotency_key_replays_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        runs = plane.services.runs
        await plane.services.agents.apply_agent("demo", agent_doc())
        batch = _batch("a", "b")
        batch["items"][1]["spec"]["agent"] = "missing"  # type: ignore[index]
        with pytest.raises(NotFound) as refused:
            await runs.create_runs("demo", batch)
        assert refused.value.message.startswith("items[1]: ")
        assert plane.storage.list_dir("projects/demo/agentruns") == []

        first = await runs.create_runs("demo", _batch("a", "b"), idempotency_key="k1")
        assert first["replayed"] is False and [r["metadata"]["name"] for r in first["items"]] == ["a", "b"]
        again = await runs.create_runs("demo", _batch("a", "b"), idempotency_key="k1")
        assert again == {"items": first["items"], "replayed": True}
        with pytest.raises(Conflict) as reused:
            await runs.create_runs("demo", _batch("c"), idempotency_key="k1")
        assert reused.value.code == "IdempotencyKeyReused"

        restarted = await plane.restart()  # the key's answer survives a restart
        replayed = await restarted.services.runs.create_runs("demo", _batch("a", "b"), idempotency_key="k1")
        assert replayed["replayed"] is True and replayed["items"] == first["items"]

    asyncio.run(scenario())


def test_an_unanswered_batch_is_rolled_back_when_the_control_plane_starts(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("kept"))
        batches = plane.services.registry.batches
        batches.begin("demo", None, "digest", ["half"])  # a crash after the first run was written
        plane.storage.write_json("projects/demo/agentruns/half/run.json", {"not": "complete"})
        restarted = await plane.restart()
        assert sorted(restarted.services.registry.runs) == [("demo", "kept")]
        assert plane.storage.list_dir("projects/demo/agentruns") == ["kept"]
        assert batches.pending("demo") == []

    asyncio.run(scenario())


def test_reports_are_merged_and_written_and_a_finished_run_takes_none(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        runs = plane.services.runs
        await plane.services.agents.apply_agent("demo", agent_doc())
        await runs.create_run("demo", run_doc("r1"))
        before = (await runs.get_run("demo", "r1"))["metadata"].get("resourceVersion") or 0
        await runs.report("demo", "r1", {"phase": "Running", "cost": {"totalUSD": "0.25"}})
        stored = plane.storage.read_json("projects/demo/agentruns/r1/run.json")
        assert stored["status"]["phase"] == "Running" and stored["status"]["cost"]["totalUSD"] == "0.25"
        assert stored["status"]["cost"]["limitUSD"] == "1.00"  # merged, not replaced
        assert stored["metadata"]["resourceVersion"] > before
        credits = await plane.services.credits.get_credits("demo")
        assert credits["spentUSD"] == "0.25"

        cancelled = await runs.cancel_run("demo", "r1")
        assert cancelled["status"]["phase"] == "Cancelled" and cancelled["status"]["reason"] == "Cancelled"
        await runs.report("demo", "r1", {"phase": "Running"})
        assert (await runs.get_run("demo", "r1"))["status"]["phase"] == "Cancelled"
        assert (await runs.cancel_run("demo", "r1"))["status"]["finishedAt"] == cancelled["status"][
            "finishedAt"
        ]

    asyncio.run(scenario())


def test_cancel_stops_the_actor_and_delete_removes_everything(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        runs = plane.services.runs
        await plane.services.agents.apply_agent("demo", agent_doc())
        await runs.create_run("demo", run_doc("r1"))
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        await until(lambda: actor.run.calls, what="the supervisor awaiting the actor's program")
        await runs.cancel_run("demo", "r1")
        # Killed by the cancel, then again by its supervision as that ended, without a replacement.
        await until(lambda: plane.run_actors.kills.count(actor.name) == 2, what="the run's supervision over")
        assert actor.cancelled and actor.killed and plane.run_actors.live == {}
        assert len(plane.run_actors.of("r1")) == 1  # no replacement for a cancelled run
        with pytest.raises(Conflict) as no_answer:
            await runs.run_answer("demo", "r1")
        assert no_answer.value.code == "AnswerNotReady"

        await runs.delete_run("demo", "r1")
        assert plane.storage.list_dir("projects/demo/agentruns") == []
        with pytest.raises(NotFound):
            await runs.get_run("demo", "r1")
        restarted = await plane.restart()
        assert restarted.services.registry.runs == {}

    asyncio.run(scenario())


def test_a_restarted_control_plane_reattaches_to_the_live_actor(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        await until(lambda: plane.stored_phase("r1") == "Running", what="the actor's Running report stored")
        restarted = await plane.restart()
        await until(lambda: actor.run.calls == 2, what="the restarted control plane awaiting the actor")
        assert plane.run_actors.of("r1") == [actor]  # found by its recorded name, not replaced
        actor.end({"phase": "Succeeded", "reason": "Completed", "answer": {"preview": "hi"}})
        await until(lambda: plane.stored_phase("r1") == "Succeeded", what="the outcome stored")
        run = await restarted.services.runs.get_run("demo", "r1")
        assert run["status"]["phase"] == "Succeeded" and run["status"]["finishedAt"]
        assert (
            plane.storage.read_json("projects/demo/agentruns/r1/run.json")["status"]["phase"] == "Succeeded"
        )

    asyncio.run(scenario())
