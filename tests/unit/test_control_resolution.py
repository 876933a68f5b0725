"""ResolutionService over a real journal: who may decide, what is written, how the run goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nodus.errors import Conflict, Invalid
from nodus_ray.durable.journal import Journal
from nodus_ray.store import layout
from tests.unit.test_control_support import Plane, agent_doc, make_plane, run_doc, until


async def _uncertain(plane: Plane, name: str = "r1", kind: str = "command") -> dict[str, Any]:
    """A run parked on an uncertain step ``s1`` of ``kind``, as its actor leaves it."""
    await plane.services.agents.apply_agent("demo", agent_doc())
    await plane.services.runs.create_run("demo", run_doc(name))
    (actor,) = await until(lambda: plane.run_actors.of(name), what="the run's actor")
    journal = Journal(plane.storage, layout.journal_folder("demo", name))
    await asyncio.to_thread(journal.load)
    await asyncio.to_thread(journal.append, "s1", kind, "Started", {"command": "make deploy"})
    await asyncio.to_thread(journal.append, "s1", kind, "NeedsResolution", {})
    actor.end({"phase": "Waiting", "reason": "NeedsResolution", "step": "s1"})
    await until(lambda: plane.stored_phase(name) == "Waiting", what="the run parked on its step")
    await until(lambda: actor.killed, what="the parked run's actor given back")
    return await plane.services.runs.get_run("demo", name)


def test_a_completed_decision_is_journaled_and_the_run_goes_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        run = await _uncertain(plane)
        revision = run["metadata"]["resourceVersion"]
        body = {
            "step": "s1",
            "decision": "Completed",
            "revision": revision,
            "result": {"exitCode": 0, "output": "ok"},
        }
        resolved = await plane.services.resolution.resolve_run("demo", "r1", body)
        assert resolved["status"]["phase"] == "Running" and resolved["status"]["step"] is None
        records = await asyncio.to_thread(Journal(plane.storage, layout.journal_folder("demo", "r1")).load)
        assert (records[-1].state, records[-1].payload["result"]["exit_code"]) == ("Resolved", 0)
        await until(lambda: plane.run_actors.of("r1")[1:], what="a new actor for the resolved run")
        assert len(plane.run_actors.of("r1")) == 2  # a new actor replays the journal with the result
        with pytest.raises(Conflict) as twice:  # the step is decided: a second decision is refused
            await plane.services.resolution.resolve_run("demo", "r1", body)
        assert twice.value.code == "StepNotUncertain"

    asyncio.run(scenario())


def test_a_stale_revision_or_another_step_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        run = await _uncertain(plane)
        revision = run["metadata"]["resourceVersion"]
        resolution = plane.services.resolution
        with pytest.raises(Conflict) as stale:
            await resolution.resolve_run(
                "demo", "r1", {"step": "s1", "decision": "NoEffect", "revision": revision - 1}
            )
        assert stale.value.code == "RevisionMismatch"
        with pytest.raises(Conflict) as other:
            await resolution.resolve_run(
                "demo", "r1", {"step": "s2", "decision": "NoEffect", "revision": revision}
            )
        assert other.value.code == "StepNotUncertain"
        with pytest.raises(Invalid) as decision:
            await resolution.resolve_run(
                "demo", "r1", {"step": "s1", "decision": "Maybe", "revision": revision}
            )
        assert decision.value.details["field"] == "decision"
        with pytest.raises(Invalid) as unknown:
            await resolution.resolve_run(
                "demo", "r1", {"step": "s1", "decision": "NoEffect", "revision": 1, "x": 1}
            )
        assert unknown.value.details["field"] == "x"
        records = await asyncio.to_thread(Journal(plane.storage, layout.journal_folder("demo", "r1")).load)
        assert records[-1].state == "NeedsResolution"
        assert (await plane.services.runs.get_run("demo", "r1"))["status"]["phase"] == "Waiting"

    asyncio.run(scenario())


def test_cancelled_fails_the_run_and_a_model_step_cannot_be_completed(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        run = await _uncertain(plane, kind="model")
        revision = run["metadata"]["resourceVersion"]
        resolution = plane.services.resolution
        with pytest.raises(Invalid, match="NoEffect or Cancelled"):
            await resolution.resolve_run(
                "demo", "r1", {"step": "s1", "decision": "Completed", "revision": revision, "result": {}}
            )
        failed = await resolution.resolve_run(
            "demo",
            "r1",
            {"step": "s1", "decision": "Cancelled", "revision": revision, "evidence": "rolled back"},
        )
        assert (failed["status"]["phase"], failed["status"]["reason"]) == ("Failed", "StepCancelled")
        assert failed["status"]["message"].endswith(": rolled back") and failed["status"]["finishedAt"]
        stored = plane.storage.read_json("projects/demo/agentruns/r1/run.json")
        assert stored["status"]["reason"] == "StepCancelled"
        # A run created after it gets its actor: by then the failed one would have had one too.
        await plane.services.runs.create_run("demo", run_doc("r2"))
        await until(lambda: plane.run_actors.of("r2"), what="the later run's actor")
        assert len(plane.run_actors.of("r1")) == 1  # a failed run gets no actor

    asyncio.run(scenario())


def test_checkpoint_seq_refuses_a_decision_on_an_older_or_a_future_journal_position(tmp_path: Path) -> None:
    """000's ``checkpoint_seq``: the decision is taken only on the journal position it was made on."""

    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        run = await _uncertain(plane)
        expected = run["metadata"]["resourceVersion"]
        resolution = plane.services.resolution
        journal = Journal(plane.storage, layout.journal_folder("demo", "r1"))
        position = (await asyncio.to_thread(journal.load))[-1].seq
        base = {"step": "s1", "decision": "NoEffect", "expectedRevision": expected}
        with pytest.raises(Conflict) as stale:
            await resolution.resolve_run("demo", "r1", {**base, "checkpointSeq": position - 1})
        assert stale.value.code == "StaleCheckpoint" and stale.value.details["field"] == "checkpointSeq"
        assert stale.value.details["current"] == position and "checkpoint_seq" in stale.value.message
        with pytest.raises(Invalid) as future:
            await resolution.resolve_run("demo", "r1", {**base, "checkpointSeq": position + 1})
        assert future.value.details["field"] == "checkpointSeq"
        for bad, field in (
            ({"checkpointSeq": "3"}, "checkpointSeq"),
            ({"checkpointSeq": -2}, "checkpointSeq"),
            ({"evidence": {"receipt": 42}}, "evidence.receipt"),
            ({"evidence": ["x"]}, "evidence"),
            ({"revision": expected + 1}, "expectedRevision"),  # both names, disagreeing
        ):
            with pytest.raises(Invalid) as caught:
                await resolution.resolve_run("demo", "r1", {**base, **bad})
            assert caught.value.details["field"] == field, bad
        with pytest.raises(Invalid) as missing:
            await resolution.resolve_run("demo", "r1", {"step": "s1", "decision": "NoEffect"})
        assert missing.value.details["field"] == "expectedRevision"
        records = await asyncio.to_thread(journal.load)
        assert records[-1].state == "NeedsResolution" and records[-1].seq == position  # nothing written
        resolved = await resolution.resolve_run(
            "demo", "r1", {**base, "checkpointSeq": position, "evidence": {"checked": "nothing deployed"}}
        )
        assert resolved["status"]["phase"] == "Running"
        records = await asyncio.to_thread(journal.load)
        assert records[-1].state == "NoEffect"
        assert records[-1].payload["resolution"]["evidence"] == {"checked": "nothing deployed"}

    asyncio.run(scenario())
