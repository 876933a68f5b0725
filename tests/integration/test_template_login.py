"""The ready-made template and a bare `nodus login`, on the session's real server.

Project nodus holds `claude-assistant` from the first start. A project with no Agent of that
name runs it, from the SDK (`ClaudeAgent.from_name(..., project="nodus")`, with a project token)
and from the CLI (`nodus create agentrun ... --agent claude-assistant`): each run lives in and
is billed to that project, pinned to the template's revision; that project's token reads the
template but cannot change it. A bare `nodus login` takes the token from standard input, checks
and stores it; a refused one is stored nowhere; the `nodus up` user is told who they are.
"""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import nodus

from .conftest import NODUS, Server, unique, wait_for

V1 = "nodus.dev/v1"
TEMPLATE = "/v1/projects/nodus/agents/claude-assistant"


def _project_token(server: Server, project: str, role: str = "write") -> str:
    with server.http() as http:  # the operator token `nodus up` stored
        created = http.post(
            f"/v1/projects/{project}/tokens",
            json={"apiVersion": V1, "kind": "Token", "metadata": {"name": "ci"}, "spec": {"role": role}},
        )
    assert created.status_code == 201, created.text
    token: str = created.json()["status"]["token"]
    return token


def _finished(server: Server, project: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        with server.http() as http:
            run: dict[str, Any] = http.get(f"/v1/projects/{project}/agentruns/{name}").json()
        return run if run["status"]["phase"] in ("Succeeded", "Failed", "Cancelled") else None

    finished: dict[str, Any] = wait_for(
        done, timeout=180, interval=0.2, message=f"{project}/{name} to finish"
    )
    return finished


def _template(server: Server) -> dict[str, Any]:
    with server.http() as http:
        found = http.get(TEMPLATE)
    assert found.status_code == 200, found.text
    template: dict[str, Any] = found.json()
    return template


def test_another_project_runs_the_template_from_the_sdk_billed_there_and_cannot_change_it(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = unique("tmpl")
    token = _project_token(server, project)
    template = _template(server)
    revision = template["status"]["revision"]
    assert template["metadata"]["labels"]["nodus.dev/template"] == "true"
    assert template["spec"]["model"]["families"] == ["haiku", "sonnet", "opus", "fable"]

    with server.http(token) as http:
        assert http.get(TEMPLATE).status_code == 200  # every token reads it
        for method in ("DELETE", "PATCH", "PUT"):
            body = {"spec": {"maxTokens": 8}} if method != "DELETE" else None
            refused = http.request(method, TEMPLATE, json=body)
            assert refused.status_code == 403 and refused.json()["code"] == "Forbidden", refused.text
        assert http.get("/v1/projects/nodus/agents").status_code == 404  # the rest of nodus stays hidden
        credits_before = Decimal(http.get(f"/v1/projects/{project}/credits").json()["spentUSD"])
    assert _template(server) == template  # nothing changed

    # The documented way, with a project token and no project set: its own project is used.
    monkeypatch.setenv("NODUS_API_URL", server.api_url)
    monkeypatch.setenv("NODUS_TOKEN", token)
    monkeypatch.delenv("NODUS_PROJECT", raising=False)
    agent = nodus.ClaudeAgent.from_name("claude-assistant", project="nodus")
    run = agent.submit("Use the shell to print the Python version")
    status = run.wait(timeout=180)
    assert status.phase == "Succeeded", status
    assert run.answer()
    answers = list(agent.map(["What is 2 + 2?"]))  # an ephemeral group of the caller's project
    assert len(answers) == 1 and answers[0]

    finished = _finished(server, project, run.name)
    assert finished["metadata"]["project"] == project
    assert finished["status"]["agentRevision"] == revision
    assert finished["status"]["agentProject"] == "nodus"
    spent = Decimal(finished["status"]["cost"]["totalUSD"])
    assert spent > 0
    with server.http(token) as http:
        credits_after = Decimal(http.get(f"/v1/projects/{project}/credits").json()["spentUSD"])
        assert credits_after - credits_before >= spent  # billed to the caller's project
    with server.http() as http:
        in_nodus = http.get("/v1/projects/nodus/agentruns").json()["items"]
    assert run.name not in {item["metadata"]["name"] for item in in_nodus}


def test_the_cli_creates_a_run_of_the_template_in_a_project_without_such_an_agent(server: Server) -> None:
    project = unique("tmpl-cli")
    created = server.cli(
        "create", "agentrun", "triage", "--agent", "claude-assistant", "--prompt", "Say hello", "-p", project
    )
    assert created.returncode == 0, created.stderr
    finished = _finished(server, project, "triage")
    assert finished["status"]["phase"] == "Succeeded", finished["status"]
    assert finished["status"]["agentProject"] == "nodus"
    assert finished["status"]["agentRevision"] == _template(server)["status"]["revision"]
    with server.http() as http:
        assert (
            http.get(f"/v1/projects/{project}/agents/claude-assistant").status_code == 404
        )  # none of its own


def test_bare_login_reads_the_token_from_standard_input_and_says_who_the_local_user_is(
    server: Server, tmp_path: Path
) -> None:
    project = unique("login")
    token = _project_token(server, project, role="read")
    file = tmp_path / "credentials.json"
    env = {**server.env, "NODUS_CREDENTIALS_FILE": str(file)}
    env.pop("NODUS_PROJECT", None)

    def login(given: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [NODUS, "login"], env=env, input=given, capture_output=True, text=True, timeout=60, check=False
        )

    for refused in (login("nodus_not-a-token\n"), login("")):
        assert refused.returncode != 0
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "nothing was stored" in lines[0]
    assert not file.exists()

    stored = login(f"{token}\n")
    assert stored.returncode == 0, stored.stderr
    assert f"project {project}" in stored.stdout and "role read" in stored.stdout
    (entry,) = json.loads(file.read_text())["servers"].values()
    assert entry == {"token": token, "project": project}
    assert login("nodus_not-a-token\n").returncode != 0
    (kept,) = json.loads(file.read_text())["servers"].values()
    assert kept == entry  # a refused token replaces nothing

    # The session's user, whose token `nodus up` stored, is told who they are and asked nothing.
    local = server.cli("login", input="")
    assert local.returncode == 0, local.stderr
    assert "already logged in" in local.stdout and "local-admin" in local.stdout
