"""The API of Python agents over a real control plane's services (no Ray): source uploads (checked,
content-addressed, written once), an Agent naming a source, a run's outputs and program log.

Serve's app runs over `tests.fakes.control_plane.client_over`, whose calls go to the services
`make_plane` composed over real local storage, so what a route answers is what the plane does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

import nodus
from nodus.client import Client
from nodus.config import Settings
from nodus.schema_agent import source_digest, source_ref
from nodus_ray.control.listing import ListingService
from nodus_ray.control.run_files import RunFiles
from nodus_ray.control.tokens import token_digest
from nodus_ray.store import layout
from nodus_serve.app import create_app
from nodus_serve.program_routes import MAX_SOURCE_BODY_BYTES
from tests.fakes.control_plane import client_over
from tests.unit.test_control_support import Plane, agent_doc, make_plane, run_doc, until

BASE = "/v1/projects/demo"
TOKEN = "nodus_test_writer"
MAIN = "import json\n\n\ndef main(ctx, input):\n    return {'echo': input}\n"


def _call(plane: Plane) -> Callable[..., Awaitable[Any]]:
    services = plane.services
    files = RunFiles(services.registry)
    table: dict[str, Callable[..., Awaitable[Any]]] = {
        "upload_source": services.agents.sources.upload_source,
        "apply_agent": services.agents.apply_agent,
        "get_agent": services.agents.get_agent,
        "create_run": services.runs.create_run,
        "get_run": services.runs.get_run,
        "run_outputs": files.run_outputs,
        "run_output": files.run_output,
        "run_logs": files.run_logs,
        "list_runs": services.runs.list_runs,
        "list_page": ListingService(services.agents, services.runs, services.groups).page,
        "suspend_run": services.controls.suspend_run,
        "resume_run": services.controls.resume_run,
        "retry_run": services.controls.retry_run,
    }

    async def call(method: str, *args: Any) -> Any:
        if method == "authenticate":
            if args[0] != token_digest(TOKEN):
                return None
            return {"name": "writer", "project": "demo", "role": "write", "expiresAt": None}
        return await table[method](*args)

    return call


Scenario = Callable[[httpx.AsyncClient, Plane], Awaitable[None]]


def _run(tmp_path: Path, scenario: Scenario) -> None:
    async def main() -> None:
        plane = await make_plane(tmp_path)
        app = create_app(client_over(_call(plane)))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers) as http:
            await scenario(http, plane)

    asyncio.run(main())


def _python_agent(digest: str, entrypoint: str = "main:main", **spec: Any) -> dict[str, Any]:
    source = {"digest": digest, "files": 1, "bytes": len(MAIN.encode())}
    return agent_doc("researcher", source=source, entrypoint=entrypoint, **spec)


def _refusal(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text[:400]
    body = response.json()
    assert set(body) == {"code", "message", "details"}, body
    return dict(body)


def test_an_upload_is_stored_once_by_its_content_and_answers_spec_source(tmp_path: Path) -> None:
    async def scenario(http: httpx.AsyncClient, plane: Plane) -> None:
        first = await http.post(f"{BASE}/agentsources", json={"files": {"main.py": MAIN}})
        assert first.status_code == 201, first.text
        ref = first.json()
        assert ref == {"digest": source_digest({"main.py": MAIN}), "files": 1, "bytes": len(MAIN.encode())}
        key = layout.agent_source("demo", ref["digest"].removeprefix("sha256:"))
        assert plane.storage.read_json(key) == {"files": {"main.py": MAIN}}
        stored = Path(plane.storage.local_root, key)
        before = stored.stat().st_mtime_ns
        again = await http.post(f"{BASE}/agentsources", json={"files": {"./main.py": MAIN}})
        assert again.status_code == 201 and again.json() == ref  # same content, same digest
        assert stored.stat().st_mtime_ns == before  # and not written again

    _run(tmp_path, scenario)


def test_an_upload_that_does_not_compile_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    async def scenario(http: httpx.AsyncClient, plane: Plane) -> None:
        files = {"main.py": MAIN, "pkg/util.py": "def ok():\n    return 1\n\ndef broken(:\n"}
        body = _refusal(await http.post(f"{BASE}/agentsources", json={"files": files}), 422)
        assert "pkg/util.py line 4" in body["message"] and body["details"]["field"] == "spec.source"
        assert plane.storage.list_dir(layout.sources_folder("demo")) == []  # nothing stored

    _run(tmp_path, scenario)


def test_uploads_over_a_limit_or_of_the_wrong_shape_are_refused_naming_it(tmp_path: Path) -> None:
    async def scenario(http: httpx.AsyncClient, plane: Plane) -> None:
        many = {f"m{i}.py": "x = 1\n" for i in range(1001)}
        body = _refusal(await http.post(f"{BASE}/agentsources", json={"files": many}), 422)
        assert "1000 files" in body["message"]
        big = {"data.txt": "x" * (4 * 1024 * 1024 + 1)}
        body = _refusal(
            await http.post(f"{BASE}/agentsources", json={"files": big}), 413
        )  # the size limit: Payload Too Large, as the body cap
        assert "4 MiB" in body["message"]
        huge = b'{"files": {"a.txt": "' + b"x" * MAX_SOURCE_BODY_BYTES + b'"}}'
        body = _refusal(await http.post(f"{BASE}/agentsources", content=huge), 413)
        assert "4 MiB" in body["message"] and body["details"]["limit"] == 4 * 1024 * 1024
        for bad, field in (
            ({}, "files"),
            ({"files": {}}, "files"),
            ({"files": {"main.py": 3}}, "files.main.py"),
            ({"files": {"main.py": MAIN}, "entry": "x"}, "entry"),
        ):
            body = _refusal(await http.post(f"{BASE}/agentsources", json=bad), 422)
            assert body["details"]["field"] == field, body
        body = _refusal(await http.post(f"{BASE}/agentsources", json={"files": {"../x.py": MAIN}}), 422)
        assert "'..'" in body["message"]
        assert plane.storage.list_dir(layout.sources_folder("demo")) == []

    _run(tmp_path, scenario)


def test_an_agent_naming_an_unknown_source_or_a_missing_entrypoint_is_refused(tmp_path: Path) -> None:
    async def scenario(http: httpx.AsyncClient, plane: Plane) -> None:
        unknown = "sha256:" + "0" * 64
        body = _refusal(await http.put(f"{BASE}/agents/researcher", json=_python_agent(unknown)), 422)
        assert body["details"]["field"] == "spec.source" and unknown in body["message"]
        ref = (await http.post(f"{BASE}/agentsources", json={"files": {"main.py": MAIN}})).json()
        for entrypoint, says in (("main:run", "run is not defined"), ("agent:main", "no module agent")):
            answer = await http.put(
                f"{BASE}/agents/researcher", json=_python_agent(ref["digest"], entrypoint)
            )
            body = _refusal(answer, 422)
            assert body["details"]["field"] == "spec.entrypoint" and says in body["message"], body
        wrong_size = _python_agent(ref["digest"])
        wrong_size["spec"]["source"]["bytes"] += 1
        body = _refusal(await http.put(f"{BASE}/agents/researcher", json=wrong_size), 422)
        assert body["details"]["field"] == "spec.source"
        with_only_source = agent_doc("researcher", source=ref)
        body = _refusal(await http.put(f"{BASE}/agents/researcher", json=with_only_source), 422)
        assert "spec.entrypoint" in body["message"]
        assert (await http.get(f"{BASE}/agents/researcher")).status_code == 404  # nothing was stored

        spec = {"setup": "pip install -r requirements.txt", "cpu": 2, "memory": "2Gi", "maxCostUSD": "5.00"}
        created = await http.put(f"{BASE}/agents/researcher", json=_python_agent(ref["digest"], **spec))
        assert created.status_code == 201, created.text
        assert created.json()["spec"]["entrypoint"] == "main:main"
        assert created.json()["spec"]["source"] == ref and created.json()["spec"]["cpu"] == 2
        again = await http.put(f"{BASE}/agents/researcher", json=_python_agent(ref["digest"], **spec))
        assert again.status_code == 200 and again.headers["X-Nodus-Result"] == "unchanged"

    _run(tmp_path, scenario)


def test_a_runs_outputs_and_program_log_are_read_back(tmp_path: Path) -> None:
    async def scenario(http: httpx.AsyncClient, plane: Plane) -> None:
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        assert (await http.get(f"{BASE}/agentruns/r1/outputs")).json() == {"items": []}
        body = _refusal(await http.get(f"{BASE}/agentruns/r1/outputs/report"), 404)
        assert "report" in body["message"] and body["details"]["output"] == "report"
        report = "# Report\n\nAll good. \u2713\n".encode()
        plane.storage.write_bytes(layout.run_output("demo", "r1", "report"), report)
        plane.storage.write_bytes(layout.run_output("demo", "r1", "data.bin"), bytes(range(256)))
        listed = (await http.get(f"{BASE}/agentruns/r1/outputs")).json()["items"]
        assert listed == [{"name": "data.bin", "bytes": 256}, {"name": "report", "bytes": len(report)}]
        answer = await http.get(f"{BASE}/agentruns/r1/outputs/report")
        assert answer.status_code == 200 and answer.content == report
        assert (await http.get(f"{BASE}/agentruns/r1/outputs/data.bin")).content == bytes(range(256))
        body = _refusal(await http.get(f"{BASE}/agentruns/r1/outputs/.hidden"), 422)
        assert body["details"]["field"] == "output"
        body = _refusal(await http.get(f"{BASE}/agentruns/r1/outputs/nope"), 404)
        assert "data.bin, report" in body["message"]

        assert (await http.get(f"{BASE}/agentruns/r1/logs")).text == ""
        plane.storage.write_bytes(layout.program_log("demo", "r1", 2), b"second attempt\n")
        plane.storage.write_bytes(layout.program_log("demo", "r1", 1), b"first attempt\n")
        logs = await http.get(f"{BASE}/agentruns/r1/logs")
        assert logs.status_code == 200 and logs.text == "first attempt\nsecond attempt\n"
        assert logs.headers["content-type"].startswith("text/plain")
        for path in ("outputs", "outputs/report", "logs"):
            body = _refusal(await http.get(f"{BASE}/agentruns/missing/{path}"), 404)
            assert body["details"]["name"] == "missing"

    _run(tmp_path, scenario)


def test_suspend_resume_retry_and_the_children_filter_reach_the_plane(tmp_path: Path) -> None:
    async def scenario(http: httpx.AsyncClient, plane: Plane) -> None:
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.runs.create_run("demo", run_doc("r1"))
        await until(
            lambda: plane.services.registry.runs[("demo", "r1")]["status"]["phase"] == "Running",
            what="r1 running",
        )
        body = _refusal(await http.post(f"{BASE}/agentruns/r1/resume"), 409)
        assert body["code"] == "NotSuspended"
        body = _refusal(await http.post(f"{BASE}/agentruns/r1/retry"), 409)
        assert body["code"] == "NotFailed"
        suspended = await http.post(f"{BASE}/agentruns/r1/suspend")
        assert suspended.status_code == 200, suspended.text
        assert (suspended.json()["status"]["phase"], suspended.json()["status"]["reason"]) == (
            "Waiting",
            "Suspended",
        )
        resumed = await http.post(f"{BASE}/agentruns/r1/resume")
        assert resumed.status_code == 200 and resumed.json()["status"]["phase"] == "Running"
        for verb in ("suspend", "resume", "retry"):
            body = _refusal(await http.post(f"{BASE}/agentruns/missing/{verb}"), 404)
            assert body["details"]["name"] == "missing"
        assert (await http.get(f"{BASE}/agentruns", params={"parent": "r1"})).json()["items"] == []
        await plane.services.runs.create_run("demo", run_doc("r1-a"))
        plane.services.registry.runs[("demo", "r1-a")]["status"]["parent"] = "r1"  # as spawn_child sets it
        children = (await http.get(f"{BASE}/agentruns", params={"parent": "r1"})).json()["items"]
        assert [run["metadata"]["name"] for run in children] == ["r1-a"]
        everything = (await http.get(f"{BASE}/agentruns")).json()["items"]
        assert sorted(run["metadata"]["name"] for run in everything) == ["r1", "r1-a"]

    _run(tmp_path, scenario)


def test_the_openapi_document_describes_the_source_upload() -> None:
    document = create_app(client_over(_never)).openapi()
    operation = document["paths"]["/v1/projects/{project}/agentsources"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["files"] and "201" in operation["responses"]
    assert "/v1/projects/{project}/agentruns/{name}/outputs/{output}" in document["paths"]
    assert json.dumps(document)  # serialisable


async def _never(method: str, *args: Any) -> Any:
    raise AssertionError(f"no call expected, got {method}")


class _ThreadedAPI(httpx.BaseTransport):
    """A sync transport into the app, which runs with the plane's services on a loop of its own
    thread, so the SDK's blocking client talks to the real routes and services."""

    def __init__(self, tmp_path: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.plane: Plane = self._submit(make_plane(tmp_path))
        app = create_app(client_over(_call(self.plane)))
        self._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://nodus.test")

    def _submit(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def forward() -> httpx.Response:
            answer = await self._http.request(
                request.method,
                request.url.path,
                params=request.url.params,
                content=request.read(),
                headers={**request.headers, "Authorization": f"Bearer {TOKEN}"},
            )
            return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

        return self._submit(forward())

    def close(self) -> None:
        self._submit(self._http.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def test_the_sdk_deploys_a_module_through_the_real_routes_and_checks(tmp_path: Path) -> None:
    transport = _ThreadedAPI(tmp_path / "server")
    try:
        client = Client(settings=Settings(api_url="http://nodus.test", project="demo"), transport=transport)
        program = tmp_path / "researcher_prog.py"
        program.write_text(
            "import nodus\n\n"
            'agent = nodus.Agent("researcher", models=["haiku", "sonnet"], per_run_max_cost="0.50",\n'
            '                    network=nodus.Egress(allowed_hosts=["api.github.com"]))\n\n'
            '@agent.step(effect="idempotent")\n'
            "def fetch_issue(number: int) -> dict:\n"
            '    return {"title": f"issue {number}"}\n\n'
            "@agent.entrypoint\n"
            "def main(ctx: nodus.RunContext, input: dict) -> dict:\n"
            '    return fetch_issue(input["issue"])\n'
        )
        spec = importlib.util.spec_from_file_location("researcher_prog", program)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["researcher_prog"] = module
        spec.loader.exec_module(module)
        agent: nodus.Agent = module.agent
        agent._client = client
        deployed = agent.deploy()
        assert deployed.spec.entrypoint == "researcher_prog:main"
        assert deployed.status.revision == 1
        stored = transport._submit(transport.plane.services.agents.get_agent("demo", "researcher"))
        assert stored["spec"]["source"] == source_ref({"researcher_prog.py": program.read_text()})
        assert stored["spec"]["model"]["families"] == ["haiku", "sonnet"]
        assert stored["spec"]["network"] == {"allowedHosts": ["api.github.com"]}
        again = client.apply("agents", agent.manifest(), project="demo")
        assert again.result == "unchanged"  # the SDK's digest is the server's
        assert agent.local({"issue": 42}) == {"title": "issue 42"}
    finally:
        transport.close()
