"""Project nodus's ready-made template ``claude-assistant``: created at start, run from any project.

The run lives in the caller's project, pinned to the template's revision; every token reads the
template, no other project changes it (decision 47).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodus import ClaudeAgent, Client
from nodus.config import Settings
from nodus.errors import Forbidden, NodusError, NotFound
from nodus_ray.control.templates import (
    CLAUDE_ASSISTANT,
    TEMPLATE_LABEL,
    TEMPLATE_PROJECT,
    ensure_templates,
    is_template,
)
from nodus_ray.control.tokens import OPERATOR, Principal
from nodus_serve.auth import authorize, required_access
from tests.unit.test_control_support import Plane, agent_doc, group_doc, make_plane, run_doc


async def _seeded(tmp_path: Path) -> Plane:
    """A recovered plane that has done what the control plane does next: create the templates."""
    plane = await make_plane(tmp_path)
    await ensure_templates(plane.services.agents, plane.services.registry)
    return plane


def test_the_template_is_created_once_with_every_family_and_kept_across_restarts(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        assert await ensure_templates(plane.services.agents, plane.services.registry) == [CLAUDE_ASSISTANT]
        template = await plane.services.agents.get_agent(TEMPLATE_PROJECT, CLAUDE_ASSISTANT)
        assert template["metadata"]["labels"] == {TEMPLATE_LABEL: "true"}
        spec = template["spec"]
        assert spec["model"] == {"access": "Nodus", "families": ["haiku", "sonnet", "opus", "fable"]}
        assert "careful" in spec["system"] and "shell" in spec["system"]
        assert template["status"]["revision"] == 1
        # The operator edits it; a restart (a new plane over the same storage) keeps the edit.
        edited = await plane.services.agents.patch_agent(
            TEMPLATE_PROJECT, CLAUDE_ASSISTANT, {"spec": {"maxTokens": 2048}}
        )
        assert edited["resource"]["status"]["revision"] == 2
        again = await make_plane(tmp_path)
        assert await ensure_templates(again.services.agents, again.services.registry) == []
        kept = await again.services.agents.get_agent(TEMPLATE_PROJECT, CLAUDE_ASSISTANT)
        assert (kept["status"]["revision"], kept["spec"]["maxTokens"]) == (2, 2048)

    asyncio.run(scenario())


def test_a_run_naming_the_template_lives_in_the_callers_project_pinned_to_its_revision(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await _seeded(tmp_path)
        agents, runs = plane.services.agents, plane.services.runs
        await agents.patch_agent(TEMPLATE_PROJECT, CLAUDE_ASSISTANT, {"spec": {"maxTokens": 2048}})
        created = await runs.create_run("team", run_doc("triage", agent=CLAUDE_ASSISTANT))
        run = created["resource"]
        assert run["metadata"]["project"] == "team" and run["spec"]["agent"] == CLAUDE_ASSISTANT
        assert run["status"]["agentRevision"] == 2 and run["status"]["agentProject"] == TEMPLATE_PROJECT
        assert run["status"]["cost"]["limitUSD"] == "1.00"  # the template's per-run cap, in team
        pinned = plane.storage.read_json("projects/team/agentruns/triage/agent.json")
        assert pinned["spec"]["maxTokens"] == 2048 and pinned["status"]["revision"] == 2
        assert [r["metadata"]["name"] for r in await runs.list_runs("team")] == ["triage"]
        assert await runs.list_runs(TEMPLATE_PROJECT) == []  # nothing of the run is in project nodus
        # A later revision of the template does not change the run that started on the earlier one.
        await agents.patch_agent(TEMPLATE_PROJECT, CLAUDE_ASSISTANT, {"spec": {"maxTokens": 1024}})
        stored = plane.storage.read_json("projects/team/agentruns/triage/agent.json")
        assert stored["status"]["revision"] == 2
        # A group of another project over the template names it the same way.
        group = await plane.services.groups.apply_group("team", group_doc("batch", agent=CLAUDE_ASSISTANT))
        assert group["resource"]["status"]["agentProject"] == TEMPLATE_PROJECT
        assert group["resource"]["status"]["agentRevision"] == 3

    asyncio.run(scenario())


def test_the_projects_own_agent_of_that_name_comes_first_and_other_names_are_not_found(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plane = await _seeded(tmp_path)
        await plane.services.agents.apply_agent("team", agent_doc(CLAUDE_ASSISTANT, system="ours"))
        run = (await plane.services.runs.create_run("team", run_doc("own", agent=CLAUDE_ASSISTANT)))[
            "resource"
        ]
        assert "agentProject" not in run["status"]
        assert plane.storage.read_json("projects/team/agentruns/own/agent.json")["spec"]["system"] == "ours"
        await plane.services.agents.apply_agent(TEMPLATE_PROJECT, agent_doc("helper"))
        with pytest.raises(NotFound) as caught:  # only a template is reachable from elsewhere
            await plane.services.runs.create_run("team", run_doc("other", agent="helper"))
        assert caught.value.details["field"] == "spec.agent"

    asyncio.run(scenario())


# -- who may read and change it: the ingress ------------------------------------------------------


def _check(principal: Principal, method: str, path: str) -> NodusError | None:
    try:
        authorize(principal, required_access(method, path))
    except NodusError as refusal:
        return refusal
    return None


TEMPLATE_PATH = f"/v1/projects/{TEMPLATE_PROJECT}/agents/{CLAUDE_ASSISTANT}"


@pytest.mark.parametrize("role", ["read", "write", "admin"])
def test_every_token_reads_the_template_and_no_other_project_changes_it(role: str) -> None:
    caller = Principal("ci", "team", role)
    assert is_template(TEMPLATE_PROJECT, CLAUDE_ASSISTANT) and not is_template("team", CLAUDE_ASSISTANT)
    assert _check(caller, "GET", TEMPLATE_PATH) is None
    for method in ("PUT", "PATCH", "DELETE", "POST"):
        refusal = _check(caller, method, TEMPLATE_PATH)
        assert isinstance(refusal, Forbidden), (method, refusal)
        assert refusal.details["name"] == CLAUDE_ASSISTANT and "template" in refusal.message
    # The rest of project nodus stays a plain 404 to other projects.
    for method, path in (
        ("GET", f"/v1/projects/{TEMPLATE_PROJECT}/agents"),
        ("GET", f"/v1/projects/{TEMPLATE_PROJECT}/agents/helper"),
        ("GET", f"/v1/projects/{TEMPLATE_PROJECT}/agentruns"),
        ("POST", f"/v1/projects/{TEMPLATE_PROJECT}/agentruns"),
    ):
        assert isinstance(_check(caller, method, path), NotFound), (method, path)


def test_the_operator_and_project_nodus_keep_their_usual_rights() -> None:
    assert _check(Principal("root", OPERATOR, "admin"), "PATCH", TEMPLATE_PATH) is None
    assert _check(Principal("owner", TEMPLATE_PROJECT, "write"), "PATCH", TEMPLATE_PATH) is None
    refusal: Any = _check(Principal("viewer", TEMPLATE_PROJECT, "read"), "DELETE", TEMPLATE_PATH)
    assert isinstance(refusal, Forbidden) and refusal.details["needs"] == "write"


# -- the SDK's handle: from_name(..., project="nodus") submits to the caller's project ------------


class _TemplateAPI:
    """Project nodus's template, a whoami and run creation, over an httpx MockTransport."""

    def __init__(self, token_project: str) -> None:
        self.token_project = token_project
        self.requests: list[tuple[str, str]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        path = request.url.path
        if path == "/v1/whoami":
            return httpx.Response(200, json={"name": "ci", "project": self.token_project, "role": "write"})
        if path == TEMPLATE_PATH:
            labels = {TEMPLATE_LABEL: "true"}
            return httpx.Response(
                200, json={"metadata": {"name": CLAUDE_ASSISTANT, "labels": labels}, "spec": {"system": "x"}}
            )
        if request.method == "POST" and path.endswith("/agentruns"):
            body = json.loads(request.content)
            project = path.split("/")[3]
            meta = {**body["metadata"], "project": project}
            return httpx.Response(201, json={**body, "metadata": meta, "status": {"phase": "Pending"}})
        return httpx.Response(404, json={"code": "NotFound", "message": path, "details": {}})

    def client(self, project: str) -> Client:
        settings = Settings(api_url="http://nodus.test", project=project)
        return Client(settings=settings, transport=httpx.MockTransport(self.handle))


@pytest.mark.parametrize(
    ("token_project", "default_project", "runs_in"),
    [("team", "default", "team"), (OPERATOR, "lab", "lab")],  # a project token's own; else the default
)
def test_the_sdk_handle_of_the_template_submits_to_the_callers_project(
    token_project: str, default_project: str, runs_in: str
) -> None:
    api = _TemplateAPI(token_project)
    agent = ClaudeAgent.from_name(
        CLAUDE_ASSISTANT, project=TEMPLATE_PROJECT, client=api.client(default_project)
    )
    assert agent.project == runs_in
    run = agent.submit("Summarize the logs")
    assert run.name.startswith(CLAUDE_ASSISTANT)
    posted = [path for method, path in api.requests if method == "POST"]
    assert posted == [f"/v1/projects/{runs_in}/agentruns"]  # the template is read, never redeployed
    assert ("GET", TEMPLATE_PATH) in api.requests


def test_an_ordinary_agent_of_another_project_still_runs_where_it_is() -> None:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.method == "GET":
            return httpx.Response(200, json={"metadata": {"name": "helper"}, "spec": {}})
        body = json.loads(request.content)
        return httpx.Response(201, json={**body, "status": {"phase": "Pending"}})

    client = Client(settings=Settings(api_url="http://nodus.test"), transport=httpx.MockTransport(handle))
    agent = ClaudeAgent.from_name("helper", project="lab", client=client)
    agent.submit("hi")
    assert seen == ["GET /v1/projects/lab/agents/helper", "POST /v1/projects/lab/agentruns"]  # no whoami
