"""Comparing two evaluations without a cluster: the control plane's comparison over real services
and storage (only the grader and the run actors are fakes), the route over it, the SDK's call
and the CLI's text (decision 60)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import nodus
from nodus import errors
from nodus.cli import main as cli
from nodus.cli.statistics_text import comparison_lines, statistics_lines
from nodus.client import Client
from nodus.errors import Conflict, NotFound
from nodus_ray.control.evaluation_comparison import compare_evaluations
from nodus_ray.control.tokens import token_digest
from nodus_serve.app import create_app
from tests.fakes.control_plane import client_over
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, until

ENVIRONMENT = "nodus/arithmetic-v2@2.0.0"
TOKEN = "nodus_test_reader"


def _evaluation(seed: int = 7, tasks: int = 2, repetitions: int = 2) -> dict[str, Any]:
    return {"environment": ENVIRONMENT, "tasks": tasks, "repetitions": repetitions, "seed": seed}


async def _grade_all(plane: Plane, group: str, verdicts: list[str]) -> None:
    """End every member of ``group`` with an answer, graded in case order as ``verdicts`` say."""
    members = await plane.services.runs.list_runs("demo", group=group)
    assert len(members) == len(verdicts)
    for run, verdict in zip(members, verdicts, strict=True):
        name = run["metadata"]["name"]
        plane.graders.outcome = {
            "outcome": "scored",
            "verdict": verdict,
            "reward": 1.0 if verdict == "pass" else 0.0,
            "evidence": "ok",
            "seconds": 0.1,
        }
        plane.storage.write_bytes(f"projects/demo/agentruns/{name}/answer.txt", b"42")
        await plane.services.group_link.start_member("demo", name)
        (actor,) = await until(partial(plane.run_actors.of, name), what=f"{name}'s actor")
        actor.end({"phase": "Succeeded", "reason": "Completed", "answer": {"preview": "42"}})
        case = f"projects/demo/agentgroups/{group}/evaluation/cases/{name}.json"
        await until(partial(plane.storage.exists, case), what=f"{name} graded")
    registry = plane.services.registry
    await until(
        lambda: registry.groups[("demo", group)]["status"]["evaluation"]["scored"] == len(verdicts),
        what=f"{group}'s status counting every graded case",
    )


async def _two_evaluations(plane: Plane) -> None:
    await plane.services.agents.apply_agent("demo", agent_doc())
    groups = plane.services.groups
    for name in ("a", "b"):
        await groups.apply_group("demo", group_doc(name, evaluation=_evaluation()))
    # Cases in order: task 0 r1, r2, task 1 r1, r2. A passes 3 of 4, B 1 of 4.
    await _grade_all(plane, "a", ["pass", "pass", "pass", "fail"])
    await _grade_all(plane, "b", ["pass", "fail", "fail", "fail"])


def test_two_evaluations_of_one_batch_are_compared_per_task(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await _two_evaluations(plane)
        status = (await plane.services.groups.get_group("demo", "a"))["status"]["evaluation"]
        assert status["statistics"]["passRate"]["value"] == 0.75
        assert status["statistics"]["passRate"]["clusteredBy"] == "task"
        assert status["statistics"]["passAtK"] == {"1": 0.75, "2": 1.0}
        results = await plane.services.evaluations.group_results("demo", "a")
        assert results["evaluation"]["statistics"] == status["statistics"]  # GET .../results too

        compared = await compare_evaluations(plane.services.evaluations, "demo", "a", "b")
        assert compared["kind"] == "EvaluationComparison" and compared["tasks"] == 2
        assert compared["batch"] == {
            "environment": ENVIRONMENT,
            "version": "2.0.0",
            "split": "test",
            "seed": 7,
            "tasks": 2,
        }
        assert (compared["a"]["name"], compared["a"]["scored"], compared["b"]["passRate"]) == ("a", 4, 0.25)
        # Task means: A 1.0, 0.5; B 0.5, 0.0 -> differences 0.5, 0.5: mean 0.5, SE 0.
        assert compared["passRate"] == {
            "a": 0.75,
            "b": 0.25,
            "difference": 0.5,
            "standardError": 0.0,
            "ci95": [0.5, 0.5],
            "n": 2,
        }

    asyncio.run(scenario())


def test_comparisons_that_cannot_be_made_are_refused_naming_why(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await plane.services.agents.apply_agent("demo", agent_doc())
        groups = plane.services.groups
        await groups.apply_group("demo", group_doc("a", evaluation=_evaluation()))
        await groups.apply_group("demo", group_doc("other", evaluation=_evaluation(seed=8, tasks=3)))
        await groups.apply_group("demo", group_doc("fewer", evaluation=_evaluation(repetitions=1)))
        await groups.apply_group("demo", group_doc("plain"))
        evaluations = plane.services.evaluations
        with pytest.raises(Conflict) as differs:
            await compare_evaluations(evaluations, "demo", "a", "other")
        assert differs.value.code == "NotSameBatch"
        assert "seed 7 vs 8" in differs.value.message and "tasks 2 vs 3" in differs.value.message
        assert differs.value.details["differs"] == {"seed": {"a": 7, "b": 8}, "tasks": {"a": 2, "b": 3}}
        assert differs.value.details["field"] == "seed"
        with pytest.raises(Conflict) as plain:
            await compare_evaluations(evaluations, "demo", "a", "plain")
        assert plain.value.code == "NotAnEvaluation" and "plain" in plain.value.message
        with pytest.raises(NotFound) as unknown:
            await compare_evaluations(evaluations, "demo", "nobody", "a")
        assert "nobody" in unknown.value.message
        # Repetitions may differ (the pairing is per task); nothing scored yet: no figures.
        compared = await compare_evaluations(evaluations, "demo", "a", "fewer")
        assert compared["tasks"] == 0 and compared["passRate"]["difference"] is None

    asyncio.run(scenario())


# -- the route ----------------------------------------------------------------------------------


def _call(plane: Plane) -> Callable[..., Awaitable[Any]]:
    async def call(method: str, *args: Any) -> Any:
        if method == "authenticate":
            if args[0] != token_digest(TOKEN):
                return None
            return {"name": "reader", "project": "demo", "role": "read", "expiresAt": None}
        assert method == "compare_evaluations", method
        return await compare_evaluations(plane.services.evaluations, *args)

    return call


def test_the_route_answers_the_comparison_and_refuses_bad_names(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await _two_evaluations(plane)
        await plane.services.groups.apply_group("demo", group_doc("c", evaluation=_evaluation(seed=9)))
        app = create_app(client_over(_call(plane)))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        transport = httpx.ASGITransport(app=app)
        url = "/v1/projects/demo/evaluations/compare"
        async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers) as http:
            answer = await http.get(url, params={"a": "a", "b": "b"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["passRate"]["difference"] == 0.5
            missing = await http.get(url, params={"a": "a"})
            assert missing.status_code == 422 and missing.json()["details"] == {"field": "b"}
            malformed = await http.get(url, params={"a": "Not_A_Name", "b": "b"})
            assert malformed.status_code == 422 and malformed.json()["details"] == {"field": "a"}
            differs = await http.get(url, params={"a": "a", "b": "c"})
            assert differs.status_code == 409 and differs.json()["code"] == "NotSameBatch"
            assert differs.json()["details"]["differs"] == {"seed": {"a": 7, "b": 9}}
            unknown = await http.get(url, params={"a": "a", "b": "nobody"})
            assert unknown.status_code == 404

    asyncio.run(scenario())


# -- the SDK and the CLI ------------------------------------------------------------------------

_COMPARISON: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1",
    "kind": "EvaluationComparison",
    "batch": {"environment": ENVIRONMENT, "version": "2.0.0", "split": "test", "seed": 7, "tasks": 10},
    "a": {"name": "eval-a", "repetitions": 2, "scored": 20, "pending": 0, "passRate": 0.7, "meanReward": 0.7},
    "b": {"name": "eval-b", "repetitions": 2, "scored": 19, "pending": 1, "passRate": 0.5, "meanReward": 0.5},
    "tasks": 10,
    "passRate": {
        "a": 0.7,
        "b": 0.5,
        "difference": 0.2,
        "standardError": 0.1,
        "ci95": [0.004, 0.396],
        "n": 10,
    },
    "meanReward": {"a": 0.7, "b": 0.5, "difference": 0.2, "standardError": None, "ci95": None, "n": 1},
}


def _sdk_client(answers: Callable[[httpx.Request], httpx.Response], seen: list[httpx.Request]) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers(request)

    return Client(api_url="http://nodus.test", project="default", transport=httpx.MockTransport(handle))


def test_the_sdk_asks_for_the_comparison_and_reads_it_in_snake_case() -> None:
    seen: list[httpx.Request] = []
    client = _sdk_client(lambda request: httpx.Response(200, json=_COMPARISON), seen)
    group = nodus.AgentGroup({"metadata": {"name": "eval-a"}}, client=client)
    compared = group.compare(nodus.AgentGroup({"metadata": {"name": "eval-b"}}, client=client))
    assert compared.pass_rate.difference == 0.2 and compared.pass_rate.ci95 == [0.004, 0.396]
    assert compared.mean_reward.standard_error is None
    assert group.compare("eval-b").tasks == 10
    assert [(r.url.path, dict(r.url.params)) for r in seen] == [
        ("/v1/projects/default/evaluations/compare", {"a": "eval-a", "b": "eval-b"})
    ] * 2
    with pytest.raises(errors.Invalid) as bad:
        client.compare_evaluations("eval-a", "Not A Name")
    assert bad.value.details == {"field": "b"} and len(seen) == 2  # refused before anything is sent


def test_the_sdk_raises_the_servers_refusal() -> None:
    refusal = {
        "code": "NotSameBatch",
        "message": "not the same batch: seed 7 vs 8",
        "details": {"field": "seed"},
    }
    client = _sdk_client(lambda request: httpx.Response(409, json=refusal), [])
    with pytest.raises(errors.Conflict) as caught:
        client.compare_evaluations("a", "b")
    assert caught.value.code == "NotSameBatch" and "seed 7 vs 8" in caught.value.message


def test_the_cli_prints_the_difference_with_its_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str]] = []

    def compare(self: Client, a: str, b: str, *, project: str | None = None) -> dict[str, Any]:
        asked.append((a, b))
        return _COMPARISON

    monkeypatch.setattr(Client, "compare_evaluations", compare)
    runner = CliRunner()
    shown = runner.invoke(cli.app, ["evaluation", "compare", "eval-a", "eval-b"])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines() == [
        f"A eval-a minus B eval-b: {ENVIRONMENT}, split test, seed 7, 10 tasks; 10 scored in both",
        "B eval-b still has 1 cases pending",
        "pass rate 0.70 - 0.50 = +0.20 ± 0.20 (95% CI +0.00 to +0.40, paired by task, n=10)",
        "mean reward 0.70 - 0.50 = +0.20 (n=1 task; no interval from fewer than 2 tasks)",
    ]
    as_json = runner.invoke(cli.app, ["evaluation", "compare", "eval-a", "eval-b", "-o", "json"])
    assert json.loads(as_json.stdout) == _COMPARISON
    assert (
        "kind: EvaluationComparison"
        in runner.invoke(cli.app, ["evaluation", "compare", "a", "b", "-o", "yaml"]).stdout
    )
    assert asked == [("eval-a", "eval-b"), ("eval-a", "eval-b"), ("a", "b")]
    wide = runner.invoke(cli.app, ["evaluation", "compare", "a", "b", "-o", "wide"])
    assert wide.exit_code != 0 and wide.stderr.startswith("error: ")


def test_the_cli_says_a_refusal_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def compare(self: Client, a: str, b: str, *, project: str | None = None) -> dict[str, Any]:
        raise errors.Conflict(
            "agentgroups 'a' and 'b' are not evaluations of the same batch: seed 7 vs 8", code="NotSameBatch"
        )

    monkeypatch.setattr(Client, "compare_evaluations", compare)
    refused = CliRunner().invoke(cli.app, ["evaluation", "compare", "a", "b"])
    assert refused.exit_code != 0
    assert refused.stderr.strip().splitlines() == [
        "error: NotSameBatch: agentgroups 'a' and 'b' are not evaluations of the same batch: seed 7 vs 8"
    ]


def test_the_statistics_read_as_the_docs_show_them() -> None:
    statistics = {
        "passRate": {
            "value": 0.62,
            "standardError": 0.04,
            "ci95": [0.5416, 0.6984],
            "n": 40,
            "clusteredBy": "task",
            "tasks": 20,
        },
        "meanReward": {
            "value": 0.7,
            "standardError": None,
            "ci95": None,
            "n": 1,
            "clusteredBy": None,
            "tasks": 1,
        },
        "passAtK": {"1": 0.62, "2": 0.8},
        "passHatK": {"1": 0.62, "2": 0.45},
    }
    assert statistics_lines(statistics) == [
        "pass rate 0.62 ± 0.08 (95% CI 0.54-0.70, clustered by task (20 tasks), n=40)",
        "mean reward 0.70 (n=1; no interval from fewer than 2 scored cases)",
        "pass@k k=1 0.62, k=2 0.80",
        "pass^k k=1 0.62, k=2 0.45",
    ]
    assert statistics_lines(None) == ["pass rate - (no case scored yet)"]
    assert comparison_lines({**_COMPARISON, "b": {**_COMPARISON["b"], "pending": 0}})[1].startswith(
        "pass rate"
    )


def test_results_show_the_error_bars_under_the_table_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    item = {
        "taskId": "t-0",
        "repetition": 1,
        "run": "e-t-0",
        "state": "Scored",
        "verdict": "pass",
        "reward": 1.0,
    }
    statistics = {
        "passRate": {
            "value": 1.0,
            "standardError": None,
            "ci95": None,
            "n": 1,
            "clusteredBy": None,
            "tasks": 1,
        },
        "meanReward": {
            "value": 1.0,
            "standardError": None,
            "ci95": None,
            "n": 1,
            "clusteredBy": None,
            "tasks": 1,
        },
        "passAtK": {"1": 1.0},
        "passHatK": {"1": 1.0},
    }
    monkeypatch.setattr(
        Client,
        "group_results",
        lambda self, name, project=None: {"evaluation": {"statistics": statistics}, "items": [item]},
    )
    shown = CliRunner().invoke(cli.app, ["evaluation", "results", "e"])
    assert shown.exit_code == 0, shown.output
    assert len(shown.stdout.splitlines()) == 2  # the table alone: header and one case
    assert shown.stderr.splitlines()[0] == "pass rate 1.00 (n=1; no interval from fewer than 2 scored cases)"
