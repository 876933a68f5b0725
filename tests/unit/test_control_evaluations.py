"""EvaluationService with the group service, over real storage and a real Environment.

Only the grader and the supervisor are fakes: the cases are planned from nodus/arithmetic-v2,
created as runs, graded when their runs end, recorded to storage, and read back after a restart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus.errors import Conflict, Invalid, NotFound
from tests.unit.test_control_support import agent_doc, group_doc, make_plane, until

ENVIRONMENT = "nodus/arithmetic-v2@2.0.0"


def test_an_evaluation_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        groups = plane.services.groups
        await plane.services.agents.apply_agent("demo", agent_doc())
        with pytest.raises(NotFound) as unknown:
            await groups.apply_group(
                "demo", group_doc("e", evaluation={"environment": "nobody/nothing@1.0.0", "tasks": 1})
            )
        assert unknown.value.code == "EnvironmentNotFound"
        with pytest.raises(Invalid) as split:
            await groups.apply_group(
                "demo", group_doc("e", evaluation={"environment": ENVIRONMENT, "tasks": 1, "split": "nope"})
            )
        assert split.value.details["field"] == "spec.evaluation.split"
        with pytest.raises(Invalid) as sealed:
            await groups.apply_group(
                "demo", group_doc("e", sealed=True, evaluation={"environment": ENVIRONMENT, "tasks": 1})
            )
        assert sealed.value.code == "EvaluationGroup"
        assert plane.storage.list_dir("projects/demo/agentgroups") == []
        await groups.apply_group("demo", group_doc("plain"))
        with pytest.raises(Conflict) as not_evaluation:
            await plane.services.evaluations.group_results("demo", "plain")
        assert not_evaluation.value.code == "NotAnEvaluation"

    asyncio.run(scenario())


def test_cases_are_created_graded_recorded_and_read_back_after_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        groups = plane.services.groups
        await plane.services.agents.apply_agent("demo", agent_doc())
        created = await groups.apply_group(
            "demo", group_doc("e", evaluation={"environment": ENVIRONMENT, "tasks": 2})
        )
        assert created["resource"]["status"]["evaluation"]["cases"] == 2
        group = await groups.get_group("demo", "e")
        assert group["spec"]["sealed"] is True  # it seals itself once its runs exist
        members = await plane.services.runs.list_runs("demo", group="e")
        assert len(members) == 2
        assert all(
            run["status"]["deadlineAt"] == group["status"]["evaluation"]["deadlineAt"] for run in members
        )
        with pytest.raises(Conflict) as takes_none:
            await plane.services.runs.create_run(
                "demo",
                {
                    "apiVersion": "nodus.dev/v1",
                    "kind": "AgentRun",
                    "metadata": {},
                    "spec": {"agent": "helper", "input": "x", "group": "e", "taskKey": "mine"},
                },
            )
        assert takes_none.value.code == "EvaluationGroup"

        first, second = (run["metadata"]["name"] for run in members)
        plane.storage.write_bytes(f"projects/demo/agentruns/{first}/answer.txt", b"42")
        await plane.services.group_link.start_member("demo", first)
        (actor,) = await until(lambda: plane.run_actors.of(first), what="the started case's actor")
        actor.end({"phase": "Succeeded", "reason": "Completed", "answer": {"preview": "42"}})
        case = f"projects/demo/agentgroups/e/evaluation/cases/{first}.json"
        results_file = "projects/demo/agentgroups/e/evaluation/results.parquet"
        await until(
            lambda: plane.storage.exists(case) and plane.storage.exists(results_file),
            what="the graded case recorded, and the results written",
        )
        assert plane.graders.requests[0]["answer"] == "42" and plane.graders.requests[0]["run"] == first
        record = plane.storage.read_json(f"projects/demo/agentgroups/e/evaluation/cases/{first}.json")
        assert record["state"] == "Scored" and record["reward"] == 1.0
        assert plane.storage.exists("projects/demo/agentgroups/e/evaluation/results.parquet")

        restarted = await plane.restart()
        results = await restarted.services.evaluations.group_results("demo", "e")
        states = {item["run"]: item["state"] for item in results["items"]}
        assert states[first] == "Scored" and states[second] in ("Pending", "Grading")
        assert len(plane.graders.requests) == 1  # a recorded case is never graded again

    asyncio.run(scenario())
