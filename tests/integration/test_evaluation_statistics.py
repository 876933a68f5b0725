"""An evaluation's error bars and the comparison of two, end to end (decision 60).

Two evaluations of one batch, with repetitions: A is the offline model's worker, B an agent on
the fake Messages API that answers every task right. Their statistics are recomputed here from
the per-case results the server reports (the pure module the server uses, over what the API
says), and the comparison is read through the SDK and the CLI. Then the refusals: another batch,
a group that is not an evaluation, unknown names.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import nodus
from nodus.errors import Conflict, NotFound
from nodus_ray.core.eval_statistics import compare_records, evaluation_statistics
from tests.fakes.anthropic_api import last_user_text, text_reply

from . import kit
from .conftest import Server, unique

ROOT = Path(__file__).resolve().parents[2]
ARITHMETIC = "nodus/arithmetic-v2@2.0.0"
WORKER = "parallel-agents-worker"
BATCH: dict[str, Any] = {"environment": ARITHMETIC, "tasks": 3, "repetitions": 2, "seed": 20}


def _results(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        response = http.get(f"{kit.GROUPS}/{name}/results")
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


def _fake_api_agent(server: Server) -> str:
    """An agent on the fake Messages API (BYOK), which the test scripts to answer right."""
    secret, agent = unique("stats-key"), unique("stats-right")
    created = server.cli(
        "create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY=sk-ant-{uuid.uuid4().hex}"
    )
    assert created.returncode == 0, created.stderr
    kit.agent(server, agent, model={"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": secret})
    return agent


def _first_prompt(body: dict[str, Any]) -> str:
    first = body["messages"][0]["content"]
    if isinstance(first, str):
        return first
    return "\n".join(block.get("text", "") for block in first if block.get("type") == "text")


def test_two_evaluations_of_one_batch_have_error_bars_and_a_paired_difference(
    sdk_env: Server, fake_anthropic: Any
) -> None:
    from nodus_ray.environments import resolve

    server = sdk_env
    applied = server.cli("apply", "-f", str(ROOT / "examples/agents/parallel-agents/agent.yaml"))
    assert applied.returncode == 0, applied.stderr
    right = _fake_api_agent(server)
    tasks = resolve(ARITHMETIC).tasks("test", int(BATCH["seed"]), int(BATCH["tasks"]))
    answers = {task.prompt: task.answer for task in tasks}

    def responder(body: dict[str, Any]) -> Any:
        prompt = _first_prompt(body)
        if prompt in answers:
            return text_reply(f"The result is {answers[prompt]}.")
        return text_reply(f"Echo: {last_user_text(body)}")

    a, b = unique("stats-a"), unique("stats-b")
    fake_anthropic.set_responder(responder)
    try:
        first = nodus.AgentGroup.create(a, WORKER, max_active=3, max_cost="0.20", evaluation=dict(BATCH))
        second = nodus.AgentGroup.create(b, right, max_active=3, max_cost="0.20", evaluation=dict(BATCH))
        a_status = first.wait(timeout=300)
        b_status = second.wait(timeout=300)
    finally:
        fake_anthropic.set_responder(None)
    assert a_status.phase == "Succeeded" and b_status.phase == "Succeeded", (a_status, b_status)

    # Each evaluation's statistics are what its reported cases add up to, in status and results.
    a_results, b_results = _results(server, a), _results(server, b)
    for status, results in ((a_status, a_results), (b_status, b_results)):
        statistics = status.evaluation.statistics.to_dict()
        assert statistics == evaluation_statistics(results["items"])
        assert results["evaluation"]["statistics"] == statistics
        rate = statistics["passRate"]
        assert rate["clusteredBy"] == "task" and (rate["n"], rate["tasks"]) == (6, 3)
        assert rate["value"] == status.evaluation.pass_rate
        assert set(statistics["passAtK"]) == set(statistics["passHatK"]) == {"1", "2"}
        assert statistics["passAtK"]["1"] == rate["value"]  # every task scored twice
    assert b_status.evaluation.statistics.pass_rate.value == 1.0  # B answers everything right
    assert b_status.evaluation.statistics.pass_rate.standard_error == 0.0
    a_k = a_status.evaluation.statistics
    assert a_k.pass_hat_k["2"] <= a_k.pass_at_k["1"] <= a_k.pass_at_k["2"]

    # The comparison, through the SDK: A minus B per task, over every task.
    compared = first.compare(second)
    expected = compare_records(a_results["items"], b_results["items"])
    assert compared.kind == "EvaluationComparison" and compared.tasks == 3
    assert compared.pass_rate.to_dict() == expected["passRate"]
    assert compared.mean_reward.to_dict() == expected["meanReward"]
    assert compared.pass_rate.difference == pytest.approx(a_status.evaluation.pass_rate - 1.0, abs=1e-6)
    assert compared.pass_rate.n == 3
    assert compared.batch.to_dict() == {
        "environment": ARITHMETIC,
        "version": "2.0.0",
        "split": "test",
        "seed": 20,
        "tasks": 3,
    }

    # And through the CLI: the same figures, as text and as JSON.
    as_json = server.cli("evaluation", "compare", a, b, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["passRate"] == expected["passRate"]
    text = server.cli("evaluation", "compare", a, b)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(
        f"A {a} minus B {b}: {ARITHMETIC}, split test, seed 20, 3 tasks; 3 scored in both"
    )
    assert lines[1].startswith("pass rate ") and "n=3" in lines[1], lines
    shown = server.cli("evaluation", "results", a)
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.strip().splitlines()) == 7  # the table: a header and six cases
    assert "clustered by task (3 tasks), n=6)" in shown.stderr.splitlines()[0], shown.stderr
    described = server.cli("describe", "ag", b)
    assert described.returncode == 0, described.stderr
    assert (
        "Evaluation: pass rate 1.00 ± 0.00 (95% CI 1.00-1.00, clustered by task (3 tasks), n=6)"
        in described.stdout
    )

    _refusals(server, first, a)
    first.delete()
    second.delete()


def _refusals(server: Server, first: nodus.AgentGroup, a: str) -> None:
    """Another batch, a plain group, unknown names: each one clear error, from the SDK and the CLI."""
    other, plain = unique("stats-seed"), unique("stats-plain")
    # A comparison refuses another batch before reading any case: no need to wait for its runs.
    another = nodus.AgentGroup.create(
        other, WORKER, max_active=1, evaluation={**BATCH, "seed": 21, "tasks": 1, "repetitions": 1}
    )
    nodus.AgentGroup.create(plain, WORKER, max_active=1)
    try:
        with pytest.raises(Conflict) as differs:
            first.compare(another)
        assert differs.value.code == "NotSameBatch"
        assert "seed 20 vs 21" in differs.value.message and "tasks 3 vs 1" in differs.value.message
        assert differs.value.details["differs"] == {"seed": {"a": 20, "b": 21}, "tasks": {"a": 3, "b": 1}}
        refused = server.cli("evaluation", "compare", a, other)
        assert refused.returncode != 0
        assert refused.stderr.strip().splitlines() == [f"error: NotSameBatch: {differs.value.message}"]
        with pytest.raises(Conflict) as not_evaluation:
            first.compare(plain)
        assert not_evaluation.value.code == "NotAnEvaluation" and plain in not_evaluation.value.message
        with pytest.raises(NotFound):
            first.compare(unique("nobody"))
        unknown = server.cli("evaluation", "compare", unique("nobody"), a)
        assert unknown.returncode != 0 and unknown.stderr.startswith("error: NotFound: ")
        malformed = server.cli("evaluation", "compare", a, "Not_A_Name")
        assert malformed.returncode != 0 and malformed.stderr.startswith("error: Invalid: b:"), (
            malformed.stderr
        )
    finally:
        another.delete()
        nodus.AgentGroup.from_name(plain).delete()
