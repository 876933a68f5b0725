"""The fault-injection suite: kill a part of the service at a moment the test chooses, then check
that nothing was lost, nothing done twice and nothing billed twice.

Moments inside a process are reached through crash points (`nodus_ray.faults`): the test arms
one, the first process to get there dies with SIGKILL. Whole processes, nodes and the cluster
are killed from outside. After each fault `audit_run` and `audit_group` check the same
invariants:

* no run lost: every accepted run is there and ends in the phase it should;
* no completed step repeated: each run's command appends one line to ``counter.txt`` in its
  workspace, so a repeated command shows as a second line; every completed command step has
  one attempt;
* no double billing: a run's cost is the sum of its journaled steps' costs, a group's is the
  sum of its runs', nothing stays reserved, and the cap holds;
* the group's invariants: never more than ``maxActive`` at once, counts add up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from nodus.client import Client
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots

from .conftest import Server, unique, wait_for
from .kit import (
    AGENTS,
    GROUPS,
    RUNS,
    V1,
    agent,
    batch,
    finished,
    get_group,
    group,
    member,
    most_at_once,
    runs_of,
    seal,
    workspace_of,
)

COUNTED = "Use the shell to run `echo tick >> counter.txt`"
TERMINAL = ("Succeeded", "Failed", "Cancelled")


# -- checks ----------------------------------------------------------------------------------------


def _run(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        response = http.get(f"{RUNS}/{name}")
        assert response.status_code == 200, (name, response.text)
        return response.json()


def _steps(server: Server, name: str) -> list[dict[str, Any]]:
    with server.http() as http:
        return http.get(f"{RUNS}/{name}/steps").json()["items"]


def _counter(server: Server, name: str) -> str:
    path = workspace_of(server, name) / "counter.txt"
    return path.read_text() if path.exists() else ""


def settle(server: Server, name: str, timeout: float = 180, *, unattended: bool = False) -> dict[str, Any]:
    """Wait for the run to end. A command left uncertain by a crash is resolved the way an operator
    would: by looking at its effect (the counter) and recording what happened. ``unattended``: a
    run that waits for a person fails the test instead (a hermetic run must never need one)."""

    def done() -> dict[str, Any] | None:
        run = _run(server, name)
        status = run["status"]
        if status["phase"] == "Waiting" and status.get("reason") == "NeedsResolution":
            assert not unattended, f"{name} waits for a person: {status.get('message')}"
            step = status["step"]
            happened = _counter(server, name) == "tick\n"
            decision: dict[str, Any] = {
                "step": step,
                "revision": run["metadata"]["resourceVersion"],
                "evidence": "counter.txt inspected by the test",
            }
            if happened:
                decision |= {"decision": "Completed", "result": {"exitCode": 0, "output": ""}}
            else:
                decision |= {"decision": "NoEffect"}
            with server.http() as http:
                http.post(f"{RUNS}/{name}/resolve", json=decision)
            return None
        return run if status["phase"] in TERMINAL else None

    return wait_for(done, timeout=timeout, interval=0.1, message=f"run {name} to finish")


def audit_run(server: Server, name: str, *, phase: str = "Succeeded") -> dict[str, Any]:
    run = _run(server, name)
    status = run["status"]
    assert status["phase"] == phase, (name, status)
    assert _counter(server, name) == "tick\n", f"{name}: the counted command ran other than once"
    records = _journal(server, name)
    commands = [record for record in records if record.kind == "command"]
    assert len({record.step_id for record in commands}) == 1, (name, commands)
    states = [record.state for record in commands]
    assert [s for s in states if s in ("Completed", "Resolved")] == [states[-1]], (name, states)
    started = [record.attempt for record in commands if record.state == "Started"]
    assert started == sorted(set(started)), f"{name}: one Started per attempt: {states}"
    for attempt in started[:-1]:  # an attempt runs again only once declared without effect
        assert any(r.attempt == attempt and r.state == "NoEffect" for r in commands), (name, states)
    audit_money(server, name, records)
    audit_ledger(server)
    return run


def audit_money(server: Server, name: str, records: list[Any] | None = None) -> None:
    """The run's cost is the sum of its steps' costs, which is what its journal recorded."""
    status = _run(server, name)["status"]
    steps = _steps(server, name)
    recorded = sum((Decimal(step["costUSD"]) for step in steps), Decimal(0))
    assert Decimal(status["cost"]["totalUSD"]) == recorded, f"{name}: cost is not the sum of its steps"
    records = _journal(server, name) if records is None else records
    journaled = sum((Decimal(r.cost_usd) for r in records if r.state == "Completed"), Decimal(0))
    assert recorded == journaled, f"{name}: the steps' costs are not the journal's"


def audit_ledger(server: Server, project: str = "default") -> None:
    """The project's credit ledger charged each run's journaled cost once: what it says was
    spent is what the runs' statuses say they cost (plus what deleted runs had cost), and
    nothing stays reserved once no run is calling a model."""
    from nodus_ray.store import layout

    def balanced() -> tuple[Decimal, Decimal] | None:
        with server.http() as http:
            credits = http.get(f"/v1/projects/{project}/credits").json()
            runs = http.get(RUNS).json()["items"]
        deleted = Decimal(server.store().read_json(layout.credits(project)).get("deletedSpendUSD", "0"))
        total = deleted + sum((Decimal(r["status"]["cost"]["totalUSD"]) for r in runs), Decimal(0))
        active = any(r["status"]["phase"] in ("Pending", "Running") for r in runs)
        if active:  # a run between its report and the next read: read again
            return None
        assert Decimal(credits["balanceUSD"]) == Decimal(credits["grantedUSD"]) - Decimal(credits["spentUSD"])
        return Decimal(credits["spentUSD"]), total

    spent, total = wait_for(balanced, timeout=60, interval=0.2, message="the project to be at rest")
    assert spent == total, f"the ledger charged {spent}, the runs cost {total}"
    with server.http() as http:
        assert Decimal(http.get(f"/v1/projects/{project}/credits").json()["reservedUSD"]) == 0


def audit_group(server: Server, name: str, members: int, max_active: int) -> None:
    status = get_group(server, name)["status"]
    assert status["phase"] == "Succeeded", status
    assert status["counts"]["succeeded"] == members, status["counts"]
    runs = runs_of(server, name)
    assert len(runs) == members
    for run in runs:
        audit_run(server, run["metadata"]["name"])
    assert most_at_once(runs) <= max_active
    total = sum((Decimal(run["status"]["cost"]["totalUSD"]) for run in runs), Decimal(0))
    assert Decimal(status["cost"]["totalUSD"]) == total, "the group's cost is the sum of its runs' costs"
    assert Decimal(status["cost"]["reservedUSD"]) == 0
    if status["cost"]["limitUSD"] is not None:
        assert total <= Decimal(status["cost"]["limitUSD"])


def _counted_runs(agent_name: str, names: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": V1,
            "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {"agent": agent_name, "input": COUNTED},
        }
        for name in names
    ]


def _counted_group(
    server: Server, max_active: int, members: int, max_cost: str = "1.00", command: str = COUNTED
) -> tuple[str, str]:
    agent_name, group_name = unique("fault"), unique("fg")
    agent(server, agent_name)
    group(server, group_name, agent_name, limits={"maxActive": max_active}, maxCostUSD=max_cost)
    response = batch(server, [member(group_name, agent_name, f"t{i}", command) for i in range(members)])
    assert response.status_code == 201, response.text
    seal(server, group_name)
    return agent_name, group_name


# -- inside a process ------------------------------------------------------------------------------


def test_a_run_killed_between_a_model_call_and_its_record_calls_again_and_bills_once(server: Server) -> None:
    agent_name, name = unique("gap"), unique("gap-run")
    agent(server, agent_name)
    server.arm("step-effect-done", f"agentruns/{name}/journal/turn-1/model-1")
    with server.http() as http:
        assert http.post(RUNS, json=_counted_runs(agent_name, [name])[0]).status_code == 201
    settle(server, name)
    assert server.fired("step-effect-done")
    run = audit_run(server, name)
    assert run["status"]["attempts"] == 2, "a second actor took over"
    model = next(step for step in _steps(server, name) if step["id"] == "turn-1/model-1")
    # A call on the server's key is safe to repeat: made again, recorded (and billed) once.
    assert model["state"] == "Completed" and model["attempts"] == 2


def _kill_mid_command(server: Server, agent_name: str, name: str) -> None:
    """Start a run whose command ticks the counter then sleeps; SIGKILL its actor mid-sleep."""
    from ray.util.state import list_actors

    with server.http() as http:
        created = http.post(
            RUNS,
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {
                    "agent": agent_name,
                    "input": "Use the shell to run `echo tick >> counter.txt; sleep 15`",
                },
            },
        )
        assert created.status_code == 201, created.text
    wait_for(
        lambda: _counter(server, name) == "tick\n", timeout=60, interval=0.05, message="the command's effect"
    )
    actor_name = _run(server, name)["status"]["actorName"]
    actors = list_actors(filters=[("name", "=", actor_name), ("state", "=", "ALIVE")], detail=True)
    os.kill(int(actors[0].pid), signal.SIGKILL)  # in the middle of the command's sleep


def test_a_run_actor_killed_mid_command_undoes_it_and_runs_it_again_by_itself(
    server: Server,
    ray_driver: Any,
) -> None:
    """A run that reaches nothing outside its sandbox has no effect beyond its workspace: the
    half-run command is undone (the workspace is put back from the snapshot before it, not
    taken as the killed command left it) and runs again, with nobody asked."""
    agent_name, name = unique("mid"), unique("mid-run")
    agent(server, agent_name)
    _kill_mid_command(server, agent_name, name)

    def ended() -> dict[str, Any] | None:
        run = _run(server, name)
        assert run["status"].get("reason") != "NeedsResolution", run["status"]
        return run if run["status"]["phase"] in TERMINAL else None

    run = wait_for(ended, timeout=180, interval=0.2, message="the run to finish by itself")
    assert run["status"]["attempts"] == 2, "a second actor took over"
    assert run["status"]["sandbox"]["origin"] == "restored"
    audit_run(server, name)  # the counter reads one tick: the first one was undone
    states = [(r.state, r.attempt) for r in _journal(server, name) if r.kind == "command"]
    assert states == [("Started", 1), ("NoEffect", 1), ("Started", 2), ("Completed", 2)], states


def test_a_run_that_can_reach_outside_killed_mid_command_waits_for_a_person_and_it_is_not_repeated(
    server: Server,
    ray_driver: Any,
) -> None:
    """With ``allowedHosts`` a command may have acted outside: nobody can undo that, so the run
    parks for a person, who looks at the effect (the counter) and records what happened."""
    agent_name, name = unique("mid-net"), unique("mid-net-run")
    agent(server, agent_name, allowed_hosts=["example.com"])
    _kill_mid_command(server, agent_name, name)
    run = wait_for(
        lambda: (r := _run(server, name))["status"].get("reason") == "NeedsResolution" and r,
        timeout=90,
        message="the run to wait for a resolution",
    )
    assert run["status"]["step"] == "turn-1/command-1-1"
    settle(server, name)  # the operator sees the counter and records the command as Completed
    audit_run(server, name)


def test_a_supervisor_killed_mid_admission_rebuilds_and_keeps_the_limits(server: Server) -> None:
    agent_name, group_name = unique("adm"), unique("fa")
    agent(server, agent_name)
    group(server, group_name, agent_name, limits={"maxActive": 2}, maxCostUSD="0.50")
    # The supervisor dies having decided to start the fourth run, before anyone heard of it.
    server.arm("admission-decided", f"default/{group_name}/{group_name}-t3")
    assert (
        batch(server, [member(group_name, agent_name, f"t{i}", COUNTED) for i in range(6)]).status_code == 201
    )
    seal(server, group_name)
    finished(server, group_name, timeout=180)
    assert server.fired("admission-decided")
    audit_group(server, group_name, members=6, max_active=2)
    assert all(run["status"]["attempts"] == 1 for run in runs_of(server, group_name)), "no run started twice"


def test_a_control_plane_killed_before_telling_a_group_a_run_ended_is_told_again_after_its_restart(
    server: Server,
) -> None:
    agent_name, group_name = unique("untold"), unique("fu")
    agent(server, agent_name)
    group(server, group_name, agent_name, limits={"maxActive": 1}, maxCostUSD="0.50")
    # The first run's end is stored, the control plane dies before its supervisor hears of it: the
    # supervisor (alive all along) would hold that run's place forever if nobody told it again.
    server.arm("run-ended-untold", f"default/{group_name}-t0")
    assert (
        batch(server, [member(group_name, agent_name, f"t{i}", COUNTED) for i in range(3)]).status_code == 201
    )
    seal(server, group_name)
    finished(server, group_name, timeout=180)
    assert server.fired("run-ended-untold")
    audit_group(server, group_name, members=3, max_active=1)


def test_a_control_plane_killed_mid_batch_keeps_none_of_it_and_the_retry_creates_it_once(
    server: Server,
) -> None:
    agent_name = unique("half")
    agent(server, agent_name)
    names = [unique("half-run") for _ in range(3)]
    body = {"apiVersion": V1, "kind": "AgentRunList", "items": _counted_runs(agent_name, names)}
    key = uuid.uuid4().hex
    server.arm("batch-half-written", f"default/{names[0]}")
    with server.http() as http:
        first = http.post(RUNS, json=body, headers={"Idempotency-Key": key})
        assert first.status_code == 503, first.text  # the answer says try again, in JSON
        assert first.json()["code"] == "Unavailable"
        assert server.fired("batch-half-written")
        # The restarted control plane rolled the half-written batch back: all or nothing.
        wait_for(
            lambda: http.get("/readyz").status_code == 200,
            timeout=120,
            interval=0.25,
            message="the control plane to come back",
        )
        assert [http.get(f"{RUNS}/{name}").status_code for name in names] == [404, 404, 404]
        assert not server.store().exists(f"projects/default/agentruns/{names[0]}/run.json")
        again = http.post(RUNS, json=body, headers={"Idempotency-Key": key})
        assert again.status_code == 201, again.text
        assert [item["metadata"]["name"] for item in again.json()["items"]] == names
    for name in names:
        settle(server, name)
        run = audit_run(server, name)
        assert run["status"]["attempts"] == 1


def test_an_api_replica_killed_mid_request_loses_nothing_and_the_sdk_retry_gets_the_answer(
    server: Server,
) -> None:
    agent_name = unique("replica")
    agent(server, agent_name)
    names = [unique("replica-run") for _ in range(3)]
    server.arm("api-answering", "POST /v1/projects/default/agentruns")
    client = Client(server.api_url, project="default", token=server.token)
    # The runs are stored, then the replica dies before answering. The SDK sends the batch again
    # with the same idempotency key once Serve has replaced the replica, and gets the first answer.
    created = client.create_runs(_counted_runs(agent_name, names), idempotency_key=uuid.uuid4().hex)
    assert server.fired("api-answering")
    assert [item["metadata"]["name"] for item in created] == names
    for item in created:
        assert _run(server, item["metadata"]["name"])["metadata"]["uid"] == item["metadata"]["uid"], (
            "the answer is the run that was created, not a second one"
        )
    for name in names:
        settle(server, name)
        audit_run(server, name)


def test_byok_a_model_call_whose_record_was_lost_waits_for_a_person(
    server: Server, fake_anthropic: Any
) -> None:
    from tests.fakes.anthropic_api import text_reply

    secret, agent_name, name = unique("key"), unique("byok-gap"), unique("byok-gap-run")
    assert (
        server.cli(
            "create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY=sk-ant-{uuid.uuid4().hex}"
        ).returncode
        == 0
    )
    with server.http() as http:
        assert http.put(
            f"{AGENTS}/{agent_name}",
            json={
                "apiVersion": V1,
                "kind": "Agent",
                "metadata": {"name": agent_name},
                "spec": {
                    "system": "x",
                    "model": {"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": secret},
                },
            },
        ).status_code in (200, 201)
    fake_anthropic.script(
        text_reply("first", usage={"input_tokens": 10, "output_tokens": 2}),
        text_reply("second", usage={"input_tokens": 10, "output_tokens": 2}),
    )
    server.arm("step-effect-done", f"agentruns/{name}/journal/turn-1/model-1")
    with server.http() as http:
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": V1,
                    "kind": "AgentRun",
                    "metadata": {"name": name},
                    "spec": {"agent": agent_name, "input": "Say something."},
                },
            ).status_code
            == 201
        )

    def parked() -> dict[str, Any] | None:
        run = _run(server, name)
        return run if run["status"].get("reason") == "NeedsResolution" else None

    # The call was made on the user's own key and may have cost them: not repeated unasked.
    run = wait_for(parked, timeout=90, message="the run to wait for a resolution")
    assert run["status"]["step"] == "turn-1/model-1"
    with server.http() as http:
        resolved = http.post(
            f"{RUNS}/{name}/resolve",
            json={
                "step": "turn-1/model-1",
                "decision": "NoEffect",
                "revision": run["metadata"]["resourceVersion"],
            },
        )
        assert resolved.status_code == 200, resolved.text
        wait_for(
            lambda: _run(server, name)["status"]["phase"] == "Succeeded",
            timeout=90,
            message="the resolved run to finish",
        )
        assert http.get(f"{RUNS}/{name}/answer").json()["answer"] == "second"
    audit_money(server, name)  # on the user's own key: nothing billed by Nodus, twice or once
    assert Decimal(_run(server, name)["status"]["cost"]["totalUSD"]) == 0
    audit_ledger(server)


# -- evaluations -----------------------------------------------------------------------------------


def _evaluation(server: Server, tasks: int) -> tuple[str, dict[str, Any]]:
    """An arithmetic evaluation's group name and its POST body, on an agent of its own."""
    agent_name, group_name = unique("judged"), unique("fe")
    agent(server, agent_name)
    return group_name, {
        "apiVersion": V1,
        "kind": "AgentGroup",
        "metadata": {"name": group_name},
        "spec": {
            "agent": agent_name,
            "limits": {"maxActive": 2},
            "evaluation": {"environment": "nodus/arithmetic-v2@2.0.0", "tasks": tasks, "seed": 5},
        },
    }


def audit_evaluation(server: Server, name: str, tasks: int) -> None:
    """Every case has exactly one run, ran once, and is scored; the counts add up."""
    group_now = finished(server, name, timeout=240)
    assert group_now["status"]["phase"] == "Succeeded", group_now["status"]
    runs = runs_of(server, name)
    assert len(runs) == tasks and all(run["status"]["attempts"] == 1 for run in runs)
    with server.http() as http:
        items = http.get(f"{GROUPS}/{name}/results").json()["items"]
    assert [item["state"] for item in items] == ["Scored"] * tasks
    assert [item["run"] for item in items] == [run["metadata"]["name"] for run in runs]
    evaluation = group_now["status"]["evaluation"]
    assert (evaluation["scored"], evaluation["pending"], evaluation["unscored"]) == (tasks, 0, 0)
    assert evaluation["passed"] == sum(item["verdict"] == "pass" for item in items)
    assert len(server.store().list_dir(f"projects/default/agentgroups/{name}/evaluation/cases")) == tasks
    for run in runs:
        audit_money(server, run["metadata"]["name"])
    total = sum((Decimal(run["status"]["cost"]["totalUSD"]) for run in runs), Decimal(0))
    assert Decimal(group_now["status"]["cost"]["totalUSD"]) == total, "the group's cost is its runs'"
    audit_ledger(server)


def test_a_control_plane_killed_before_sealing_an_evaluation_finishes_it_after_its_restart(
    server: Server,
) -> None:
    name, body = _evaluation(server, tasks=3)
    server.arm("evaluation-unsealed", f"default/{name}")
    with server.http() as http:
        created = http.post(GROUPS, json=body)
        assert created.status_code == 503 and created.json()["code"] == "Unavailable", created.text
        assert server.fired("evaluation-unsealed")
        wait_for(
            lambda: http.get("/readyz").status_code == 200,
            timeout=120,
            interval=0.25,
            message="the control plane to come back",
        )
        # The group and its runs were stored before the crash; the restart sealed it.
        again = http.post(GROUPS, json=body)
        assert again.status_code == 409 and again.json()["code"] == "AlreadyExists"
    audit_evaluation(server, name, tasks=3)
    assert get_group(server, name)["spec"]["sealed"] is True


def test_a_control_plane_killed_after_grading_a_case_grades_it_again_and_records_it_once(
    server: Server,
) -> None:
    name, body = _evaluation(server, tasks=3)
    server.arm("case-graded-unrecorded", f"default/{name}-test-001")
    with server.http() as http:
        assert http.post(GROUPS, json=body).status_code == 201
    audit_evaluation(server, name, tasks=3)
    assert server.fired("case-graded-unrecorded")


# -- the whole cluster -----------------------------------------------------------------------------


def _reconnect(server: Server, ray: Any) -> None:
    ray.shutdown()
    ray.init(address=server.ray_address, namespace="nodus", logging_level="ERROR", log_to_driver=False)


def test_ray_stop_force_mid_batch_then_nodus_up_loses_nothing(server: Server, ray_driver: Any) -> None:
    """The whole cluster stops mid-batch, with runs in the middle of their commands; after
    `nodus up` the batch finishes by itself (nobody resolves anything) and every counter is 1."""
    agent_name, group_name = _counted_group(
        server, max_active=3, members=6, command="Use the shell to run `echo tick >> counter.txt; sleep 2`"
    )
    done_run, waiting_run = unique("kept-answer"), unique("kept-waiting")
    with server.http() as http:
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": V1,
                    "kind": "AgentRun",
                    "metadata": {"name": done_run},
                    "spec": {"agent": agent_name, "input": "What is 6 * 7?"},
                },
            ).status_code
            == 201
        )
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": V1,
                    "kind": "AgentRun",
                    "metadata": {"name": waiting_run},
                    "spec": {"agent": agent_name, "input": "What is 1 + 1?", "keepAlive": True},
                },
            ).status_code
            == 201
        )

    def mid_command() -> bool:
        counts = get_group(server, group_name)["status"]["counts"]
        ticked = [r for r in runs_of(server, group_name) if _counter(server, r["metadata"]["name"])]
        unfinished = [r for r in ticked if r["status"]["phase"] == "Running"]
        return counts["succeeded"] >= 1 and bool(unfinished) and counts["succeeded"] < 6

    wait_for(mid_command, timeout=120, interval=0.05, message="a run mid-command, mid-batch")
    wait_for(
        lambda: _run(server, done_run)["status"]["phase"] == "Succeeded", timeout=60, message="a finished run"
    )
    wait_for(
        lambda: _run(server, waiting_run)["status"].get("reason") == "AwaitingMessage",
        timeout=60,
        message="a waiting run",
    )
    before_done = _run(server, done_run)
    before_group = get_group(server, group_name)

    # `ray stop --force`, on this session's cluster only (a user's Ray on the machine stays up).
    assert server.kill_cluster() > 0
    with pytest.raises(httpx.HTTPError):
        with server.http() as http:
            http.get("/readyz", timeout=2)
    up = server.up()
    assert up.returncode == 0, up.stdout + up.stderr
    _reconnect(server, ray_driver)

    after_done = _run(server, done_run)
    assert after_done["status"] == before_done["status"], "a finished run is exactly as it was"
    with server.http() as http:
        assert http.get(f"{RUNS}/{done_run}/answer").json()["answer"].strip() == "6 * 7 = 42."
        assert http.get(f"{GROUPS}/{group_name}").json()["spec"] == before_group["spec"]
    for run in runs_of(server, group_name):
        settle(server, run["metadata"]["name"], unattended=True)
    finished(server, group_name, timeout=180)
    audit_group(server, group_name, members=6, max_active=3)

    waiting = _run(server, waiting_run)
    assert (waiting["status"]["phase"], waiting["status"]["reason"]) == ("Waiting", "AwaitingMessage")
    with server.http() as http:
        sent = http.post(
            f"{RUNS}/{waiting_run}/messages", json={"payload": "What is 2 + 3?", "messageKey": "m1"}
        )
        assert sent.status_code == 202, sent.text
        wait_for(
            lambda: (
                len(_run(server, waiting_run)["status"]["turns"]) == 2
                and _run(server, waiting_run)["status"].get("reason") == "AwaitingMessage"
            ),
            timeout=90,
            message="the waiting run to answer after the restart",
        )
        assert http.get(f"{RUNS}/{waiting_run}/answer").json()["answer"].strip() == "2 + 3 = 5."


# -- a node dies, or stops answering -------------------------------------------------------------


def _signal_tree(process: subprocess.Popen[bytes], signum: int) -> list[psutil.Process]:
    """Send ``signum`` to a `ray start --block` node and every process it started."""
    root = psutil.Process(process.pid)
    family = [root, *root.children(recursive=True)]
    for member_process in family:
        try:
            member_process.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
    return family


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the node and every process it started: a node that vanishes."""
    _signal_tree(process, signal.SIGKILL)
    process.wait(timeout=30)


class _SecondNode:
    """A second Ray node on this machine (it shares the disk, so tests delete what it "loses")."""

    def __init__(self, server: Server, ray_driver: Any) -> None:
        self._ray = ray_driver
        self.head = ray_driver.get_runtime_context().get_node_id()
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "ray"),
                "start",
                "--address",
                ray_driver.get_runtime_context().gcs_address,
                "--block",
                "--num-cpus",
                "1",
                "--disable-usage-stats",
            ],
            env=server.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.id = wait_for(self._joined, timeout=60, interval=0.5, message="the second node to join")
        wait_for(
            self._has_parked_actors, timeout=90, interval=0.5, message="parked run actors on the new node"
        )

    def _joined(self) -> str | None:
        alive = [n["NodeID"] for n in self._ray.nodes() if n.get("Alive") and n["NodeID"] != self.head]
        return alive[0] if alive else None

    def _has_parked_actors(self) -> bool:
        from ray.util.state import list_actors

        # A parked run actor waits inside its __init__: Ray lists it as PENDING_CREATION.
        actors = list_actors(filters=[("state", "=", "PENDING_CREATION")], limit=10000)
        return sum(1 for actor in actors if (actor.name or "").startswith(f"runslot.{self.id[:8]}.")) >= 2

    def is_dead(self) -> bool:
        return not any(n["NodeID"] == self.id and n.get("Alive") for n in self._ray.nodes())

    def end(self) -> None:
        if self.process.poll() is None:
            _kill_tree(self.process)


def _fired_run(server: Server, point: str) -> tuple[str, int]:
    """The run (by its journal prefix in the context) and the pid of the process that fired ``point``."""
    context = wait_for(
        lambda: server.fired_context(point), timeout=120, interval=0.05, message=f"{point} to fire"
    )
    name = context.split("/agentruns/", 1)[1].split("/", 1)[0]
    pid = int(next(server.faults.glob(f".{point}.fired.*")).name.rsplit(".", 1)[1])
    return name, pid


def _group_with_a_run_on(server: Server, point: str, max_active: int, members: int) -> tuple[str, str, int]:
    """A group of counted runs, one of which fired ``point`` (armed for the second node): its
    name, that run and the pid that fired. The pool spreads runs over the nodes' parked actors,
    but a node whose actors are still starting (Ray lists them parked before they have asked the
    control plane for a run) gets none, and on a loaded machine a whole group can run on the
    head: then another group is started, until one run lands on the node or 4 groups have not."""
    for _ in range(4):
        _, group_name = _counted_group(server, max_active=max_active, members=members)

        def fired_or_finished(name: str = group_name) -> bool:
            phase = (get_group(server, name).get("status") or {}).get("phase")
            return server.fired(point) or phase in ("Succeeded", "Failed", "Cancelled")

        wait_for(
            fired_or_finished, timeout=240, interval=0.1, message=f"{point} to fire or {group_name} to end"
        )
        if server.fired(point):
            return (group_name, *_fired_run(server, point))
    raise AssertionError(f"4 groups ran without a run on the second node ({point} never fired)")


def _journal(server: Server, name: str) -> list[Any]:
    from nodus_ray.durable.journal import Journal
    from nodus_ray.store import layout

    return Journal(server.store(), layout.journal_folder("default", name)).load()


def test_a_worker_node_killed_mid_batch_its_runs_move_and_restore_their_workspaces(
    server: Server,
    ray_driver: Any,
) -> None:
    node = _SecondNode(server, ray_driver)
    try:
        # The first run on the new node to record its command freezes right there (its
        # snapshot is stored, its Completed written): then the node dies with its disk.
        server.arm("step-recorded", f"/command-1-1 node={node.id}", action="hold")
        group_name, moved, _ = _group_with_a_run_on(server, "step-recorded", max_active=4, members=8)
        workspace = workspace_of(server, moved)
        _kill_tree(node.process)
        subprocess.run(
            ["rm", "-rf", str(workspace), str(WorkspaceSnapshots.marker_of(workspace))], check=True
        )

        for run in runs_of(server, group_name):
            settle(server, run["metadata"]["name"], timeout=240)
        finished(server, group_name, timeout=240)
        audit_group(server, group_name, members=8, max_active=4)
        status = _run(server, moved)["status"]
        assert status["attempts"] >= 2, status
        assert status["sandbox"]["nodeId"] == node.head
        assert status["sandbox"]["origin"] == "restored", status["sandbox"]
    finally:
        node.end()


def test_a_zombie_actor_woken_after_its_replacement_finished_the_step_does_nothing(
    server: Server,
    ray_driver: Any,
) -> None:
    """A node stops answering (SIGSTOP: a partition, a frozen VM) while one of its run actors has
    written a command's Started: Ray declares the node dead, a replacement on the head runs the
    command and finishes the run. Then the old actor wakes. It must not run the command, and must
    write nothing: it stops at its epoch check (and is made to die there, so the test sees it)."""
    node = _SecondNode(server, ray_driver)
    try:
        server.arm("step-started", f"/command-1-1 node={node.id}", action="hold")
        group_name, zombie_run, zombie_pid = _group_with_a_run_on(
            server, "step-started", max_active=3, members=6
        )
        server.arm("actor-fenced", f"default/{zombie_run}")
        _signal_tree(node.process, signal.SIGSTOP)  # the node stops answering
        wait_for(node.is_dead, timeout=120, interval=0.5, message="Ray to declare the stopped node dead")

        settle(server, zombie_run, timeout=240)
        assert _run(server, zombie_run)["status"]["attempts"] >= 2
        before = _journal(server, zombie_run)
        # The zombie wakes, alone: its raylet stays stopped, so nothing kills it for Ray's sake;
        # then it goes on from the point it was held at, just after writing Started.
        psutil.Process(zombie_pid).send_signal(signal.SIGCONT)
        server.release("step-started")
        wait_for(
            lambda: server.fired("actor-fenced"), timeout=60, interval=0.1, message="the zombie to be fenced"
        )
        after = _journal(server, zombie_run)
        assert after == before, "the zombie wrote nothing"
        history = [(r.seq, r.step_id, r.state, r.attempt) for r in after if r.kind != "message"]
        assert _counter(server, zombie_run) == "tick\n", f"the command ran once: {history}"
        started = [(r.step_id, r.attempt) for r in after if r.state == "Started"]
        assert len(started) == len(set(started)), f"one Started per attempt of each step: {started}"
        commands = [r for r in after if r.kind == "command" and r.state in ("Completed", "Resolved")]
        assert len(commands) == 1, commands

        for run in runs_of(server, group_name):
            settle(server, run["metadata"]["name"], timeout=240)
        finished(server, group_name, timeout=240)
        audit_group(server, group_name, members=6, max_active=3)
    finally:
        node.end()
