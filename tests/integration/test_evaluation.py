"""Evaluation groups end to end: document 002's example, the CLI, grading, leaks and the deadline.

Everything runs on the session's real server. Expected verdicts are not hard-coded: the test
regenerates the same batch with the installed Environment (generation is deterministic) and
asks its grader what the answer the run recorded deserves, so these tests check that the
service runs, grades and adds up exactly what the Environment defines.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.fakes.anthropic_api import error_reply, last_user_text, text_reply, tool_use_reply

from . import kit
from .conftest import Server, unique

ROOT = Path(__file__).resolve().parents[2]
ARITHMETIC = "nodus/arithmetic-v2@2.0.0"
PYTHON_FIX = "nodus/python-fix@1.0.0"
WORKER = "parallel-agents-worker"


def _environment(ref: str) -> Any:
    from nodus_ray.environments import resolve

    return resolve(ref)


def _worker(server: Server) -> None:
    applied = server.cli("apply", "-f", str(ROOT / "examples/agents/parallel-agents/agent.yaml"))
    assert applied.returncode == 0, applied.stderr


def _results(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        response = http.get(f"{kit.GROUPS}/{name}/results")
        assert response.status_code == 200, response.text
        return response.json()


def _expected(
    ref: str, split: str, seed: int, count: int, answers: dict[str, str]
) -> dict[str, tuple[str, float]]:
    """What the Environment's own grader gives each recorded answer (answer-only Environments)."""
    from nodus_ray.environments import GradingWorkspace

    environment = _environment(ref)
    verdicts = {}
    for task in environment.tasks(split, seed, count):
        grade = environment.grade(task, answers[task.id], GradingWorkspace(Path("/nonexistent")))
        verdicts[task.id] = (grade.verdict, grade.reward)
    return verdicts


def _answers(server: Server, runs: list[dict[str, Any]]) -> dict[str, str]:
    with server.http() as http:
        return {
            run["metadata"]["labels"]["nodus.dev/task-id"]: http.get(
                f"{kit.RUNS}/{run['metadata']['name']}/answer"
            ).json()["answer"]
            for run in runs
        }


def test_the_documents_evaluation_example_runs_unchanged(server: Server) -> None:
    _worker(server)
    env = {**server.env, "NODUS_API_URL": server.api_url, "NODUS_PROJECT": "default"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples/evaluation/evaluation.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=700,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "Succeeded: cases=2, pending=0", done.stdout
    tasks = _environment(ARITHMETIC).tasks("test", 42, 2)
    cases = [line.split() for line in lines[3:]]
    assert [case[0] for case in cases] == [task.id for task in tasks]
    assert all(case[1] == "Scored" and case[2] in ("pass", "fail", "invalid") for case in cases), done.stdout
    passes = sum(case[2] == "pass" for case in cases)
    assert lines[1] == f"pass rate: {passes / 2}"
    assert lines[2] == f"mean reward: {passes / 2}"
    # The example deletes its group, with its runs and records.
    with server.http() as http:
        assert http.get(f"{kit.GROUPS}/parallel-agents-eval").status_code == 404
        assert http.get(kit.RUNS, params={"group": "parallel-agents-eval"}).json()["items"] == []
    assert not server.store().list_dir("projects/default/agentgroups/parallel-agents-eval")


def test_an_evaluation_from_the_cli_grades_every_case_and_records_it(server: Server) -> None:
    _worker(server)
    name = unique("eval")
    created = server.cli(
        "create",
        "agentgroup",
        name,
        "--agent",
        WORKER,
        "--max-active",
        "2",
        "--max-cost",
        "0.20",
        "--environment",
        ARITHMETIC,
        "--tasks",
        "10",
        "--seed",
        "42",
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == f"agentgroup/{name} created"
    group = kit.finished(server, name, timeout=300)
    assert group["status"]["phase"] == "Succeeded", group["status"]
    assert group["spec"]["sealed"] is True  # it closed itself

    shown = server.cli("get", "ag", name, "-o", "yaml")
    assert shown.returncode == 0, shown.stderr
    import yaml

    evaluation = yaml.safe_load(shown.stdout)["status"]["evaluation"]
    assert {
        key: evaluation[key]
        for key in (
            "environment",
            "version",
            "split",
            "seed",
            "tasks",
            "repetitions",
            "cases",
            "pending",
            "unscored",
        )
    } == {
        "environment": ARITHMETIC,
        "version": "2.0.0",
        "split": "test",
        "seed": 42,
        "tasks": 10,
        "repetitions": 1,
        "cases": 10,
        "pending": 0,
        "unscored": 0,
    }
    assert "imageDigest" in evaluation and evaluation["grading"]["graded"] == 10

    runs = kit.runs_of(server, name)
    assert len(runs) == 10
    # Every member pins the group's agent revision and carries the group's absolute deadline.
    assert {run["status"]["agentRevision"] for run in runs} == {group["status"]["agentRevision"]}
    assert {run["status"]["deadlineAt"] for run in runs} == {evaluation["deadlineAt"]}
    tasks = _environment(ARITHMETIC).tasks("test", 42, 10)
    assert [run["spec"]["input"] for run in runs] == [task.prompt for task in tasks]  # only the prompt
    for run, task in zip(runs, tasks, strict=True):  # whose numbers never contain the answer's digits
        assert str(abs(task.answer)) not in run["spec"]["input"], task.id

    expected = _expected(ARITHMETIC, "test", 42, 10, _answers(server, runs))
    items = _results(server, name)["items"]
    assert [(item["taskId"], item["state"], item["verdict"], item["reward"]) for item in items] == [
        (task.id, "Scored", *expected[task.id]) for task in tasks
    ]
    passes = sum(verdict == "pass" for verdict, _ in expected.values())
    assert 0 < passes < 10, "the batch should hold tasks the offline model gets right and wrong"
    assert (evaluation["scored"], evaluation["passed"]) == (10, passes)
    assert evaluation["passRate"] == pytest.approx(passes / 10)
    assert evaluation["meanReward"] == pytest.approx(passes / 10)

    table = server.cli("evaluation", "results", name)
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.strip().splitlines()]
    assert rows[0] == ["CASE", "RUN", "STATE", "VERDICT", "REWARD"]
    assert [row[:3] for row in rows[1:]] == [[task.id, f"{name}-{task.id}", "Scored"] for task in tasks]

    # The records are also a Parquet file in storage.
    table = pq.read_table(
        io.BytesIO(
            server.store().read_bytes(f"projects/default/agentgroups/{name}/evaluation/results.parquet")
        )
    )
    assert table.column("taskId").to_pylist() == [task.id for task in tasks]
    assert table.column("verdict").to_pylist() == [expected[task.id][0] for task in tasks]

    listed = server.cli("get", "environments")
    assert listed.returncode == 0, listed.stderr
    names = {tuple(line.split()[:2]) for line in listed.stdout.strip().splitlines()[1:]}
    assert {("nodus/arithmetic-v2", "2.0.0"), ("nodus/python-fix", "1.0.0")} <= names


def test_bad_evaluations_are_refused_clearly_and_create_nothing(server: Server) -> None:
    _worker(server)
    name = unique("bad-eval")

    def create(evaluation: dict[str, Any], **spec: Any) -> Any:
        with server.http() as http:
            return http.post(
                kit.GROUPS,
                json={
                    "apiVersion": kit.V1,
                    "kind": "AgentGroup",
                    "metadata": {"name": name},
                    "spec": {"agent": WORKER, "evaluation": evaluation, **spec},
                },
            )

    refusals = [
        (
            create({"environment": "nodus/arithmetic-v2", "tasks": 2}),
            422,
            "spec.evaluation.environment",
            "no version",
        ),
        (
            create({"environment": "nodus/arithmetic-v2@9.9.9", "tasks": 2}),
            404,
            "spec.evaluation.environment",
            "2.0.0",
        ),
        (
            create({"environment": "acme/nothing@1.0.0", "tasks": 2}),
            404,
            "spec.evaluation.environment",
            "acme",
        ),
        (create({"environment": ARITHMETIC, "tasks": 60, "repetitions": 2}), 422, "spec.evaluation", "100"),
        (
            create({"environment": ARITHMETIC, "tasks": 2, "timeout": "30s"}),
            422,
            "spec.evaluation.timeout",
            "1m to 24h",
        ),
        (
            create({"environment": ARITHMETIC, "tasks": 2, "timeout": "25h"}),
            422,
            "spec.evaluation.timeout",
            "1m to 24h",
        ),
        (
            create({"environment": ARITHMETIC, "tasks": 2, "split": "holdout"}),
            422,
            "spec.evaluation.split",
            "test",
        ),
        (create({"environment": ARITHMETIC, "tasks": 2}, sealed=True), 422, "spec.sealed", "seals itself"),
        (
            create({"environment": ARITHMETIC, "tasks": 3}, limits={"maxPending": 2}),
            422,
            "spec.limits.maxPending",
            "3 cases",
        ),
    ]
    for response, status, field, words in refusals:
        assert response.status_code == status, response.text
        body = response.json()
        assert body["details"]["field"] == field and words in body["message"], body
    stopped = unique("stopped")
    kit.agent(server, stopped)
    with server.http() as http:
        assert http.patch(f"{kit.AGENTS}/{stopped}", json={"spec": {"state": "Stopped"}}).status_code == 200
        refused = http.post(
            kit.GROUPS,
            json={
                "apiVersion": kit.V1,
                "kind": "AgentGroup",
                "metadata": {"name": name},
                "spec": {"agent": stopped, "evaluation": {"environment": ARITHMETIC, "tasks": 1}},
            },
        )
        assert refused.status_code == 409 and refused.json()["code"] == "AgentStopped", refused.text
        assert http.get(f"{kit.GROUPS}/{name}").status_code == 404
    assert not server.store().list_dir(f"projects/default/agentgroups/{name}")

    cli = server.cli(
        "create",
        "agentgroup",
        name,
        "--agent",
        WORKER,
        "--environment",
        "nodus/arithmetic-v2",
        "--tasks",
        "2",
    )
    assert cli.returncode != 0 and cli.stdout == ""
    assert cli.stderr.count("\n") == 1 and "names no version" in cli.stderr, cli.stderr
    no_env = server.cli("create", "agentgroup", name, "--agent", WORKER, "--tasks", "2")
    assert no_env.returncode != 0 and "--environment" in no_env.stderr

    # A live evaluation group takes no submitted runs and no seal.
    assert create({"environment": ARITHMETIC, "tasks": 1, "seed": 3}).status_code == 201
    submitted = kit.batch(server, [kit.member(name, WORKER, "extra")])
    assert submitted.status_code == 409 and submitted.json()["code"] == "EvaluationGroup", submitted.text
    with server.http() as http:
        sealed = http.patch(f"{kit.GROUPS}/{name}", json={"spec": {"sealed": True}})
        assert sealed.status_code == 409 and sealed.json()["code"] == "EvaluationGroup", sealed.text
        changed = http.patch(f"{kit.GROUPS}/{name}", json={"spec": {"evaluation": {"tasks": 5}}})
        assert changed.status_code in (409, 422) and changed.json()["details"]["field"] == "spec.evaluation"
        plain = kit.group(server, unique("plain"), WORKER, sealed=True)["metadata"]["name"]
        not_eval = http.get(f"{kit.GROUPS}/{plain}/results")
        assert not_eval.status_code == 409 and not_eval.json()["code"] == "NotAnEvaluation"
    assert kit.finished(server, name, timeout=120)["status"]["phase"] == "Succeeded"
    assert [run["metadata"]["name"] for run in kit.runs_of(server, name)] == [f"{name}-test-000"]


def _byok_agent(server: Server) -> str:
    secret, agent = unique("eval-key"), unique("eval-byok")
    created = server.cli(
        "create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY=sk-ant-{uuid.uuid4().hex}"
    )
    assert created.returncode == 0, created.stderr
    kit.agent(server, agent, model={"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": secret})
    return agent


def _first_prompt(body: dict[str, Any]) -> str:
    first = body["messages"][0]["content"]
    return (
        first
        if isinstance(first, str)
        else "\n".join(b.get("text", "") for b in first if b.get("type") == "text")
    )


def _answering_tool_results(body: dict[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return isinstance(content, list) and any(block.get("type") == "tool_result" for block in content)


def _walk(store: Any, prefix: str) -> list[str]:
    """Every object under ``prefix`` (directories listed recursively), for leak searches."""
    found, folders = [], [prefix]
    while folders:
        folder = folders.pop()
        for name in store.list_dir(folder):
            path = f"{folder}/{name}"
            try:
                children = store.list_dir(path)
            except (NotADirectoryError, FileNotFoundError):  # a file, on a local disk
                children = []
            if children:
                folders.append(path)
            else:
                found.append(path)
    return found


def test_python_fix_grades_the_workspace_the_agent_left_and_hides_its_checks(
    server: Server, fake_anthropic: Any, ray_driver: Any
) -> None:
    agent = _byok_agent(server)
    environment = _environment(PYTHON_FIX)
    tasks = environment.tasks("test", 7, 4)
    by_prompt = {task.prompt: index for index, task in reversed(list(enumerate(tasks)))}

    def responder(body: dict[str, Any]) -> Any:
        index = by_prompt.get(_first_prompt(body))
        if index is None:
            return text_reply(f"Echo: {last_user_text(body)}")
        if _answering_tool_results(body):
            return text_reply("I fixed the module.")
        task = tasks[index]
        module, solution = task.answer["module"], task.answer["solution"]
        if index in (0, 2):  # a correct fix, written after looking at what the workspace holds
            return tool_use_reply(f"ls && cat > {module} <<'NODUS_EOF'\n{solution}NODUS_EOF")
        if index == 1:
            return text_reply("The module looks fine to me.")  # changes nothing
        return error_reply(400, "invalid_request_error", "this request is refused")  # the run fails

    name = unique("fix")
    fake_anthropic.set_responder(responder)
    try:
        kit.group(
            server,
            name,
            agent,
            limits={"maxActive": 4},
            evaluation={"environment": PYTHON_FIX, "tasks": 4, "seed": 7},
        )
        group = kit.finished(server, name, timeout=240)
    finally:
        fake_anthropic.set_responder(None)
    assert group["status"]["phase"] == "Succeeded", group["status"]
    items = _results(server, name)["items"]
    states = [(item["taskId"], item["state"], item["verdict"]) for item in items]
    assert states[0] == (tasks[0].id, "Scored", "pass") and states[2] == (tasks[2].id, "Scored", "pass"), (
        states
    )
    assert items[0]["reward"] == items[2]["reward"] == 1.0
    # The untouched module keeps its bugs: scored, and not a pass.
    assert states[1][1] == "Scored" and states[1][2] in ("fail", "partial") and items[1]["reward"] < 1.0
    assert "hidden checks passed" in items[1]["evidence"]
    # The run that failed is unscored, and its failure is not a zero.
    assert (items[3]["state"], items[3]["reward"]) == ("RunFailed", None)
    evaluation = group["status"]["evaluation"]
    assert (evaluation["scored"], evaluation["unscored"], evaluation["passed"]) == (3, 1, 2)
    assert evaluation["unscoredReasons"] == {"RunFailed": 1}
    assert evaluation["passRate"] == pytest.approx(2 / 3)
    assert evaluation["meanReward"] == pytest.approx((2 + items[1]["reward"]) / 3)

    runs = {run["metadata"]["name"]: run for run in kit.runs_of(server, name)}
    with server.http() as http:
        steps = http.get(f"{kit.RUNS}/{name}-{tasks[0].id}/steps").json()["items"]
        # The task's files were the run's first workspace: its first command listed them.
        listed = next(step for step in steps if step.get("kind") == "command")
        assert tasks[0].answer["module"] in json.dumps(listed)
        shown = "".join(
            http.get(path).text
            for path in (
                f"{kit.GROUPS}/{name}",
                f"{kit.GROUPS}/{name}/results",
                f"{kit.RUNS}?group={name}",
                *(f"{kit.RUNS}/{run}/steps" for run in runs),
                *(f"{kit.RUNS}/{run}/answer" for run in runs),
            )
        )
    # No hidden check (its call or, for the agents that did not write it, the fixed source)
    # is in any API answer or anywhere in storage: run inputs, journals, snapshots, records.
    store = server.store()
    stored = b"".join(
        store.read_bytes(path)
        for path in _walk(store, "projects/default")
        if path.endswith((".json", ".arrow", ".txt", ".parquet"))
    )
    for index, task in enumerate(tasks):
        for call, _ in task.answer["cases"]:
            assert call not in shown and call.encode() not in stored, call
        if index in (1, 3):
            assert task.answer["solution"] not in shown and task.answer["solution"].encode() not in stored
    # The grader worked on its own copy: its check never reached the agent's workspace.
    for run in runs:
        workspace = kit.workspace_of(server, run)
        assert not any(path.name.startswith(".nodus_grader") for path in workspace.rglob("*")), run
    # Finishing the group ended its grader.
    with pytest.raises(ValueError):
        ray_driver.get_actor(f"grader.default.{name}", namespace="nodus")


def test_the_deadline_fails_unfinished_cases_and_leaves_them_out(server: Server, fake_anthropic: Any) -> None:
    agent = _byok_agent(server)
    tasks = _environment(ARITHMETIC).tasks("test", 11, 2)

    def responder(body: dict[str, Any]) -> Any:
        prompt = _first_prompt(body)
        if prompt == tasks[0].prompt:
            return text_reply(f"The result is {tasks[0].answer}.")
        if prompt == tasks[1].prompt and not _answering_tool_results(body):
            return tool_use_reply("sleep 300")  # still running when the evaluation's minute is up
        return text_reply(f"Echo: {last_user_text(body)}")

    name = unique("deadline")
    fake_anthropic.set_responder(responder)
    try:
        created = kit.group(
            server,
            name,
            agent,
            evaluation={"environment": ARITHMETIC, "tasks": 2, "seed": 11, "timeout": "1m"},
        )
        group = kit.finished(server, name, timeout=150)
    finally:
        fake_anthropic.set_responder(None)
    deadline = created["status"]["evaluation"]["deadlineAt"]
    runs = kit.runs_of(server, name)
    assert {run["status"]["deadlineAt"] for run in runs} == {deadline}
    slow = runs[1]["status"]
    assert (slow["phase"], slow["reason"]) == ("Failed", "DeadlineExceeded")
    assert slow["finishedAt"] >= deadline
    items = _results(server, name)["items"]
    assert [(item["state"], item["verdict"], item["reason"]) for item in items] == [
        ("Scored", "pass", None),
        ("RunFailed", None, "DeadlineExceeded"),
    ]
    evaluation = group["status"]["evaluation"]
    assert group["status"]["phase"] == "Succeeded"
    assert (evaluation["scored"], evaluation["unscored"], evaluation["pending"]) == (1, 1, 0)
    assert evaluation["passRate"] == 1.0 and evaluation["meanReward"] == 1.0
