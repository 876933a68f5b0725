"""AgentGroups end to end: the documents' two flows, admission under the limits, dependencies,
seal, cancel, delete, batches, and a supervisor that dies mid-group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from .conftest import Server, unique, wait_for
from .kit import (
    agent as _agent,
)
from .kit import (
    batch as _batch,
)
from .kit import (
    finished as _finished,
)
from .kit import (
    get_group as _get_group,
)
from .kit import (
    group as _group,
)
from .kit import (
    member as _member,
)
from .kit import (
    most_at_once as _most_at_once,
)
from .kit import (
    runs_of as _runs_of,
)
from .kit import (
    seal as _seal,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agents" / "parallel-agents"
AGENTS = "/v1/projects/default/agents"
GROUPS = "/v1/projects/default/agentgroups"
RUNS = "/v1/projects/default/agentruns"
V1 = "nodus.dev/v1"


# -- the documents' flows ------------------------------------------------------------------------


def test_the_parallel_agents_example_of_document_001_runs_unchanged(server: Server) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "main.py")],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Succeeded: 3 of 3 runs succeeded"
    assert lines[1].startswith("parallel-agents-py-a -> ") and "capital of France" in lines[1]
    assert lines[2].startswith("parallel-agents-py-b -> ") and "capital of Japan" in lines[2]
    assert lines[3].startswith("parallel-agents-py-c -> ")
    assert lines[4:] == ["2 + 2 = 4.", "3 + 3 = 6."]  # map answers, in input order
    # The example deletes its group, and map deletes its ephemeral one, with all their runs.
    with server.http() as http:
        assert http.get(f"{GROUPS}/parallel-agents-py").status_code == 404
        groups = http.get(GROUPS).json()["items"]
        assert not [g for g in groups if g["metadata"]["name"].startswith("parallel-agents-py-map")]
        runs = http.get(RUNS, params={"agent": "parallel-agents-py"}).json()["items"]
        assert runs == []


def test_the_yaml_flow_of_document_002(server: Server) -> None:
    for name in ("agent.yaml", "group.yaml", "runs.yaml"):
        applied = server.cli("apply", "-f", str(EXAMPLE / name))
        assert applied.returncode == 0, applied.stderr
    assert "agentrun/parallel-agents-c created" in applied.stdout
    # c waits for a and b; the group waits for its seal.
    c = json.loads(server.cli("get", "ar/parallel-agents-c", "-o", "json").stdout)["status"]
    if c.get("admittedAt") is None:
        assert (c["phase"], c["reason"]) == ("Pending", "DependencyWait")
    assert server.cli("patch", "ag/parallel-agents", "--patch", '{"spec":{"sealed":true}}').returncode == 0
    waited = server.cli(
        "wait", "ag/parallel-agents", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=2m"
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr

    table = server.cli("get", "ag").stdout
    row = next(line for line in table.splitlines() if line.startswith("parallel-agents "))
    assert "Succeeded" in row and "3/3" in row and "/ $0.60" in row
    members = server.cli("get", "ar", "--field-selector", "spec.group=parallel-agents").stdout.splitlines()
    assert [line.split()[0] for line in members[1:]] == [
        "parallel-agents-a",
        "parallel-agents-b",
        "parallel-agents-c",
    ]
    assert all("Succeeded" in line for line in members[1:])
    assert server.cli("agentrun", "answer", "parallel-agents-c").stdout.startswith("You asked:")
    runs = _runs_of(server, "parallel-agents")
    c_run = runs[2]["status"]
    assert all(c_run["admittedAt"] > run["status"]["finishedAt"] for run in runs[:2])
    group = _get_group(server, "parallel-agents")["status"]
    assert group["counts"] == {
        "queued": 0,
        "active": 0,
        "waiting": 0,
        "succeeded": 3,
        "failed": 0,
        "cancelled": 0,
        "total": 3,
    }
    assert Decimal(group["cost"]["totalUSD"]) == sum(Decimal(r["status"]["cost"]["totalUSD"]) for r in runs)
    # Sealed: no more runs; applying the files again changes nothing (the seal stays).
    again = server.cli("apply", "-f", str(EXAMPLE / "runs.yaml"))
    assert again.returncode == 0 and again.stdout.count("unchanged") == 3
    group_again = server.cli("apply", "-f", str(EXAMPLE / "group.yaml"))
    assert group_again.returncode == 0 and "unchanged" in group_again.stdout, group_again.stderr
    assert _get_group(server, "parallel-agents")["spec"]["sealed"] is True
    late = server.cli(
        "create",
        "agentrun",
        "parallel-agents-d",
        "--agent",
        "parallel-agents-worker",
        "--prompt",
        "x",
        "--group",
        "parallel-agents",
        "--task-key",
        "d",
    )
    assert late.returncode != 0 and "sealed" in late.stderr

    # The same group from flags, patched live, cancelled and deleted.
    assert server.cli("delete", "ag/parallel-agents").returncode == 0
    assert server.cli("get", "ar/parallel-agents-a").returncode != 0
    created = server.cli(
        "create",
        "agentgroup",
        "parallel-agents",
        "--agent",
        "parallel-agents-worker",
        "--max-active",
        "2",
        "--max-cost",
        "0.60",
    )
    assert created.returncode == 0, created.stderr
    patched = server.cli("patch", "ag/parallel-agents", "--patch", '{"spec":{"limits":{"maxActive":4}}}')
    assert patched.returncode == 0, patched.stderr
    assert _get_group(server, "parallel-agents")["spec"]["limits"]["maxActive"] == 4
    assert server.cli("cancel", "ag/parallel-agents").returncode == 0
    assert _finished(server, "parallel-agents")["status"]["phase"] == "Cancelled"
    assert server.cli("delete", "ag/parallel-agents").returncode == 0
    assert server.cli("get", "ag/parallel-agents").returncode != 0


# -- admission -------------------------------------------------------------------------------------


def test_never_more_than_max_active_run_at_once_and_a_live_patch_admits_more(server: Server) -> None:
    agent, group = unique("limit"), unique("ga")
    _agent(server, agent)
    _group(server, group, agent, limits={"maxActive": 2})
    created = _batch(server, [_member(group, agent, f"t{i}") for i in range(6)])
    assert created.status_code == 201, created.text
    assert [run["metadata"]["name"] for run in created.json()["items"]] == [f"{group}-t{i}" for i in range(6)]

    def blocked() -> dict[str, Any] | None:
        status = _get_group(server, group)["status"]
        return status if status["blockedReasons"]["MaxActiveReached"] else None

    status = wait_for(blocked, timeout=30, message="queued runs to wait for a slot")
    assert status["counts"]["active"] + status["counts"]["waiting"] <= 2
    queued = [
        run
        for run in _runs_of(server, group)
        if run["status"]["phase"] == "Pending" and not run["status"].get("admittedAt")
    ]
    assert queued and all(run["status"]["reason"] == "GroupWait" for run in queued)
    _seal(server, group)
    final = _finished(server, group)
    assert final["status"]["phase"] == "Succeeded"
    assert _most_at_once(_runs_of(server, group)) == 2


def test_the_group_cap_admits_only_what_fits_and_is_never_passed(server: Server) -> None:
    agent, group = unique("capped"), unique("gc")
    _agent(server, agent, cap="0.10")
    _group(server, group, agent, limits={"maxActive": 10}, maxCostUSD="0.25")
    assert _batch(server, [_member(group, agent, f"t{i}") for i in range(5)]).status_code == 201

    def cost_blocked() -> dict[str, Any] | None:
        status = _get_group(server, group)["status"]
        return status if status["blockedReasons"]["MaxCostReached"] else None

    status = wait_for(cost_blocked, timeout=30, message="runs to wait for room under the cap")
    assert Decimal(status["cost"]["reservedUSD"]) + Decimal(status["cost"]["totalUSD"]) <= Decimal("0.25")
    _seal(server, group)
    final = _finished(server, group)["status"]
    assert final["phase"] == "Succeeded" and final["counts"]["succeeded"] == 5
    assert Decimal(final["cost"]["totalUSD"]) <= Decimal("0.25")
    assert _most_at_once(_runs_of(server, group)) <= 2  # 0.25 holds two 0.10 caps, not three


def test_a_cap_below_one_runs_cap_starts_nothing_and_says_so_until_raised(server: Server) -> None:
    agent, group = unique("tiny"), unique("gt")
    _agent(server, agent, cap="0.10")
    _group(server, group, agent, maxCostUSD="0.05")
    assert _batch(server, [_member(group, agent, "a")]).status_code == 201
    status = wait_for(
        lambda: (s := _get_group(server, group)["status"])["blockedReasons"]["MaxCostReached"] and s,
        timeout=30,
        message="the run to be blocked by the cap",
    )
    assert "below a run's cap" in status["message"] and status["counts"]["active"] == 0
    with server.http() as http:
        lowered = http.patch(f"{GROUPS}/{group}", json={"spec": {"maxCostUSD": "0.01"}})
        assert lowered.status_code == 409 and lowered.json()["code"] == "CapLowered"
        assert lowered.json()["details"]["field"] == "spec.maxCostUSD"
        assert (
            http.patch(f"{GROUPS}/{group}", json={"spec": {"maxCostUSD": "0.10", "sealed": True}}).status_code
            == 200
        )
    assert _finished(server, group)["status"]["phase"] == "Succeeded"


def test_a_failed_dependency_cancels_its_dependents_and_fails_the_group(server: Server) -> None:
    agent, group = unique("broken"), unique("gf")
    # A BYOK agent whose secret does not exist: every run of it fails at its start.
    _agent(
        server, agent, model={"access": "BYOK", "name": "claude-haiku-5-5", "apiKeySecret": unique("missing")}
    )
    _group(server, group, agent)
    created = _batch(
        server,
        [
            _member(group, agent, "a"),
            _member(group, agent, "b", deps=["a"]),
            _member(group, agent, "c", deps=["b"]),
        ],
    )
    assert created.status_code == 201, created.text
    _seal(server, group)
    final = _finished(server, group)["status"]
    assert (final["phase"], final["reason"]) == ("Failed", "RunsFailed")
    phases = {
        run["spec"]["taskKey"]: (run["status"]["phase"], run["status"]["reason"])
        for run in _runs_of(server, group)
    }
    # c's own dependency (b) was cancelled, not failed: the documents' rule, applied level by level.
    assert phases == {
        "a": ("Failed", "SecretNotFound"),
        "b": ("Cancelled", "DependencyFailed"),
        "c": ("Cancelled", "DependencyCancelled"),
    }


def test_a_queued_run_whose_deadline_passes_fails_without_ever_starting(server: Server) -> None:
    agent, group = unique("late"), unique("gd")
    _agent(server, agent)
    _group(server, group, agent, limits={"maxActive": 1})
    slow = _member(group, agent, "slow", "Use the shell to run `sleep 6`")
    late = _member(group, agent, "late")
    late["spec"]["deadline"] = "2s"  # passes while "slow" holds the only place
    assert _batch(server, [slow, late]).status_code == 201
    _seal(server, group)

    def late_failed() -> dict[str, Any] | None:
        run = next(r for r in _runs_of(server, group) if r["spec"]["taskKey"] == "late")
        return run if run["status"]["phase"] == "Failed" else None

    run = wait_for(late_failed, timeout=30, message="the queued run to fail at its deadline")
    assert run["status"]["reason"] == "DeadlineExceeded"
    assert not run["status"].get("admittedAt") and run["status"]["attempts"] == 0, "it never started"
    slow_run = next(r for r in _runs_of(server, group) if r["spec"]["taskKey"] == "slow")
    assert slow_run["status"]["phase"] == "Running", "the deadline passed before the place came free"
    final = _finished(server, group)["status"]
    assert (final["phase"], final["counts"]["succeeded"], final["counts"]["failed"]) == ("Failed", 1, 1)
    with server.http() as http:
        assert http.get(f"{RUNS}/{run['metadata']['name']}/steps").json()["items"] == []


def test_cancel_keeps_finished_runs_and_a_cancelled_dependency_cancels_dependents(server: Server) -> None:
    agent, group = unique("cancel"), unique("gx")
    _agent(server, agent)
    _group(server, group, agent, limits={"maxActive": 1})
    assert _batch(server, [_member(group, agent, "done")]).status_code == 201
    wait_for(
        lambda: _runs_of(server, group)[0]["status"]["phase"] == "Succeeded",
        timeout=60,
        message="the first run to succeed",
    )
    assert (
        _batch(
            server,
            [
                _member(group, agent, "slow", "Use the shell to run `sleep 30`"),
                _member(group, agent, "next", deps=["slow"]),
                _member(group, agent, "after", deps=["next"]),
            ],
        ).status_code
        == 201
    )
    with server.http() as http:
        wait_for(
            lambda: http.get(f"{RUNS}/{group}-slow").json()["status"]["phase"] == "Running",
            timeout=30,
            message="the slow run to start",
        )
        cancelled = http.post(f"{GROUPS}/{group}/cancel")
        assert cancelled.status_code == 200
    final = _finished(server, group)["status"]
    assert final["phase"] == "Cancelled"
    runs = {run["spec"]["taskKey"]: run["status"] for run in _runs_of(server, group)}
    assert runs["done"]["phase"] == "Succeeded" and runs["done"]["answer"]["preview"]
    assert runs["slow"]["phase"] == "Cancelled"
    assert {runs["next"]["phase"], runs["after"]["phase"]} == {"Cancelled"}
    with server.http() as http:
        assert http.get(f"{RUNS}/{group}-done/answer").status_code == 200
        refused = _batch(server, [_member(group, agent, "more")])
        assert refused.status_code == 409 and refused.json()["code"] == "GroupCancelled"
        deleted = http.delete(f"{GROUPS}/{group}")
        assert deleted.status_code == 200
        assert http.get(f"{GROUPS}/{group}").status_code == 404
        assert http.get(f"{RUNS}/{group}-done").status_code == 404
        assert not (server.storage / "projects" / "default" / "agentgroups" / group).exists()


# -- batches ---------------------------------------------------------------------------------------


def test_a_batch_is_all_or_nothing_and_an_idempotency_key_replays_it(server: Server) -> None:
    agent, group = unique("batch"), unique("gb")
    _agent(server, agent)
    _group(server, group, agent, limits={"maxActive": 1})
    bad = _batch(
        server,
        [
            _member(group, agent, "a"),
            _member(group, agent, "b", deps=["a"]),
            _member(group, agent, "c", deps=["nope"]),
        ],
        key="k-bad",
    )
    assert bad.status_code == 422 and bad.json()["code"] == "UnknownDependency"
    assert bad.json()["details"]["index"] == 2
    cycle = _batch(server, [_member(group, agent, "a", deps=["b"]), _member(group, agent, "b", deps=["a"])])
    assert cycle.status_code == 422 and cycle.json()["code"] in ("DependencyCycle", "UnknownDependency")
    assert _runs_of(server, group) == []

    runs = [_member(group, agent, key) for key in ("a", "b")] + [_member(group, agent, "c", deps=["a", "b"])]
    first = _batch(server, runs, key="k-1")
    assert first.status_code == 201
    again = _batch(server, runs, key="k-1")
    assert again.status_code == 200 and again.headers["Idempotency-Replayed"] == "true"
    assert again.json()["items"] == first.json()["items"]
    assert len(_runs_of(server, group)) == 3
    other = _batch(server, [_member(group, agent, "d")], key="k-1")
    assert other.status_code == 409 and other.json()["code"] == "IdempotencyKeyReused"
    with server.http() as http:
        assert (
            http.patch(f"{GROUPS}/{group}", json={"spec": {"limits": {"maxPending": 4}}}).status_code == 200
        )
    pending = _batch(server, [_member(group, agent, f"p{i}") for i in range(5)])
    assert pending.status_code == 409 and pending.json()["code"] == "MaxPendingReached"
    assert pending.json()["details"]["field"] == "spec.limits.maxPending"
    over = _batch(server, [_member(group, agent, f"x{i}") for i in range(101)])
    assert over.status_code == 422 and over.json()["details"]["field"] == "items"
    wrong_agent = _batch(
        server,
        [
            {
                **_member(group, agent, "w"),
                "spec": {**_member(group, agent, "w")["spec"], "agent": "parallel-agents-worker"},
            }
        ],
    )
    assert wrong_agent.status_code in (404, 422)
    assert len(_runs_of(server, group)) == 3
    with server.http() as http:
        assert http.delete(f"{GROUPS}/{group}").status_code == 200


@pytest.mark.parametrize(
    "patch, code",
    [
        ({"spec": {"limits": {"maxActive": 0}}}, "Invalid"),
        ({"spec": {"limits": {"maxActive": 1001}}}, "Invalid"),
        ({"spec": {"limits": {"bogus": 1}}}, "Invalid"),
        ({"spec": {"agent": "someone-else"}}, "FieldImmutable"),
        ({"spec": {"maxCostUSD": None}}, "CapLowered"),
    ],
)
def test_bad_patches_are_refused_and_change_nothing(server: Server, patch: dict[str, Any], code: str) -> None:
    agent, group = unique("patch"), unique("gp")
    _agent(server, agent)
    before = _group(server, group, agent, maxCostUSD="0.50")
    with server.http() as http:
        refused = http.patch(f"{GROUPS}/{group}", json=patch)
        assert 400 <= refused.status_code < 500 and refused.json()["code"] == code, refused.text
        assert refused.json()["details"].get("field", "").startswith("spec")
        after = http.get(f"{GROUPS}/{group}").json()
        assert after["spec"] == before["spec"]
        assert http.delete(f"{GROUPS}/{group}").status_code == 200


# -- a supervisor that dies ------------------------------------------------------------------------


def test_a_killed_supervisor_is_rebuilt_from_its_runs_and_the_group_finishes(
    server: Server, ray_driver: Any
) -> None:
    from ray.util.state import list_actors

    agent, group = unique("rebuilt"), unique("gk")
    _agent(server, agent)
    _group(server, group, agent, limits={"maxActive": 2})
    assert _batch(server, [_member(group, agent, f"t{i}") for i in range(6)]).status_code == 201
    wait_for(
        lambda: _get_group(server, group)["status"]["counts"]["succeeded"] >= 1,
        timeout=60,
        message="a first run to succeed",
    )
    actors = list_actors(
        filters=[("name", "=", f"group.default.{group}"), ("state", "=", "ALIVE")], detail=True
    )
    assert actors and f"group=default/{group}" in (actors[0].repr_name or "")
    os.kill(int(actors[0].pid), signal.SIGKILL)  # Ray restarts it; it rebuilds from its members
    _seal(server, group)
    final = _finished(server, group)["status"]
    assert final["phase"] == "Succeeded" and final["counts"]["succeeded"] == 6
    runs = _runs_of(server, group)
    assert _most_at_once(runs) <= 2
    assert all(run["status"]["attempts"] == 1 for run in runs)  # no run was started twice


def test_a_group_goes_on_after_the_control_plane_crashes_mid_group(server: Server, ray_driver: Any) -> None:
    from ray.util.state import list_actors

    agent, group = unique("cp-crash"), unique("gq")
    _agent(server, agent)
    _group(server, group, agent, limits={"maxActive": 2})
    assert _batch(server, [_member(group, agent, f"t{i}") for i in range(6)]).status_code == 201
    wait_for(
        lambda: _get_group(server, group)["status"]["counts"]["succeeded"] >= 1,
        timeout=60,
        message="a first run to succeed",
    )
    control_plane = list_actors(
        filters=[("name", "=", "nodus-control-plane"), ("state", "=", "ALIVE")], detail=True
    )
    os.kill(int(control_plane[0].pid), signal.SIGKILL)  # Ray restarts it; it reloads storage

    def sealed() -> bool:
        with server.http() as http:
            return http.patch(f"{GROUPS}/{group}", json={"spec": {"sealed": True}}).status_code == 200

    wait_for(sealed, timeout=120, interval=0.5, message="the restarted control plane to take the seal")
    final = _finished(server, group)["status"]
    assert final["phase"] == "Succeeded" and final["counts"]["succeeded"] == 6
    runs = _runs_of(server, group)
    assert _most_at_once(runs) <= 2
    # Running actors were found again, so nothing they did was done twice. (A run admitted just
    # as the control plane died may get a second actor before it did anything: that is allowed.)
    with server.http() as http:
        for run in runs:
            steps = http.get(f"{RUNS}/{run['metadata']['name']}/steps").json()["items"]
            assert all(step["attempts"] == 1 for step in steps), (run["metadata"]["name"], steps)
