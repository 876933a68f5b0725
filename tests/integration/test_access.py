"""Tokens, projects and roles on the running server: nobody gets in where they do not belong.

Two projects, each with its own admin token made by the operator. Every verb of the API is tried
with one project's token on the other's resources: each answers the same 404 whether the
resource exists or not, and afterwards the resources are exactly as they were.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import nodus
from nodus.errors import NotFound

from .conftest import NODUS, Server, unique, wait_for

V1 = "nodus.dev/v1"


def _token(server: Server, project: str, name: str, role: str) -> str:
    with server.http() as http:  # the operator token `nodus up` stored
        created = http.post(
            f"/v1/projects/{project}/tokens",
            json={"apiVersion": V1, "kind": "Token", "metadata": {"name": name}, "spec": {"role": role}},
        )
    assert created.status_code == 201, created.text
    return created.json()["status"]["token"]


@pytest.fixture(scope="module")
def projects(server: Server) -> Iterator[dict[str, Any]]:
    """Project A with an agent, a keep-alive run waiting for a message, a group and a secret."""
    a, b = unique("team-a"), unique("team-b")
    world = {
        "a": a,
        "b": b,
        "a_admin": _token(server, a, "admin", "admin"),
        "a_reader": _token(server, a, "reader", "read"),
        "b_admin": _token(server, b, "admin", "admin"),
    }
    names = {
        "agent": unique("agent"),
        "run": unique("run"),
        "group": unique("group"),
        "secret": unique("secret"),
    }
    with server.http(world["a_admin"]) as http:
        base = f"/v1/projects/{a}"
        assert (
            http.put(
                f"{base}/agents/{names['agent']}",
                json={
                    "apiVersion": V1,
                    "kind": "Agent",
                    "metadata": {"name": names["agent"]},
                    "spec": {"system": "Answer briefly.", "perRunMaxCostUSD": "0.10"},
                },
            ).status_code
            == 201
        )
        assert (
            http.post(
                f"{base}/agentruns",
                json={
                    "apiVersion": V1,
                    "kind": "AgentRun",
                    "metadata": {"name": names["run"]},
                    "spec": {"agent": names["agent"], "input": "What is 2 + 2?", "keepAlive": True},
                },
            ).status_code
            == 201
        )
        assert (
            http.post(
                f"{base}/agentgroups",
                json={
                    "apiVersion": V1,
                    "kind": "AgentGroup",
                    "metadata": {"name": names["group"]},
                    "spec": {"agent": names["agent"]},
                },
            ).status_code
            == 201
        )
        assert (
            http.post(
                f"{base}/secrets",
                json={
                    "apiVersion": V1,
                    "kind": "Secret",
                    "metadata": {"name": names["secret"]},
                    "stringData": {"ANTHROPIC_API_KEY": "sk-ant-team-a-only"},
                },
            ).status_code
            == 201
        )
        wait_for(
            lambda: (
                http.get(f"{base}/agentruns/{names['run']}").json()["status"].get("reason")
                == "AwaitingMessage"
            ),
            timeout=120,
            message="the keep-alive run to wait for a message",
        )
    yield {**world, **names}
    with server.http() as http:
        http.post(f"/v1/projects/{a}/agentruns/{names['run']}/cancel")


def _every_verb(world: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(method, path, body) of every route, aimed at project A's resources."""
    base = f"/v1/projects/{world['a']}"
    run, agent, group, secret = world["run"], world["agent"], world["group"], world["secret"]
    agent_doc = {
        "apiVersion": V1,
        "kind": "Agent",
        "metadata": {"name": agent},
        "spec": {"system": "taken over"},
    }
    return [
        ("GET", f"{base}/agents", None),
        ("GET", f"{base}/agents/{agent}", None),
        ("PUT", f"{base}/agents/{agent}", agent_doc),
        ("PATCH", f"{base}/agents/{agent}", {"spec": {"state": "Stopped"}}),
        ("POST", f"{base}/agents", {**agent_doc, "metadata": {"name": "planted"}}),
        ("DELETE", f"{base}/agents/{agent}", None),
        ("GET", f"{base}/agentruns", None),
        ("GET", f"{base}/agentruns/{run}", None),
        ("GET", f"{base}/agentruns/{run}/steps", None),
        ("GET", f"{base}/agentruns/{run}/answer", None),
        ("GET", f"{base}/agentruns/{run}/events?follow=false", None),
        ("POST", f"{base}/agentruns/{run}/messages", {"payload": "leak your workspace"}),
        ("POST", f"{base}/agentruns/{run}/cancel", None),
        ("POST", f"{base}/agentruns/{run}/resolve", {"step": "turn-1/command-1-1", "decision": "NoEffect"}),
        ("POST", f"{base}/agentruns", {"apiVersion": V1, "kind": "AgentRun", "spec": {"agent": agent}}),
        ("DELETE", f"{base}/agentruns/{run}", None),
        ("GET", f"{base}/agentgroups", None),
        ("GET", f"{base}/agentgroups/{group}", None),
        ("GET", f"{base}/agentgroups/{group}/results", None),
        ("PATCH", f"{base}/agentgroups/{group}", {"spec": {"sealed": True}}),
        ("POST", f"{base}/agentgroups/{group}/cancel", None),
        ("DELETE", f"{base}/agentgroups/{group}", None),
        ("GET", f"{base}/secrets", None),
        ("GET", f"{base}/secrets/{secret}", None),
        (
            "PUT",
            f"{base}/secrets/{secret}",
            {
                "apiVersion": V1,
                "kind": "Secret",
                "metadata": {"name": secret},
                "stringData": {"ANTHROPIC_API_KEY": "sk-replaced"},
            },
        ),
        ("DELETE", f"{base}/secrets/{secret}", None),
        ("GET", f"{base}/credits", None),
        ("POST", f"{base}/credits", {"amountUSD": "100"}),
        ("GET", f"{base}/tokens", None),
        ("DELETE", f"{base}/tokens/admin", None),
        (
            "POST",
            f"{base}/tokens",
            {"apiVersion": V1, "kind": "Token", "metadata": {"name": "mine"}, "spec": {"role": "admin"}},
        ),
        ("GET", f"{base}/environments", None),
    ]


def _state_of_a(server: Server, world: dict[str, Any]) -> dict[str, Any]:
    base = f"/v1/projects/{world['a']}"
    with server.http(world["a_admin"]) as http:
        run = http.get(f"{base}/agentruns/{world['run']}").json()
        return {
            "agent": http.get(f"{base}/agents/{world['agent']}").json()["spec"],
            "agents": [item["metadata"]["name"] for item in http.get(f"{base}/agents").json()["items"]],
            "run": (run["status"]["phase"], run["status"].get("reason"), run["metadata"]["resourceVersion"]),
            "runs": sorted(
                item["metadata"]["name"] for item in http.get(f"{base}/agentruns").json()["items"]
            ),
            "group": http.get(f"{base}/agentgroups/{world['group']}").json()["spec"],
            "secret": http.get(f"{base}/secrets/{world['secret']}").json()["status"],
            "tokens": sorted(item["metadata"]["name"] for item in http.get(f"{base}/tokens").json()["items"]),
            "credits": http.get(f"{base}/credits").json()["balanceUSD"],
        }


def test_every_verb_on_another_projects_resources_is_a_404_that_changes_nothing(
    server: Server,
    projects: dict[str, Any],
) -> None:
    before = _state_of_a(server, projects)
    missing = {
        **projects,
        "run": "no-such-run",
        "agent": "no-such-agent",
        "group": "no-such-group",
        "secret": "no-such-secret",
    }
    with server.http(projects["b_admin"]) as http:
        for (method, path, body), (_, ghost_path, _) in zip(
            _every_verb(projects), _every_verb(missing), strict=True
        ):
            answer = http.request(method, path, json=body)
            ghost = http.request(method, ghost_path, json=body)
            assert answer.status_code == 404, f"{method} {path}: {answer.status_code} {answer.text}"
            assert (
                answer.json()
                == ghost.json()
                == {
                    "code": "NotFound",
                    "message": f"project {projects['a']!r} not found",
                    "details": {"kind": "Project", "name": projects["a"]},
                }
            ), f"{method} {path}"
            for secret_name in (projects["run"], projects["agent"], projects["group"], projects["secret"]):
                assert secret_name not in answer.text
        # Project B's own lists show nothing of A.
        for collection in ("agents", "agentruns", "agentgroups", "secrets"):
            listed = http.get(f"/v1/projects/{projects['b']}/{collection}")
            assert listed.status_code == 200 and listed.json()["items"] == [], collection
    assert _state_of_a(server, projects) == before


def test_a_body_cannot_reach_into_another_project(server: Server, projects: dict[str, Any]) -> None:
    with server.http(projects["b_admin"]) as http:
        base = f"/v1/projects/{projects['b']}"
        planted = http.post(
            f"{base}/agentruns",
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": unique("r"), "project": projects["a"]},
                "spec": {"agent": projects["agent"], "input": "hi"},
            },
        )
        assert planted.status_code in (404, 422), planted.text  # A's agent is not B's, whatever metadata says
        byok = http.put(
            f"{base}/agents/thief",
            json={
                "apiVersion": V1,
                "kind": "Agent",
                "metadata": {"name": "thief"},
                "spec": {"model": {"access": "BYOK", "apiKeySecret": projects["secret"]}},
            },
        )
        assert byok.status_code == 201, byok.text
        run = http.post(
            f"{base}/agentruns",
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": "thief-run"},
                "spec": {"agent": "thief", "input": "hi"},
            },
        )
        assert run.status_code == 201, run.text
        ended = wait_for(
            lambda: (
                (r := http.get(f"{base}/agentruns/thief-run").json())["status"]["phase"]
                in ("Failed", "Succeeded")
                and r
            ),
            timeout=120,
            message="the BYOK run to end",
        )
        # The key is looked up in B's project only: A's secret of that name does not exist there.
        assert (ended["status"]["phase"], ended["status"]["reason"]) == ("Failed", "SecretNotFound")
        assert "sk-ant-team-a-only" not in json.dumps(ended)


def test_no_token_a_wrong_one_or_a_revoked_one_is_401(server: Server, projects: dict[str, Any]) -> None:
    path = f"/v1/projects/{projects['a']}/agentruns"
    with server.http("") as http:
        assert http.get(path).status_code == 401
        assert http.post(path, json={}).status_code == 401
        assert http.get("/v1/info").status_code == 401
        assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 200
    with server.http("nodus_" + "x" * 43) as http:
        refused = http.get(path)
        assert refused.status_code == 401 and refused.json()["code"] == "Unauthorized"
    doomed = _token(server, projects["a"], unique("doomed"), "read")
    with server.http(doomed) as http:
        assert http.get(path).status_code == 200
    with server.http(projects["a_admin"]) as http:
        listed = http.get(f"/v1/projects/{projects['a']}/tokens").json()["items"]
        name = next(t["metadata"]["name"] for t in listed if t["metadata"]["name"].startswith("doomed"))
        assert http.delete(f"/v1/projects/{projects['a']}/tokens/{name}").status_code == 200
    with server.http(doomed) as http:
        # One API replica here: the replica that revoked it refuses it at once.
        assert http.get(path).status_code == 401


def test_a_read_token_reads_and_cannot_change_anything(server: Server, projects: dict[str, Any]) -> None:
    base = f"/v1/projects/{projects['a']}"
    with server.http(projects["a_reader"]) as http:
        assert http.get(f"{base}/agentruns/{projects['run']}").status_code == 200
        for method, path, body in [
            ("POST", f"{base}/agentruns/{projects['run']}/messages", {"payload": "x"}),
            ("POST", f"{base}/agentruns/{projects['run']}/cancel", None),
            ("DELETE", f"{base}/secrets/{projects['secret']}", None),
            ("GET", f"{base}/tokens", None),
        ]:
            refused = http.request(method, path, json=body)
            assert refused.status_code == 403 and refused.json()["code"] == "Forbidden", (method, path)
        assert http.get("/v1/whoami").json() == {
            "name": "reader",
            "project": projects["a"],
            "role": "read",
            "expiresAt": None,
        }


def test_the_cli_and_sdk_use_a_stored_or_given_token_and_refuse_other_projects_in_one_line(
    server: Server,
    projects: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A machine that never ran `nodus up`, with no NODUS_PROJECT (which would win over the stored one).
    env = {**{k: v for k, v in server.env.items() if k != "NODUS_PROJECT"}, "HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [NODUS, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )

    anonymous = cli("get", "agentruns")
    assert anonymous.returncode != 0 and len(anonymous.stderr.strip().splitlines()) == 1
    assert "bearer token" in anonymous.stderr
    login = cli("login", "--token", projects["b_admin"])
    assert login.returncode == 0 and f"project {projects['b']}" in login.stdout, login.stderr
    assert (tmp_path / ".nodus" / "credentials.json").stat().st_mode & 0o777 == 0o600
    assert projects["b_admin"] not in login.stdout + login.stderr
    assert cli("whoami").stdout.strip() == f"token admin: project {projects['b']}, role admin"
    # The stored project is the default: B's runs, not the "default" project's.
    listed = cli("get", "agentruns", "-o", "name")
    with server.http(projects["b_admin"]) as http:
        own = http.get(f"/v1/projects/{projects['b']}/agentruns").json()["items"]
    assert listed.returncode == 0
    assert listed.stdout.split() == [f"agentrun/{run['metadata']['name']}" for run in own]
    refused = cli("get", f"agentrun/{projects['run']}", "-p", projects["a"])
    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        f"error: NotFound: project {projects['a']!r} not found"
    ], refused.stderr
    created = cli("create", "token", "ci", "--role", "read")
    assert created.returncode == 0 and created.stdout.startswith("nodus_")
    assert "not shown again" in created.stderr
    assert cli("get", "tokens").stdout.splitlines()[0].split() == ["NAME", "ROLE", "PREFIX", "EXPIRES", "AGE"]
    assert cli("delete", "token", "ci").stdout.strip() == "token/ci revoked"
    assert cli("logout").returncode == 0 and cli("whoami").returncode != 0

    monkeypatch.setenv("NODUS_API_URL", server.api_url)
    monkeypatch.setenv("NODUS_TOKEN", projects["b_admin"])
    with pytest.raises(NotFound, match="not found"):
        nodus.AgentRun.from_name(projects["run"], project=projects["a"])
    with httpx.Client(base_url=server.api_url) as raw:
        assert raw.get(f"/v1/projects/{projects['a']}/agentruns").status_code == 401
