"""Exports through the real server: a run's trajectory (ATIF, journal JSONL) and an evaluation's
cases (Parquet, JSONL, Inspect's eval log) from the API, the SDK and the CLI, with a secret a
command printed masked in every one, and each bad request refused with one clear error.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from nodus import Client
from nodus.errors import Invalid, NotFound
from tests.support.export_checks import check_atif, check_inspect_log, read_with_inspect

from . import kit
from .conftest import Server, unique, wait_for

BASE = "/v1/projects/default"
ARITHMETIC = "nodus/arithmetic-v2@2.0.0"
COMMANDS = ['echo "pw=$DB_PASSWORD"', "python3 --version"]


@pytest.fixture(scope="module")
def secret_run(server: Server) -> tuple[str, str, str]:
    """A finished run whose first command printed a secret value: (run, secret value, marker)."""
    value = f"x9-{unique('pw')}"
    secret, agent, run = unique("exp-secret"), unique("exp-agent"), unique("exp-run")
    with server.http() as http:
        created = http.put(
            f"{BASE}/secrets/{secret}",
            json={
                "apiVersion": kit.V1,
                "kind": "Secret",
                "metadata": {"name": secret},
                "stringData": {"PW": value},
            },
        )
        assert created.status_code == 201, created.text
        spec = {
            "system": "Run what you are asked.",
            "perRunMaxCostUSD": "0.10",
            "env": [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": secret, "key": "PW"}}}],
        }
        applied = http.put(
            f"{BASE}/agents/{agent}",
            json={"apiVersion": kit.V1, "kind": "Agent", "metadata": {"name": agent}, "spec": spec},
        )
        assert applied.status_code == 201, applied.text
        started = http.post(
            f"{BASE}/agentruns",
            json={
                "apiVersion": kit.V1,
                "kind": "AgentRun",
                "metadata": {"name": run},
                "spec": {"agent": agent, "input": "run:\n" + "\n".join(COMMANDS)},
            },
        )
        assert started.status_code == 201, started.text
        wait_for(
            lambda: http.get(f"{BASE}/agentruns/{run}").json()["status"]["phase"] == "Succeeded",
            timeout=180,
            message=f"run {run} to succeed",
        )
    return run, value, f"[REDACTED:{secret}/PW]"


def _get(server: Server, path: str, **params: str) -> Any:
    with server.http() as http:
        return http.get(path, params=params)


def test_a_run_exports_as_atif_with_its_steps_tool_calls_observations_and_cost(
    server: Server, secret_run: tuple[str, str, str]
) -> None:
    run, value, marker = secret_run
    answer = _get(server, f"{BASE}/agentruns/{run}/export", format="atif")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert f'filename="{run}.atif.json"' in answer.headers["content-disposition"]
    assert value not in answer.text and marker in answer.text
    document = answer.json()
    check_atif(document)
    steps = document["steps"]
    assert steps[0] == {"step_id": 1, "source": "system", "message": "Run what you are asked."}
    assert steps[1]["source"] == "user" and steps[1]["message"].startswith("run:")
    calls = [call for step in steps for call in step.get("tool_calls", [])]
    assert [call["arguments"]["command"] for call in calls] == COMMANDS
    results = [result for step in steps for result in step.get("observation", {}).get("results", [])]
    assert [result["source_call_id"] for result in results] == [call["tool_call_id"] for call in calls]
    assert f"pw={marker}" in results[0]["content"] and results[1]["extra"]["exitCode"] == 0
    turns = [step for step in steps if step["source"] == "agent"]
    assert turns and all(step["metrics"]["prompt_tokens"] > 0 for step in turns)
    with server.http() as http:
        status = http.get(f"{BASE}/agentruns/{run}").json()["status"]
    final = document["final_metrics"]
    assert final["total_steps"] == len(steps)
    assert final["total_cost_usd"] == pytest.approx(float(status["cost"]["billedUSD"]))
    assert final["total_prompt_tokens"] == sum(
        t["inputTokens"] + t["cacheReadTokens"] + t["cacheCreationTokens"] for t in status["turns"]
    )
    assert final["total_completion_tokens"] == sum(t["outputTokens"] for t in status["turns"])


def test_a_run_exports_its_journal_one_record_a_line(
    server: Server, secret_run: tuple[str, str, str]
) -> None:
    run, value, marker = secret_run
    answer = _get(server, f"{BASE}/agentruns/{run}/export", format="jsonl")
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert [line["seq"] for line in lines] == list(range(len(lines)))
    assert {"sandbox", "route", "model", "command", "message"} <= {line["kind"] for line in lines}
    commands = [line for line in lines if line["kind"] == "command" and line["state"] == "Completed"]
    assert len(commands) == len(COMMANDS) and marker in commands[0]["payload"]["result"]["output"]
    assert value not in answer.text


def test_the_sdk_and_the_cli_export_a_run(
    server: Server, secret_run: tuple[str, str, str], tmp_path: Path
) -> None:
    run, value, _ = secret_run
    client = Client(server.api_url, project="default", token=server.token)
    data = client.export_run(run, "atif")
    assert isinstance(data, bytes)
    check_atif(json.loads(data))
    target = tmp_path / "run.jsonl"
    written = client.export_run(run, "jsonl", to=target)
    assert written == target.stat().st_size and not (tmp_path / "run.jsonl.part").exists()
    assert value not in target.read_text()

    saved = tmp_path / "cli.atif.json"
    done = server.cli("agentrun", "export", run, "--format", "atif", "-o", str(saved))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"agentrun/{run} atif: {saved.stat().st_size} bytes written to {saved}"
    check_atif(json.loads(saved.read_text()))
    shown = server.cli("agentrun", "export", run, "-f", "jsonl")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == target.read_text()


@pytest.fixture(scope="module")
def evaluation(server: Server) -> str:
    applied = server.cli(
        "apply", "-f", str(Path(__file__).resolve().parents[2] / "examples/agents/parallel-agents/agent.yaml")
    )
    assert applied.returncode == 0, applied.stderr
    name = unique("exp-eval")
    kit.group(
        server,
        name,
        "parallel-agents-worker",
        limits={"maxActive": 2},
        evaluation={"environment": ARITHMETIC, "tasks": 3, "seed": 7},
    )
    assert kit.finished(server, name, timeout=300)["status"]["phase"] == "Succeeded"
    return name


def test_an_evaluation_exports_as_parquet_jsonl_and_inspects_log(
    server: Server, evaluation: str, tmp_path: Path
) -> None:
    parquet = _get(server, f"{kit.GROUPS}/{evaluation}/export", format="parquet")
    assert parquet.status_code == 200 and parquet.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(parquet.content))
    assert table.num_rows == 3 and set(table.column("group").to_pylist()) == {evaluation}
    assert sorted(table.column("run").to_pylist()) == sorted(
        r["metadata"]["name"] for r in kit.runs_of(server, evaluation)
    )

    lines = _get(server, f"{kit.GROUPS}/{evaluation}/export", format="jsonl").text.splitlines()
    assert (
        len(lines) == 3
        and [json.loads(line)["taskId"] for line in lines] == table.column("taskId").to_pylist()
    )

    log_answer = _get(server, f"{kit.GROUPS}/{evaluation}/export", format="inspect")
    assert log_answer.status_code == 200, log_answer.text
    log = log_answer.json()
    check_inspect_log(log)
    assert log["status"] == "success" and log["eval"]["task"] == "nodus/arithmetic-v2"
    assert len(log["samples"]) == 3 and log["results"]["total_samples"] == 3
    with server.http() as http:
        status = http.get(f"{kit.GROUPS}/{evaluation}").json()["status"]["evaluation"]
    verdict = log["results"]["scores"][0]
    assert verdict["metrics"]["accuracy"]["value"] == status["passRate"]
    for sample in log["samples"]:
        assert sample["target"] == "" and sample["messages"][0]["role"] == "system"
        assert any(message["role"] == "assistant" for message in sample["messages"])
    path = tmp_path / "eval.json"
    path.write_bytes(log_answer.content)
    read = read_with_inspect(path)  # inspect_ai's own reader, where an Inspect virtualenv exists
    if read is not None:
        assert read["samples"] == 3 and read["status"] == "success"

    client = Client(server.api_url, project="default", token=server.token)
    assert client.export_evaluation(evaluation, "parquet") == parquet.content
    saved = tmp_path / "cases.parquet"
    done = server.cli("evaluation", "export", evaluation, "--format", "parquet", "-o", str(saved))
    assert done.returncode == 0, done.stderr
    assert pq.read_table(saved).num_rows == 3


def test_bad_exports_are_refused_with_one_clear_error(
    server: Server, secret_run: tuple[str, str, str], evaluation: str, tmp_path: Path
) -> None:
    run, _, _ = secret_run
    refused = _get(server, f"{BASE}/agentruns/{run}/export", format="parquet")
    assert refused.status_code == 422
    assert refused.json() == {
        "code": "UnsupportedFormat",
        "message": "format 'parquet' is not offered for an agentrun; use one of atif, jsonl",
        "details": {"field": "format", "allowed": ["atif", "jsonl"]},
    }
    missing = _get(server, f"{BASE}/agentruns/{run}/export")
    assert missing.status_code == 422 and missing.json()["details"] == {"field": "format"}
    gone = _get(server, f"{BASE}/agentruns/{unique('nope')}/export", format="atif")
    assert gone.status_code == 404 and gone.json()["code"] == "NotFound"
    plain = kit.group(server, unique("exp-plain"), "parallel-agents-worker", sealed=True)["metadata"]["name"]
    not_eval = _get(server, f"{kit.GROUPS}/{plain}/export", format="jsonl")
    assert not_eval.status_code == 409 and not_eval.json()["code"] == "NotAnEvaluation"
    no_group = _get(server, f"{kit.GROUPS}/{unique('nope')}/export", format="inspect")
    assert no_group.status_code == 404

    client = Client(server.api_url, project="default", token=server.token)
    with pytest.raises(Invalid, match="not offered for an evaluation"):
        client.export_evaluation(plain, "atif")
    with pytest.raises(NotFound):
        client.export_run(unique("nope"), "atif", to=tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []  # nothing half-written

    for args, says in (
        (
            ("agentrun", "export", run, "--format", "pdf"),
            "error: UnsupportedFormat: format 'pdf' is not offered",
        ),
        (("evaluation", "export", plain, "-f", "jsonl"), "error: NotAnEvaluation:"),
        (
            ("agentrun", "export", run, "-o", str(tmp_path / "no" / "dir" / "x.json")),
            "error: Invalid: cannot write",
        ),
    ):
        done = server.cli(*args)
        assert done.returncode != 0 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(says), done.stderr
