"""The SDK's durable Python agents without a server: nodus.Agent's settings and refusals, deploy
(check, upload, apply; nothing sent when the source is refused), Agent.local, and a Python run's
handle (children, outputs, retry/suspend/resume, resolve, the program log).

The HTTP transport is an httpx MockTransport over `_FakeAPI`, so a test asserts what was sent.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

import nodus
from nodus import errors
from nodus.client import Client
from nodus.config import Settings
from nodus.schema_agent import source_digest, source_ref

PROJECT = "/v1/projects/default"


class _FakeAPI:
    """Sources, Agents and one Python run with outputs, children and a program log."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.agents: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, bytes] = {"report": "# Report\n\u2713\n".encode()}
        self.log = "hello\nworld\n"
        self.run_status: dict[str, Any] = {"phase": "Succeeded", "program": "Python"}

    def client(self) -> Client:
        settings = Settings(api_url="http://nodus.test", project="default")
        return Client(settings=settings, transport=httpx.MockTransport(self.handle))

    def writes(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _ in self.requests if method != "GET"]

    def _run(self, name: str, **status: Any) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "resourceVersion": 7},
            "spec": {"agent": "triage"},
            "status": {**self.run_status, **status},
        }

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.requests.append(
            (request.method, path + (f"?{request.url.query.decode()}" if request.url.query else ""), body)
        )
        rest = path.removeprefix(PROJECT + "/").split("/")
        if request.method == "POST" and rest == ["agentsources"]:
            return httpx.Response(201, json=source_ref(body["files"]))
        if request.method == "PUT" and rest[0] == "agents":
            self.agents[rest[1]] = {**body, "status": {"revision": 1}}
            return httpx.Response(201, json=self.agents[rest[1]], headers={"X-Nodus-Result": "created"})
        if rest == ["agentruns"]:
            parent = request.url.params.get("parent")
            items = [self._run(f"{parent}-{key}", parent=parent) for key in ("a", "b")] if parent else []
            return httpx.Response(200, json={"items": items})
        name, *sub = rest[1:]
        if sub == [] and request.method == "GET":
            return httpx.Response(200, json=self._run(name))
        if sub == ["outputs"]:
            return httpx.Response(
                200, json={"items": [{"name": k, "bytes": len(v)} for k, v in self.outputs.items()]}
            )
        if sub[:1] == ["outputs"]:
            if sub[1] not in self.outputs:
                return httpx.Response(
                    404, json={"code": "NotFound", "message": f"no output {sub[1]}", "details": {}}
                )
            return httpx.Response(200, content=self.outputs[sub[1]])
        if sub == ["logs"]:
            return httpx.Response(200, text=self.log)
        if sub[0] in ("retry", "suspend", "resume"):
            return httpx.Response(
                200, json=self._run(name, phase="Pending" if sub[0] != "suspend" else "Waiting")
            )
        if sub == ["resolve"]:
            return httpx.Response(200, json=self._run(name, phase="Running"))
        return httpx.Response(404, json={"code": "NotFound", "message": f"{path} not faked", "details": {}})


@pytest.fixture
def api() -> _FakeAPI:
    return _FakeAPI()


def _module(tmp_path: Path, name: str, text: str) -> ModuleType:
    """Import ``text`` as module ``name`` from a file, as a user's script would be."""
    file = tmp_path / f"{name}.py"
    file.write_text(textwrap.dedent(text), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- the definition -----------------------------------------------------------------------------


def test_the_issues_agent_is_defined_with_families_cap_and_egress(api: _FakeAPI) -> None:
    agent = nodus.Agent(
        "researcher",
        models=["haiku", "sonnet"],
        per_run_max_cost="0.50",
        network=nodus.Egress(allowed_hosts=["api.github.com"]),
        secrets=[nodus.SecretKey("github", "GITHUB_TOKEN")],
        env={"MODE": "triage"},
        setup="pip install -r requirements.txt",
        cpu=2,
        memory="2Gi",
        max_cost=5,
        client=api.client(),
    )
    spec = agent._manifest["spec"]
    assert spec == {
        "model": {"access": "Nodus", "families": ["haiku", "sonnet"]},
        "perRunMaxCostUSD": "0.50",
        "env": [
            {
                "name": "GITHUB_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "github", "key": "GITHUB_TOKEN"}},
            },
            {"name": "MODE", "value": "triage"},
        ],
        "network": {"allowedHosts": ["api.github.com"]},
        "setup": "pip install -r requirements.txt",
        "cpu": 2.0,
        "memory": "2Gi",
        "maxCostUSD": "5",
    }
    assert api.requests == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cpu": 0}, "spec.cpu"),
        ({"cpu": 65}, "spec.cpu"),
        ({"cpu": "2"}, "cpu"),
        ({"memory": "32Mi"}, "spec.memory"),
        ({"memory": "1G"}, "spec.memory"),
        ({"memory": 1024}, "memory"),
        ({"setup": "x" * (16 * 1024 + 1)}, "spec.setup"),
        ({"models": ["gpt"]}, "spec.model.families[0]"),
        ({"models": "haiku"}, "models"),
        ({"secrets": ["github"]}, "secrets"),
        ({"network": {"allowedHosts": []}}, "network"),
        ({"network": nodus.Egress(allowed_hosts=["localhost:99999"])}, "spec.network.allowedHosts[0]"),
        ({"max_cost": "lots"}, "spec.maxCostUSD"),
        ({"entrypoint": "main"}, "spec.entrypoint"),
        ({"entrypoint": 3}, "entrypoint"),
        ({"source": 3}, "source"),
        ({"env": {"PATH": "/x"}}, "spec.env[0].name"),
    ],
)
def test_bad_settings_are_refused_at_construction_naming_the_field(
    api: _FakeAPI, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.Invalid) as caught:
        nodus.Agent("researcher", client=api.client(), **kwargs)
    assert caught.value.details["field"] == field, caught.value
    assert api.requests == []


def test_egress_takes_a_list_of_hosts_not_a_string() -> None:
    with pytest.raises(errors.Invalid, match="list of hosts"):
        nodus.Egress(allowed_hosts="api.github.com")


# -- deploy ---------------------------------------------------------------------------------------

_PROGRAM = """
    import nodus

    agent = nodus.Agent("triage", models=["haiku"])
    calls = []

    @agent.step(effect="idempotent")
    def fetch_issue(number: int) -> dict:
        calls.append(number)
        return {"title": f"issue {number}"}

    @agent.entrypoint
    def main(ctx, input):
        issue = fetch_issue(input["issue"])
        approved = ctx.wait_for_message("approval", timeout="1h")
        return {"title": issue["title"], "approved": approved}
"""


def test_deploy_uploads_the_entrypoints_module_then_applies_the_agent(api: _FakeAPI, tmp_path: Path) -> None:
    module = _module(tmp_path, "triage_prog", _PROGRAM)
    agent: nodus.Agent = module.agent
    agent._client = api.client()
    text = (tmp_path / "triage_prog.py").read_text()
    applied = agent.deploy()
    assert api.writes() == [("POST", f"{PROJECT}/agentsources"), ("PUT", f"{PROJECT}/agents/triage")]
    assert api.requests[0][2] == {"files": {"triage_prog.py": text}}
    spec = api.requests[1][2]["spec"]
    assert spec["entrypoint"] == "triage_prog:main"
    assert spec["source"] == {
        "digest": source_digest({"triage_prog.py": text}),
        "files": 1,
        "bytes": len(text.encode()),
    }
    assert applied.spec.entrypoint == "triage_prog:main"
    assert agent.manifest()["spec"]["source"] == spec["source"]  # the same document, sending nothing
    assert len(api.requests) == 2


def test_local_runs_the_program_here_with_steps_and_messages(tmp_path: Path) -> None:
    module = _module(tmp_path, "triage_local", _PROGRAM)
    agent: nodus.Agent = module.agent
    assert agent.local({"issue": 42}, messages={"approval": [True]}) == {
        "title": "issue 42",
        "approved": True,
    }
    assert module.calls == [42]
    assert agent.local({"issue": 7}) == {"title": "issue 7", "approved": None}  # the wait times out at once
    assert module.fetch_issue(3) == {"title": "issue 3"}  # outside a run, a plain call


def test_a_source_that_does_not_compile_or_lacks_its_entrypoint_sends_nothing(
    api: _FakeAPI, tmp_path: Path
) -> None:
    source = tmp_path / "agent"
    source.mkdir()
    (source / "main.py").write_text("def main(ctx, input):\n    return input\n")
    (source / "helpers.py").write_text("def ok():\n    return (1\n")
    agent = nodus.Agent("researcher", source=source, entrypoint="main:main", client=api.client())
    with pytest.raises(errors.Invalid) as caught:
        agent.deploy()
    assert "helpers.py line 2" in caught.value.message and caught.value.details["field"] == "spec.source"
    (source / "helpers.py").write_text("def ok():\n    return 1\n")
    missing = nodus.Agent("researcher", source=source, entrypoint="main:run", client=api.client())
    with pytest.raises(errors.Invalid) as caught:
        missing.deploy()
    assert caught.value.details["field"] == "spec.entrypoint" and "run" in caught.value.message
    with pytest.raises(errors.Invalid) as caught:
        nodus.Agent("researcher", source=source, client=api.client()).deploy()
    assert caught.value.details["field"] == "entrypoint"
    with pytest.raises(errors.Invalid) as caught:
        nodus.Agent("researcher", entrypoint="main:main", client=api.client()).deploy()
    assert caught.value.details["field"] == "source"
    assert api.requests == []

    nodus.Agent("researcher", source=source, entrypoint="main:main", client=api.client()).deploy()
    assert api.requests[0][2]["files"] == {
        "helpers.py": "def ok():\n    return 1\n",
        "main.py": (source / "main.py").read_text(),
    }
    assert api.requests[1][2]["spec"]["entrypoint"] == "main:main"


def test_a_dict_source_is_the_program_and_an_agent_without_one_applies_as_before(api: _FakeAPI) -> None:
    files = {"main.py": "def main(ctx, input):\n    return 1\n"}
    nodus.Agent("researcher", source=files, entrypoint="main:main", client=api.client()).deploy()
    assert api.requests[1][2]["spec"]["source"] == source_ref(files)
    plain = nodus.Agent("plain", per_run_max_cost="0.25", client=api.client())
    plain.deploy()
    assert api.requests[-1][2]["spec"] == {"perRunMaxCostUSD": "0.25"}  # no source upload, same document
    assert [method for method, *_ in api.requests] == ["POST", "PUT", "PUT"]


def test_app_stays_refused_naming_it(api: _FakeAPI) -> None:
    with pytest.raises(errors.Unsupported) as caught:
        nodus.Agent("researcher", client=api.client(), app="x")
    assert caught.value.details["field"] == "app" and "app" in caught.value.message
    assert api.requests == []


def test_worker_settings_map_to_the_spec_and_unset_ones_are_left_out(api: _FakeAPI) -> None:
    from datetime import timedelta

    agent = nodus.Agent(
        "pooled", min_workers=1, max_workers=2, scaledown_window=timedelta(minutes=5), client=api.client()
    )
    agent.deploy()
    assert api.requests[-1][2]["spec"] == {"minWorkers": 1, "maxWorkers": 2, "scaledownWindow": "5m"}
    nodus.Agent("limited", max_workers=3, client=api.client()).deploy()
    assert api.requests[-1][2]["spec"] == {"maxWorkers": 3}
    for argument, value in (("max_workers", "2"), ("min_workers", True), ("scaledown_window", 5)):
        with pytest.raises(errors.Invalid) as caught:
            nodus.Agent("bad", client=api.client(), **{argument: value})
        assert caught.value.details["field"] == argument


# -- a Python run's handle ------------------------------------------------------------------------


def test_a_runs_children_outputs_and_verbs(api: _FakeAPI, tmp_path: Path) -> None:
    run = nodus.AgentRun("triage-1", client=api.client())
    children = run.children()
    assert [child.name for child in children] == ["triage-1-a", "triage-1-b"]
    assert ("GET", f"{PROJECT}/agentruns?parent=triage-1", None) in api.requests

    assert list(run.outputs) == ["report"] and len(run.outputs) == 1
    report = run.outputs["report"]
    assert report.bytes == len(api.outputs["report"]) and report.read_text() == "# Report\n\u2713\n"
    assert report.read_bytes() == api.outputs["report"]
    saved = report.save(tmp_path)
    assert saved == tmp_path / "report" and saved.read_bytes() == api.outputs["report"]
    assert report.save(tmp_path / "r.md").read_text() == "# Report\n\u2713\n"
    with pytest.raises(errors.NotFound) as caught:
        run.outputs["summary"]
    assert "summary" in caught.value.message and caught.value.details["output"] == "summary"

    run.suspend()
    assert run._resource["status"]["phase"] == "Waiting"
    run.resume()
    run.retry()
    assert [path for method, path in api.writes()] == [
        f"{PROJECT}/agentruns/triage-1/{verb}" for verb in ("suspend", "resume", "retry")
    ]


def test_resolve_takes_the_documents_arguments(api: _FakeAPI) -> None:
    """000's signature: positional, evidence a mapping of text, checkpoint_seq and expected_revision."""
    run = nodus.AgentRun("triage-1", client=api.client())
    run.resolve("charge-1", "Completed", {"receipt": "r-42"}, {"id": 7}, 12, 3)
    assert api.requests[-1][2] == {
        "step": "charge-1",
        "decision": "Completed",
        "expectedRevision": 3,
        "checkpointSeq": 12,
        "evidence": {"receipt": "r-42"},
        "result": {"id": 7},
    }
    run.resolve("charge-1", "NoEffect", evidence={"why": "never charged"}, expected_revision=4)
    assert api.requests[-1][2] == {
        "step": "charge-1",
        "decision": "NoEffect",
        "expectedRevision": 4,
        "evidence": {"why": "never charged"},
    }
    run.resolve("charge-1", "Cancelled")  # the revision of the run as it is now
    assert api.requests[-1][2]["expectedRevision"] == 7
    sent = len(api.requests)
    for bad, field in (
        ({"evidence": "never charged"}, "evidence"),  # 000: a mapping of text, not text
        ({"evidence": {"n": 3}}, "evidence"),
        ({"checkpoint_seq": -1}, "checkpoint_seq"),
        ({"checkpoint_seq": True}, "checkpoint_seq"),
        ({"expected_revision": "3"}, "expected_revision"),
    ):
        with pytest.raises(errors.Invalid) as caught:
            run.resolve("charge-1", "Completed", **bad)
        assert caught.value.details["field"] == field, bad
    assert len(api.requests) == sent  # refused before anything was sent
    with pytest.raises(TypeError):
        run.resolve("charge-1", "NoEffect", revision=4)  # type: ignore[call-arg]  # not 000's name


def test_a_python_runs_logs_are_its_program_log(api: _FakeAPI) -> None:
    run = nodus.AgentRun("triage-1", client=api.client())

    async def collect(follow: bool) -> list[str]:
        return [line async for line in run.logs(follow=follow)]

    assert asyncio.run(collect(False)) == ["hello", "world"]
    assert asyncio.run(collect(True)) == ["hello", "world"]  # the run has ended: the log is complete
    assert ("GET", f"{PROJECT}/agentruns/triage-1/logs", None) in api.requests


def test_waiting_on_a_python_run_goes_past_its_parked_waits_to_the_end(api: _FakeAPI) -> None:
    run = nodus.AgentRun("triage-1", client=api.client())
    for reason in ("AwaitingMessage", "Sleeping", "AwaitingChildren"):
        api.run_status = {"phase": "Waiting", "reason": reason, "program": "Python", "messages": {"read": 0}}
        with pytest.raises(errors.WaitTimeout):
            run.wait(timeout=0.05)  # a program parked mid-run has not answered yet
    api.run_status = {"phase": "Succeeded", "program": "Python"}
    assert run.wait(timeout=1).phase == "Succeeded"
