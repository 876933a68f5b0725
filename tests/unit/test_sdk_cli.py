"""Unit tests of the SDK and the CLI, without a server.

The HTTP transport is replaced by `FakeAPI` (an httpx MockTransport over an in-memory store that
follows docs/api.md closely enough for the client paths), so the tests can assert both what was
sent and, for refusals, that nothing was.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import types
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import nodus
from nodus import errors
from nodus.cli import jsonpath
from nodus.cli import main as cli
from nodus.cli import root as cli_root
from nodus.cli.manifests import load_manifests
from nodus.cli.output import format_age
from nodus.client import Client
from nodus.config import Settings, load_settings
from nodus.durations import parse_timeout

PYTHON = sys.executable


# -- a fake API ------------------------------------------------------------------------------


class FakeAPI:
    """Just enough of the REST API: agents (revisions), runs (a scripted phase), answers, steps."""

    def __init__(self, *, run_phase: str = "Succeeded", reason: str | None = None) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.store: dict[tuple[str, str], dict[str, Any]] = {}
        self.sent_specs: dict[tuple[str, str], Any] = {}  # what apply compares to find a new revision
        self.run_phase = run_phase
        self.reason = reason

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def client(self, project: str | None = None, **kwargs: Any) -> Client:
        settings = Settings(api_url="http://nodus.test")
        return Client(settings=settings, project=project, transport=self.transport, **kwargs)

    def writes(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _ in self.requests if method != "GET"]

    @staticmethod
    def _error(status: int, code: str, message: str, **details: Any) -> httpx.Response:
        return httpx.Response(status, json={"code": code, "message": message, "details": details})

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        parts = request.url.path.strip("/").split("/")
        if parts == ["v1", "info"]:
            return httpx.Response(
                200,
                json={"version": "0.1.0", "storage": "mem", "modelBackend": "offline", "sandbox": "process"},
            )
        assert parts[:2] == ["v1", "projects"], parts
        collection = parts[3]
        name = parts[4] if len(parts) > 4 else None
        sub = parts[5] if len(parts) > 5 else None
        key = (collection, name or "")
        kind = "Agent" if collection == "agents" else "AgentRun"
        if name is None and request.method == "GET":
            items = [r for (c, _), r in self.store.items() if c == collection]
            agent = request.url.params.get("agent")
            if agent:
                items = [r for r in items if r["spec"].get("agent") == agent]
            listed = {"apiVersion": "nodus.dev/v1", "kind": f"{kind}List", "items": items}
            return httpx.Response(200, json=listed)
        if name is None and request.method == "POST":
            name = body["metadata"]["name"]
            if (collection, name) in self.store:
                message = f"{kind.lower()} {name} exists"
                return self._error(409, "AlreadyExists", message, kind=kind, name=name)
            return httpx.Response(201, json=self._store(collection, body))
        existing = self.store.get(key)
        if request.method == "PUT":
            if existing is None:
                return httpx.Response(201, json=self._store(collection, body))
            if body.get("spec") != self.sent_specs[key]:
                if collection == "agentruns":
                    return self._error(409, "Conflict", "a run's spec cannot change")
                self.sent_specs[key] = body.get("spec")
                existing["spec"] = json.loads(json.dumps(body.get("spec")))
                existing["status"]["revision"] += 1
            return httpx.Response(200, json=existing)
        if existing is None:
            return self._error(404, "NotFound", f"{kind.lower()} {name} not found", kind=kind, name=name)
        if request.method == "DELETE":
            del self.store[key]
            return httpx.Response(200, json=existing)
        if sub == "answer":
            if existing["status"]["phase"] != "Succeeded":
                return self._error(409, "AnswerNotReady", f"agentrun {name} has no answer yet")
            answer = {"name": name, "phase": "Succeeded", "answer": "Python 3.11.7\n", "bytes": 14}
            return httpx.Response(200, json=answer)
        if sub == "steps":
            return httpx.Response(
                200,
                json={
                    "items": [
                        {
                            "id": "sandbox",
                            "kind": "sandbox",
                            "state": "Completed",
                            "attempts": 1,
                            "summary": "created",
                        },
                        {
                            "id": "turn-1/command-1",
                            "kind": "command",
                            "state": "Completed",
                            "attempts": 1,
                            "summary": "python3 --version -> exit 0",
                            "costUSD": "0",
                        },
                    ]
                },
            )
        if sub == "cancel":
            existing["status"]["phase"] = "Cancelled"
            return httpx.Response(200, json=existing)
        return httpx.Response(200, json=existing)

    def _store(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        resource = json.loads(json.dumps(body))
        name = resource["metadata"]["name"]
        created = datetime.now(UTC) - timedelta(minutes=5)
        resource["metadata"]["creationTimestamp"] = created.isoformat()
        if collection == "agents":
            resource["status"] = {"revision": 1}
        else:
            resource["status"] = {
                "phase": self.run_phase,
                "reason": self.reason,
                "message": "it broke" if self.reason else None,
                "turns": [{"index": 1, "model": "claude-haiku-4-5"}],
                "cost": {"totalUSD": "0.0012"},
            }
        self.store[(collection, name)] = resource
        self.sent_specs[(collection, name)] = body.get("spec")
        return resource


@pytest.fixture()
def api() -> FakeAPI:
    return FakeAPI()


@pytest.fixture()
def cli_api(api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> FakeAPI:
    """Point every CLI command at the fake API."""
    monkeypatch.setattr(cli_root, "client", lambda project=None: api.client(project))
    return api


def invoke(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(cli.app, list(args), input=input)


def one_error_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


# -- Unsupported before anything is sent -----------------------------------------------------


@pytest.mark.parametrize(
    "argument, value",
    [
        # Apps are not built; source, entrypoint, setup, secrets, env, network, models,
        # max_cost, cpu, memory and the worker settings are (tests/unit/test_python_agent_sdk.py).
        ("app", "x"),
    ],
)
def test_agent_unsupported_arguments_raise_at_construction(api: FakeAPI, argument: str, value: Any) -> None:
    with pytest.raises(errors.Unsupported) as caught:
        nodus.Agent("worker", client=api.client(), **{argument: value})
    assert argument in str(caught.value)
    assert caught.value.details["field"] == argument
    assert api.requests == []


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"group": "g"}, "group"),
        # session_key is served (decision 48); a bad one is refused locally: tests/unit/test_sessions.py
        ({"hold_worker": "always"}, "hold_worker"),
    ],
)
def test_submit_unsupported_arguments_send_nothing(api: FakeAPI, kwargs: dict[str, Any], field: str) -> None:
    agent = nodus.ClaudeAgent("helper", system="x", client=api.client())
    with pytest.raises(errors.Unsupported) as caught:
        agent.submit("hi", **kwargs)
    assert caught.value.details["field"] == field
    assert api.requests == []


def test_later_features_raise_unsupported(api: FakeAPI) -> None:
    agent = nodus.ClaudeAgent("helper", client=api.client())
    # A ClaudeAgent is a system prompt, not a program (nodus.Agent takes these).
    for call in (lambda: agent.step(lambda: 1), lambda: agent.entrypoint(print), lambda: agent.local("x")):
        with pytest.raises(errors.Unsupported):
            call()
    with pytest.raises(errors.Unsupported) as caught:
        nodus.AgentGroup.create("g", agent, max_held=3)
    assert caught.value.details["field"] == "max_held"
    assert api.requests == []


def test_invalid_definitions_are_refused_locally(api: FakeAPI) -> None:
    with pytest.raises(errors.Invalid, match="families"):
        nodus.ClaudeAgent("helper", families=["gpt"], client=api.client())
    with pytest.raises(errors.Invalid, match="metadata.name"):
        nodus.ClaudeAgent("Not A Label", client=api.client())
    agent = nodus.ClaudeAgent("helper", client=api.client())
    with pytest.raises(errors.PayloadTooLarge):
        agent.submit("x" * (256 * 1024 + 1))
    with pytest.raises(errors.Invalid, match="deadline"):
        agent.submit("x", deadline="soon")
    with pytest.raises(errors.Invalid, match="keep-alive"):
        agent.remote("x", keep_alive=True)
    assert api.requests == []


# -- SDK over the fake API -------------------------------------------------------------------


def test_claude_agent_spec_and_cost_formatting() -> None:
    agent = nodus.ClaudeAgent(
        "helper",
        system="Be careful.",
        families=["haiku", "sonnet"],
        model="claude-x",
        max_tokens=512,
        per_run_max_cost=Decimal("0.50"),
        api_key_secret="anthropic-key",
    )
    spec = agent._manifest["spec"]
    assert spec["model"] == {
        "access": "BYOK",
        "families": ["haiku", "sonnet"],
        "name": "claude-x",
        "apiKeySecret": "anthropic-key",
    }
    assert spec["perRunMaxCostUSD"] == "0.50" and spec["maxTokens"] == 512
    for value, text in ((0.1, "0.1"), (2, "2"), ("0.25", "0.25")):
        assert nodus.ClaudeAgent("a", per_run_max_cost=value)._manifest["spec"]["perRunMaxCostUSD"] == text
    assert nodus.Agent("plain", image="docker://python:3.11")._manifest["spec"] == {
        "image": "docker://python:3.11"
    }


def test_remote_deploys_lazily_then_submits_waits_and_answers(api: FakeAPI) -> None:
    agent = nodus.ClaudeAgent("helper", system="x", families=["haiku"], client=api.client())
    assert agent.remote({"q": "version?"}) == "Python 3.11.7\n"
    methods = [(m, p.rsplit("/", 2)[-2:]) for m, p, _ in api.requests]
    assert methods[0] == ("PUT", ["agents", "helper"])
    assert methods[1][0] == "POST"
    sent = api.requests[1][2]
    assert sent["spec"]["input"] == '{"q": "version?"}'
    assert re.fullmatch(r"helper-[0-9a-f]{8}", sent["metadata"]["name"])
    # Deployed once: a second submit does not PUT again.
    agent.submit("again", deadline=timedelta(hours=2))
    assert [m for m, _, _ in api.requests].count("PUT") == 1
    assert api.requests[-1][2]["spec"] == {"agent": "helper", "input": "again", "deadline": "2h"}
    agent.submit("open", keep_alive=True)
    assert api.requests[-1][2]["spec"] == {"agent": "helper", "input": "open", "keepAlive": True}


def test_idempotency_key_redelivery_returns_the_same_run(api: FakeAPI) -> None:
    agent = nodus.ClaudeAgent("helper", client=api.client())
    first = agent.submit("hello", idempotency_key="event-42")
    second = agent.submit("hello", idempotency_key="event-42")
    assert first.name == second.name and first.name.startswith("helper-")
    assert len(first.name) == len("helper-") + 12
    with pytest.raises(errors.Conflict) as caught:
        agent.submit("different input", idempotency_key="event-42")
    assert caught.value.code == "AlreadyExists"


def test_long_agent_names_still_make_dns_label_run_names() -> None:
    from nodus.agent import _run_name

    name = _run_name("a" * 63, "0123abcd")
    assert len(name) == 63 and name.endswith("-0123abcd")


def test_wait_raises_agent_run_failed_with_details() -> None:
    api = FakeAPI(run_phase="Failed", reason="MaxCostReached")
    run = nodus.ClaudeAgent("helper", client=api.client()).submit("x")
    with pytest.raises(errors.AgentRunFailed) as caught:
        run.wait(timeout=5)
    assert caught.value.details == {
        "name": run.name,
        "phase": "Failed",
        "reason": "MaxCostReached",
        "message": "it broke",
    }
    with pytest.raises(errors.AgentRunFailed):
        run.result()


def test_wait_times_out() -> None:
    api = FakeAPI(run_phase="Running")
    run = nodus.ClaudeAgent("helper", client=api.client()).submit("x")
    with pytest.raises(errors.WaitTimeout, match="still Running"):
        run.wait(timeout=0.3)


def test_run_handle_reads_status_steps_answer_and_cancels(api: FakeAPI) -> None:
    run = nodus.ClaudeAgent("helper", client=api.client()).submit("x", name="my-run")
    assert run.wait().phase == "Succeeded"
    assert run.status().status.cost.total_usd == "0.0012"
    assert [step.kind for step in run.steps()] == ["sandbox", "command"]
    assert run.answer() == "Python 3.11.7\n"
    same = nodus.AgentRun.from_name("my-run", client=api.client())
    assert same.agent == "helper" and "my-run" in repr(same)
    run.cancel()
    run.delete()
    with pytest.raises(errors.NotFound):
        nodus.AgentRun.from_name("my-run", client=api.client())


def test_from_name_does_not_redeploy(api: FakeAPI) -> None:
    nodus.ClaudeAgent("helper", client=api.client()).deploy()
    agent = nodus.ClaudeAgent.from_name("helper", client=api.client())
    assert isinstance(agent, nodus.ClaudeAgent)
    agent.submit("x")
    assert [m for m, _, _ in api.requests].count("PUT") == 1
    with pytest.raises(errors.NotFound):
        nodus.Agent.from_name("missing", client=api.client())


# -- View ------------------------------------------------------------------------------------


def test_view_access() -> None:
    view = nodus.View(
        {
            "status": {
                "phase": "Running",
                "counts": {"succeeded": 2},
                "totalUSD": "0.1",
                "turns": [{"model": "m"}],
            },
            "taskId": "t1",
            "verdict": None,
        }
    )
    assert view.status.phase == "Running"
    assert view.status.counts.succeeded == 2
    assert view.status.total_usd == "0.1"  # snake_case reads camelCase
    assert view.task_id == "t1"
    assert view.status.turns[0].model == "m"
    assert view.get("verdict") is None and view.get("missing", 3) == 3
    assert view["status"]["phase"] == "Running"
    assert "status" in view and len(view) == 3
    assert view.to_dict()["status"]["counts"] == {"succeeded": 2}
    with pytest.raises(AttributeError, match="no field 'nope'"):
        _ = view.nope
    with pytest.raises(AttributeError):
        view.status = 1  # type: ignore[misc]
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(view)) == view == copy.deepcopy(view)


# -- jsonpath, durations, settings -----------------------------------------------------------


def test_jsonpath_subset() -> None:
    data = {
        "status": {
            "phase": "Succeeded",
            "turns": [{"model": "a"}, {"model": "b"}],
            "ok": True,
            "x-y": {"n": 3},
        }
    }
    assert jsonpath.parse("{.status.turns[0].model}") == ("status", "turns", 0, "model")
    assert jsonpath.lookup(data, "{.status.phase}") == "Succeeded"
    assert jsonpath.lookup(data, ".status.turns[-1].model") == "b"
    assert jsonpath.lookup(data, "status['x-y'].n") == 3
    assert jsonpath.lookup(data, "{.status.turns[5].model}") is jsonpath.MISSING
    assert jsonpath.lookup(data, "{.status.nothing}") is jsonpath.MISSING
    assert jsonpath.format_value(True) == "true"
    assert jsonpath.format_value({"a": 1}) == '{"a":1}'
    assert jsonpath.lookup(data, "{}") == data
    for bad in ("{.items[*].name}", "{.a[?(@.x)]}", "{..a}"):
        with pytest.raises(jsonpath.JsonPathError):
            jsonpath.parse(bad)


@pytest.mark.parametrize(
    "text, seconds",
    [("30s", 30), ("2m", 120), ("1h30m", 5400), ("90", 90), ("1.5s", 1.5), ("500ms", 0.5), ("0s", 0)],
)
def test_parse_timeout(text: str, seconds: float) -> None:
    assert parse_timeout(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5d", "-1s", "1m x"])
def test_parse_timeout_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timeout(text)


def test_format_age() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    assert format_age("2026-01-01T23:59:15Z", now) == "45s"
    assert format_age("2026-01-01T23:50:00Z", now) == "10m"
    assert format_age("2025-12-28T00:00:00+00:00", now) == "5d"
    assert format_age(None) == "<unknown>"


def test_settings_from_environment() -> None:
    env = {"NODUS_API_URL": "http://x:1/", "NODUS_PROJECT": "p", "NODUS_TOKEN": "secret"}
    settings = load_settings(environ=env)
    assert settings == Settings(api_url="http://x:1", project="p", token="secret")
    assert "secret" not in repr(settings)
    assert load_settings(environ={}) == Settings()
    assert load_settings(project="q", environ=env).project == "q"


# -- client ----------------------------------------------------------------------------------


def test_client_sends_token_and_rebuilds_errors() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            422,
            json={"code": "Invalid", "message": "bad family", "details": {"field": "spec.model.families[0]"}},
        )

    client = Client("http://nodus.test", token="s3cret", transport=httpx.MockTransport(handler))
    with pytest.raises(errors.Invalid) as caught:
        client.get("agents", "a")
    assert seen[0].headers["authorization"] == "Bearer s3cret"
    assert caught.value.details["field"] == "spec.model.families[0]"
    with pytest.raises(errors.Invalid):
        client.list("agentgroups")


def test_client_retries_get_connect_errors_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("nodus.client.time.sleep", lambda _: None)
    calls = {"GET": 0, "POST": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls[request.method] += 1
        if request.method == "POST" or calls["GET"] < 3:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json={"items": []})

    client = Client("http://user:pw@nodus.test", token="s3cret", transport=httpx.MockTransport(handler))
    assert client.list("agents") == []
    assert calls["GET"] == 3
    with pytest.raises(errors.Unavailable) as caught:
        client.create("agentruns", {"metadata": {"name": "r"}})
    assert calls["POST"] == 1
    message = str(caught.value)
    assert message.startswith("cannot reach the nodus API at http://nodus.test")
    assert "is `nodus up` running?" in message
    assert "s3cret" not in message and "pw" not in message


# -- CLI -------------------------------------------------------------------------------------

AGENT_YAML = """\
apiVersion: nodus.dev/v1
kind: Agent
metadata:
  name: hello-agent
spec:
  system: |
    You are careful.
  model:
    access: Nodus
  perRunMaxCostUSD: "0.50"
"""

RUN_YAML = """\
apiVersion: nodus.dev/v1
kind: AgentRun
metadata:
  name: hello-agent-run
spec:
  agent: hello-agent
  input: "Print the Python version."
"""


def test_cli_apply_created_unchanged_configured(cli_api: FakeAPI, tmp_path: Path) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(AGENT_YAML + "---\n" + RUN_YAML)
    result = invoke("apply", "-f", str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["agent/hello-agent created", "agentrun/hello-agent-run created"]
    assert invoke("apply", "-f", str(path)).stdout.splitlines() == [
        "agent/hello-agent unchanged",
        "agentrun/hello-agent-run unchanged",
    ]
    changed = AGENT_YAML.replace('"0.50"', '"0.75"')
    result = invoke("apply", "-f", "-", input=changed)
    assert result.stdout.strip() == "agent/hello-agent configured"


def test_cli_apply_validates_every_document_before_sending(cli_api: FakeAPI, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    bad_run = RUN_YAML.replace("agent: hello-agent", "agent: hello-agent\n  colour: red")
    path.write_text(AGENT_YAML + "---\n" + bad_run)
    result = invoke("apply", "-f", str(path))
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "bad.yaml (document 2, line 12)" in line and "spec.colour" in line and "unknown field" in line
    assert cli_api.requests == []


def test_cli_malformed_yaml_names_file_and_line(cli_api: FakeAPI, tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: x\n   bad: [\n")
    result = invoke("apply", "-f", str(path))
    assert result.exit_code == 1
    assert re.match(r"error: .*broken\.yaml line \d+: ", one_error_line(result))
    result = invoke("apply", "-f", str(tmp_path / "missing.yaml"))
    assert result.exit_code == 1 and "cannot read" in one_error_line(result)
    assert cli_api.requests == []


def test_load_manifests_expands_lists_and_skips_empty_documents(tmp_path: Path) -> None:
    listed = {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentList",
        "items": [{"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "a"}, "spec": {}}],
    }
    path = tmp_path / "list.yaml"
    path.write_text("---\n" + json.dumps(listed) + "\n---\n" + RUN_YAML)
    manifests = load_manifests([str(path)])
    assert [m.ref for m in manifests] == ["agent/a", "agentrun/hello-agent-run"]
    assert manifests[1].collection == "agentruns"


def test_cli_get_tables_and_outputs(cli_api: FakeAPI) -> None:
    invoke("apply", "-f", "-", input=AGENT_YAML + "---\n" + RUN_YAML)
    table = invoke("get", "agents").stdout.splitlines()
    assert table[0].split() == ["NAME", "REVISION", "FAMILIES", "MAX-COST", "STATE", "AGE"]
    assert table[1].split() == ["hello-agent", "1", "all", "$0.50", "Running", "5m"]
    runs = invoke("get", "ar").stdout.splitlines()
    assert runs[0].split() == ["NAME", "AGENT", "PHASE", "REASON", "MODEL", "COST", "AGE"]
    assert runs[1].split() == [
        "hello-agent-run",
        "hello-agent",
        "Succeeded",
        "claude-haiku-4-5",
        "$0.0012",
        "5m",
    ]
    assert invoke("get", "agentrun/hello-agent-run", "-o", "name").stdout == "agentrun/hello-agent-run\n"
    phase = invoke("get", "agentrun", "hello-agent-run", "-o", "jsonpath={.status.phase}")
    assert phase.stdout == "Succeeded\n"
    document = invoke("get", "ar/hello-agent-run", "-o", "yaml").stdout
    assert "kind: AgentRun" in document and "phase: Succeeded" in document
    listed = json.loads(invoke("get", "agents", "-o", "json").stdout)
    assert listed["kind"] == "AgentList" and listed["items"][0]["metadata"]["name"] == "hello-agent"
    assert invoke("get", "ar", "--field-selector", "spec.agent=other").stderr.startswith("No agentruns found")
    assert len(invoke("get", "ar", "--field-selector", "spec.agent=hello-agent").stdout.splitlines()) == 2


def test_cli_unknown_kind_is_a_usage_error(cli_api: FakeAPI) -> None:
    result = invoke("get", "widgets")
    assert result.exit_code == 2 and "unknown kind 'widgets'" in one_error_line(result)
    result = invoke("get")
    assert result.exit_code == 2
    one_error_line(result)


def test_cli_create_steps_answer_cancel_delete(cli_api: FakeAPI) -> None:
    result = invoke(
        "create", "agent", "helper", "--system", "Be brief.", "--family", "haiku", "--max-cost", "0.50"
    )
    assert result.stdout == "agent/helper created\n"
    assert cli_api.requests[-1][2]["spec"] == {
        "system": "Be brief.",
        "model": {"access": "Nodus", "families": ["haiku"]},
        "perRunMaxCostUSD": "0.50",
    }
    result = invoke(
        "create",
        "agentrun",
        "triage",
        "--agent",
        "helper",
        "--prompt",
        "Summarize",
        "--deadline",
        "2h",
        "--keep-alive",
    )
    assert result.stdout == "agentrun/triage created\n"
    assert cli_api.requests[-1][2]["spec"] == {
        "agent": "helper",
        "input": "Summarize",
        "deadline": "2h",
        "keepAlive": True,
    }
    assert invoke("agentrun", "answer", "triage").stdout == "Python 3.11.7\n"
    steps = invoke("agentrun", "steps", "triage").stdout.splitlines()
    assert steps[0].split() == ["ID", "KIND", "STATE", "ATTEMPTS", "SUMMARY"]
    assert "python3 --version -> exit 0" in steps[2]
    as_json = json.loads(invoke("agentrun", "steps", "triage", "-o", "json").stdout)
    assert as_json["items"][0]["id"] == "sandbox"
    assert invoke("cancel", "agentrun/triage").stdout == "agentrun/triage cancelled\n"
    assert invoke("delete", "agentrun", "triage").stdout == "agentrun/triage deleted\n"
    result = invoke("delete", "agentrun/triage")
    assert result.exit_code == 1 and "not found" in one_error_line(result)
    assert invoke("delete", "agentrun/triage", "--ignore-not-found").exit_code == 0
    result = invoke("create", "agent", "helper")
    assert result.exit_code == 1 and "exists" in one_error_line(result)


def test_cli_create_agent_with_variables_secrets_and_allowed_hosts(cli_api: FakeAPI) -> None:
    result = invoke(
        "create",
        "agent",
        "fetcher",
        "--env",
        "MODE=fast",
        "--env",
        "DB_PASSWORD=secret:db/PASSWORD",
        "--allow-host",
        "pypi.org",
        "--allow-host",
        "*.example.com:443",
    )
    assert result.stdout == "agent/fetcher created\n", result.output
    spec = cli_api.requests[-1][2]["spec"]
    assert spec["env"] == [
        {"name": "MODE", "value": "fast"},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "PASSWORD"}}},
    ]
    assert spec["network"] == {"allowedHosts": ["pypi.org", "*.example.com:443"]}
    for flags, words in [
        (["--env", "NOEQUALS"], "NAME=VALUE"),
        (["--env", "X=secret:db"], "SECRET/KEY"),
        (["--env", "PATH=/x"], "set by the sandbox"),
        (["--allow-host", "http://x.org/"], "not a URL"),
    ]:
        refused = invoke("create", "agent", "bad", *flags)
        assert refused.exit_code != 0 and words in one_error_line(refused), refused.output


def test_agent_params_are_declared_once_for_the_sdk_the_cli_and_the_schema() -> None:
    """`AGENT_PARAMS` is the table: ClaudeAgent's keywords, claude_agent_spec's, the CLI's options
    and the Agent spec's fields all follow it, so a setting added in one place fails here."""
    import inspect

    import typer.main

    from nodus.agent_spec import AGENT_PARAMS, claude_agent_spec
    from nodus.resources import AgentSpec

    names = [param.name for param in AGENT_PARAMS]
    keywords = set(inspect.signature(nodus.ClaudeAgent.__init__).parameters) - {
        "self",
        "name",
        "project",
        "client",
    }
    assert keywords == set(names)
    assert set(inspect.signature(claude_agent_spec).parameters) == set(names)
    command = typer.main.get_command(cli.app).commands["create"].commands["agent"]  # type: ignore[attr-defined]
    options = {flag: param.help for param in command.params for flag in getattr(param, "opts", [])}
    for param in AGENT_PARAMS:
        if param.flag is not None:
            assert options.get(param.flag) == param.help, param.name
        model: Any = AgentSpec
        for part in param.field.split("."):
            assert part in model.model_fields, f"{param.name}: spec.{param.field} is not in the schema"
            annotation = model.model_fields[part].annotation
            model = next(
                (a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "model_fields")),
                None,
            )
    # Every setting given lands where the table says, in the order the spec was always written.
    spec = claude_agent_spec(
        system="s",
        families=["haiku"],
        model="claude-x",
        max_tokens=5,
        max_tool_calls=3,
        per_run_max_cost=0.5,
        api_key_secret="key",
        image="img",
        env={"A": "1", "B": nodus.SecretKey("db", "K")},
        allowed_hosts=("pypi.org",),
    )
    assert list(spec) == [
        "system",
        "model",
        "maxTokens",
        "maxToolCalls",
        "perRunMaxCostUSD",
        "image",
        "env",
        "network",
    ]
    assert spec["model"] == {
        "access": "BYOK",
        "families": ["haiku"],
        "name": "claude-x",
        "apiKeySecret": "key",
    }
    assert claude_agent_spec() == {"system": "", "model": {"access": "Nodus"}}
    assert claude_agent_spec(families=[], env={}, allowed_hosts=[]) == {
        "system": "",
        "model": {"access": "Nodus"},
        "network": {"allowedHosts": []},
    }


def test_cli_apply_refuses_a_token_file_and_sends_nothing(cli_api: FakeAPI, tmp_path: Path) -> None:
    manifest = tmp_path / "token.yaml"
    manifest.write_text("apiVersion: nodus.dev/v1\nkind: Token\nmetadata: {name: ci}\nspec: {role: read}\n")
    sent = len(cli_api.requests)
    result = invoke("apply", "-f", str(manifest))
    assert result.exit_code != 0 and "nodus create token" in one_error_line(result)
    assert len(cli_api.requests) == sent


def test_claude_agent_takes_env_with_secret_keys_and_allowed_hosts(api: FakeAPI) -> None:
    agent = nodus.ClaudeAgent(
        "fetcher",
        env={"MODE": "fast", "TOKEN": nodus.SecretKey("gh", "TOKEN")},
        allowed_hosts=["api.github.com"],
        client=api.client(),
    )
    spec = agent._manifest["spec"]
    assert spec["env"][1] == {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "gh", "key": "TOKEN"}}}
    assert spec["network"] == {"allowedHosts": ["api.github.com"]}
    with pytest.raises(nodus.errors.Invalid, match="allowedHosts"):
        nodus.ClaudeAgent("bad", allowed_hosts=["localhost/path"], client=api.client())


def test_cli_refusal_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            422, json={"code": "Unsupported", "message": "not served yet", "details": {"field": "spec.image"}}
        )

    client = Client("http://t", transport=httpx.MockTransport(handler))
    monkeypatch.setattr(cli_root, "client", lambda project=None: client)
    result = invoke("get", "agent/x")
    assert result.exit_code == 1
    assert one_error_line(result) == "error: Unsupported: not served yet (field: spec.image)"


def test_cli_wait(cli_api: FakeAPI) -> None:
    invoke("apply", "-f", "-", input=AGENT_YAML + "---\n" + RUN_YAML)
    run = "agentrun/hello-agent-run"
    result = invoke("wait", run, "--for=jsonpath={.status.phase}=Succeeded", "--timeout=5s")
    assert result.exit_code == 0 and result.stdout == "agentrun/hello-agent-run condition met\n"
    result = invoke("wait", run, "--for=jsonpath={.status.phase}=Failed", "--timeout=5s")
    assert result.exit_code == 1 and "ended Succeeded" in one_error_line(result)
    result = invoke("wait", "agent/hello-agent", "--for=jsonpath={.status.revision}=2", "--timeout=0.3s")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "timed out after 0.3s waiting for agent/hello-agent: {.status.revision} is 1" in line
    invoke("delete", "agentrun/hello-agent-run")
    result = invoke("wait", "agentrun/hello-agent-run", "--for=delete")
    assert result.exit_code == 0 and "condition met" in result.stdout
    result = invoke("wait", "ar/x", "--for=condition=Ready")
    assert result.exit_code == 2
    one_error_line(result)


def test_cli_up_and_down_use_the_cluster_module(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("nodus_ray.cluster")
    seen: dict[str, Any] = {}

    def up(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return types.SimpleNamespace(
            api_url="http://127.0.0.1:8000",
            storage="/tmp/s",
            model_backend="offline",
            sandbox="bubblewrap",
            ray_address="10.0.0.1:6379",
            dashboard_url=None,
        )

    fake.up = up  # type: ignore[attr-defined]
    fake.down = lambda: "stopped the API"  # type: ignore[attr-defined]
    # A stand-in package, so the test neither needs nor imports the server parts (or Ray).
    package = types.ModuleType("nodus_ray")
    package.__path__ = []  # type: ignore[attr-defined]
    package.cluster = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nodus_ray", package)
    monkeypatch.setitem(sys.modules, "nodus_ray.cluster", fake)
    result = invoke("up", "--port", "9000")
    assert result.exit_code == 0, result.output
    assert seen == {"address": None, "port": 9000, "storage": None}
    assert result.stdout.splitlines()[0] == "API       http://127.0.0.1:8000"
    assert "Dashboard -" in result.stdout
    assert invoke("down").stdout == "stopped the API\n"

    monkeypatch.setitem(sys.modules, "nodus_ray.cluster", None)  # an import that fails
    del package.cluster  # type: ignore[attr-defined]
    result = invoke("up")
    assert result.exit_code == 1 and "server parts are not installed" in one_error_line(result)


# -- processes: no Ray, and an unreachable server -------------------------------------------


def test_import_nodus_does_not_import_ray() -> None:
    code = "import nodus, nodus.cli.main, sys; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([PYTHON, "-c", code], check=True, timeout=60)


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "NODUS_API_URL": f"http://127.0.0.1:{port}", "NODUS_TOKEN": "tok-123"}
    done = subprocess.run(
        [PYTHON, "-c", "from nodus.cli.main import run; run()", "get", "agents"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        f"error: Unavailable: cannot reach the nodus API at http://127.0.0.1:{port}: [Errno 111] Connection refused; "
        "is `nodus up` running?\n"
    )
    assert "tok-123" not in done.stderr
