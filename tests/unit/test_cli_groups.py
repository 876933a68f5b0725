"""The `nodus` CLI over AgentGroups (``ag``), without a server.

`GroupAPI` is an httpx MockTransport over an in-memory store that follows the REST contract of
groups (``/agentgroups``, ``POST .../cancel``, ``GET .../agentruns?group=NAME``, merge patches),
so each test can assert both what the CLI printed and exactly what it sent.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from nodus.cli import commands_runs
from nodus.cli import main as cli
from nodus.cli import root as cli_root
from nodus.client import Client
from nodus.config import Settings

KINDS = {"agents": "Agent", "agentruns": "AgentRun", "agentgroups": "AgentGroup"}


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = json.loads(json.dumps(value))
    return target


class GroupAPI:
    """Agents, runs and groups; a group's status is whatever the test writes into the store."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.store: dict[tuple[str, str], dict[str, Any]] = {}

    def client(self, project: str | None = None) -> Client:
        return Client(
            settings=Settings(api_url="http://nodus.test"),
            project=project,
            transport=httpx.MockTransport(self.handle),
        )

    def writes(self) -> list[tuple[str, str, Any]]:
        return [(method, path, body) for method, path, _, body in self.requests if method != "GET"]

    def put(self, collection: str, resource: dict[str, Any]) -> dict[str, Any]:
        """Store a resource as the server would have it (used to set up a test)."""
        resource = json.loads(json.dumps(resource))
        resource.setdefault("apiVersion", "nodus.dev/v1")
        resource.setdefault("kind", KINDS[collection])
        created = datetime.now(UTC) - timedelta(minutes=5)
        resource["metadata"].setdefault("creationTimestamp", created.isoformat())
        if "status" not in resource:
            resource["status"] = (
                {"phase": "Running", "counts": {"total": 0}}
                if collection == "agentgroups"
                else {"phase": "Pending"}
            )
        self.store[(collection, resource["metadata"]["name"])] = resource
        return resource

    @staticmethod
    def _error(status: int, code: str, message: str) -> httpx.Response:
        return httpx.Response(status, json={"code": code, "message": message, "details": {}})

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, dict(request.url.params), body))
        parts = request.url.path.strip("/").split("/")
        assert parts[:2] == ["v1", "projects"], parts
        collection = parts[3]
        name = parts[4] if len(parts) > 4 else None
        sub = parts[5] if len(parts) > 5 else None
        kind = KINDS[collection]
        if name is None and request.method == "GET":
            items = [r for (c, _), r in self.store.items() if c == collection]
            for param in ("agent", "group"):
                if param in request.url.params:
                    items = [r for r in items if r["spec"].get(param) == request.url.params[param]]
            return httpx.Response(
                200, json={"apiVersion": "nodus.dev/v1", "kind": f"{kind}List", "items": items}
            )
        if name is None and request.method == "POST":
            if (collection, body["metadata"]["name"]) in self.store:
                return self._error(409, "AlreadyExists", f"{kind.lower()} exists")
            return httpx.Response(201, json=self.put(collection, body))
        existing = self.store.get((collection, name))
        if request.method == "PUT":
            if existing is None:
                return httpx.Response(201, json=self.put(collection, body))
            existing["spec"] = body["spec"]
            return httpx.Response(200, json=existing)
        if existing is None:
            return self._error(404, "NotFound", f"{kind.lower()} {name} not found")
        if request.method == "PATCH":
            assert request.headers["content-type"] == "application/merge-patch+json"
            return httpx.Response(200, json=_merge(existing, body))
        if request.method == "DELETE":
            del self.store[(collection, name)]
            if collection == "agentgroups":
                for key in [k for k, r in self.store.items() if r["spec"].get("group") == name]:
                    del self.store[key]
            return httpx.Response(200, json=existing)
        if sub == "cancel":
            if existing["status"]["phase"] not in ("Succeeded", "Failed", "Cancelled"):
                existing["spec"]["state"] = "Cancelled"
                existing["status"]["phase"] = "Cancelling" if collection == "agentgroups" else "Cancelled"
            return httpx.Response(200, json=existing)
        return httpx.Response(200, json=existing)


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> GroupAPI:
    fake = GroupAPI()
    monkeypatch.setattr(cli_root, "client", lambda project=None: fake.client(project))
    return fake


def invoke(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(cli.app, list(args), input=input)


def one_error_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def group(name: str = "parallel-agents", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "agent": "parallel-agents-worker",
            "limits": {"maxActive": 2, "maxPending": 10000},
            "maxCostUSD": "0.60",
            "sealed": False,
            "state": "Running",
        },
        "status": {
            "phase": "Running",
            "reason": None,
            "message": None,
            "counts": {
                "queued": 0,
                "active": 0,
                "waiting": 0,
                "succeeded": 0,
                "failed": 0,
                "cancelled": 0,
                "total": 0,
            },
            "blockedReasons": {"DependencyWait": 0, "MaxActiveReached": 0, "MaxCostReached": 0},
            "cost": {"totalUSD": "0", "limitUSD": "0.60", "reservedUSD": "0"},
            **status,
        },
    }


BUSY = {
    "counts": {
        "queued": 3,
        "active": 2,
        "waiting": 0,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
        "total": 6,
    },
    "blockedReasons": {"DependencyWait": 1, "MaxActiveReached": 0, "MaxCostReached": 2},
    "cost": {"totalUSD": "0.012", "limitUSD": "0.60", "reservedUSD": "0.20"},
}


# -- kinds -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ag", "agentgroup", "agentgroups", "AG"])
def test_group_kinds_are_known(api: GroupAPI, kind: str) -> None:
    api.put("agentgroups", group())
    result = invoke("get", kind)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].split()[0] == "parallel-agents"
    assert api.requests[0][1] == "/v1/projects/default/agentgroups"


def test_unknown_kind_lists_groups_among_the_known_kinds(api: GroupAPI) -> None:
    result = invoke("get", "widgets")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "agentgroup (agentgroups, ag)" in line and "later release" not in line


# -- get -------------------------------------------------------------------------------------


def test_get_ag_table(api: GroupAPI) -> None:
    api.put("agentgroups", group(**BUSY))
    api.put(
        "agentgroups",
        group("uncapped", phase="Succeeded", counts={"succeeded": 2, "total": 2}, cost={"totalUSD": "0.004"}),
    )
    del api.store[("agentgroups", "uncapped")]["spec"]["maxCostUSD"]
    result = invoke("get", "ag")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "AGENT",
        "PHASE",
        "RUNS",
        "ACTIVE",
        "WAITING",
        "QUEUED",
        "COST",
        "AGE",
    ]
    assert lines[1].split() == [
        "parallel-agents",
        "parallel-agents-worker",
        "Running",
        "1/6",
        "2",
        "0",
        "3",
        "$0.012",
        "/",
        "$0.60",
        "5m",
    ]
    assert "$0.012 / $0.60" in lines[1]
    assert lines[2].split() == [
        "uncapped",
        "parallel-agents-worker",
        "Succeeded",
        "2/2",
        "0",
        "0",
        "0",
        "$0.004",
        "5m",
    ]


def test_get_ag_table_before_the_server_wrote_a_status(api: GroupAPI) -> None:
    api.put("agentgroups", {**group(), "status": {}})
    line = invoke("get", "ag/parallel-agents").stdout.splitlines()[1]
    assert line.split() == [
        "parallel-agents",
        "parallel-agents-worker",
        "Running",
        "0/0",
        "0",
        "0",
        "0",
        "$0",
        "/",
        "$0.60",
        "5m",
    ]


def test_get_ag_wide(api: GroupAPI) -> None:
    api.put("agentgroups", group(**BUSY))
    api.put("agentgroups", group("done", phase="Failed", reason="RunsFailed", message="1 run failed"))
    api.store[("agentgroups", "done")]["spec"]["sealed"] = True
    lines = invoke("get", "ag", "-o", "wide").stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "AGENT",
        "PHASE",
        "RUNS",
        "ACTIVE",
        "WAITING",
        "QUEUED",
        "COST",
        "AGE",
        "MAX-ACTIVE",
        "SEALED",
        "REASON",
        "BLOCKED",
        "EVALUATION",
    ]
    assert lines[1].split()[-5:] == ["2", "false", "-", "DependencyWait=1,MaxCostReached=2", "-"]
    assert lines[2].split()[-5:] == ["2", "true", "RunsFailed", "-", "-"]


def test_get_ag_wide_shows_an_evaluations_progress(api: GroupAPI) -> None:
    api.put("agentgroups", group("eval", phase="Running"))
    api.store[("agentgroups", "eval")]["status"]["evaluation"] = {
        "scored": 10,
        "passed": 7,
        "unscored": 2,
        "pending": 1,
    }
    assert (
        invoke("get", "ag", "-o", "wide").stdout.splitlines()[1].split()[-1]
        == "pass=7/10,unscored=2,pending=1"
    )


def test_get_ag_yaml_name_and_jsonpath(api: GroupAPI) -> None:
    api.put("agentgroups", group(**BUSY))
    document = invoke("get", "ag/parallel-agents", "-o", "yaml").stdout
    assert "kind: AgentGroup" in document and "maxCostUSD: '0.60'" in document
    assert "MaxCostReached: 2" in document
    assert invoke("get", "ag", "-o", "name").stdout == "agentgroup/parallel-agents\n"
    result = invoke("get", "agentgroup", "parallel-agents", "-o", "jsonpath={.status.counts.total}")
    assert result.stdout == "6\n"
    assert api.requests[0][1] == "/v1/projects/default/agentgroups/parallel-agents"


def test_get_ag_empty_and_missing(api: GroupAPI) -> None:
    result = invoke("get", "ag")
    assert result.exit_code == 0 and result.stderr == "No agentgroups found in project default.\n"
    result = invoke("get", "ag/nope")
    assert result.exit_code == 1 and "not found" in one_error_line(result)


def test_get_runs_by_group_asks_the_server_and_still_filters(api: GroupAPI) -> None:
    for task, grp in (("a", "parallel-agents"), ("b", "parallel-agents"), ("x", "other")):
        api.put(
            "agentruns",
            {
                "metadata": {"name": f"{grp}-{task}"},
                "spec": {"agent": "parallel-agents-worker", "group": grp, "taskKey": task},
            },
        )
    result = invoke("get", "ar", "--field-selector", "spec.group=parallel-agents")
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == [
        "parallel-agents-a",
        "parallel-agents-b",
    ]
    method, path, params, _ = api.requests[-1]
    # The server filters (a field selector it selects on, a page of 500 at a time); this fake
    # server does not, so the output shows the CLI still checks every item itself.
    wanted = {"fieldSelector": "spec.group=parallel-agents", "limit": "500"}
    assert (method, path, params) == ("GET", "/v1/projects/default/agentruns", wanted)
    # Both server filters together, and a != selector (the server selects on it too, decision 61).
    invoke("get", "ar", "--field-selector", "spec.group=parallel-agents,spec.agent=parallel-agents-worker")
    selector = "spec.group=parallel-agents,spec.agent=parallel-agents-worker"
    assert api.requests[-1][2] == {"fieldSelector": selector, "limit": "500"}
    result = invoke("get", "ar", "--field-selector", "spec.group!=parallel-agents", "-o", "name")
    assert api.requests[-1][2] == {"fieldSelector": "spec.group!=parallel-agents", "limit": "500"}
    assert result.stdout == "agentrun/other-x\n"


# -- create / apply --------------------------------------------------------------------------


def test_create_agentgroup_sends_the_manifest(api: GroupAPI) -> None:
    result = invoke(
        "create",
        "agentgroup",
        "parallel-agents",
        "--agent",
        "parallel-agents-worker",
        "--max-active",
        "2",
        "--max-cost",
        "0.60",
        "--max-pending",
        "50",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "agentgroup/parallel-agents created\n"
    assert api.writes() == [
        (
            "POST",
            "/v1/projects/default/agentgroups",
            {
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentGroup",
                "metadata": {"name": "parallel-agents"},
                "spec": {
                    "agent": "parallel-agents-worker",
                    "limits": {"maxActive": 2, "maxPending": 50},
                    "maxCostUSD": "0.60",
                },
            },
        )
    ]


def test_create_agentgroup_defaults_are_left_to_the_server(api: GroupAPI) -> None:
    result = invoke("create", "agentgroup", "g", "--agent", "w", "-p", "team-a")
    assert result.exit_code == 0, result.output
    assert api.writes() == [
        (
            "POST",
            "/v1/projects/team-a/agentgroups",
            {
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentGroup",
                "metadata": {"name": "g"},
                "spec": {"agent": "w"},
            },
        )
    ]


@pytest.mark.parametrize(
    "flags, field",
    [
        (["--max-active", "0"], "spec.limits.maxActive"),
        (["--max-active", "1001"], "spec.limits.maxActive"),
        (["--max-cost", "$0.60"], "spec.maxCostUSD"),
        (["--max-cost", "cheap"], "spec.maxCostUSD"),
        (["--max-cost", "0"], "spec.maxCostUSD"),
        (["--max-pending", "0"], "spec.limits.maxPending"),
    ],
)
def test_create_agentgroup_refuses_bad_limits_locally(api: GroupAPI, flags: list[str], field: str) -> None:
    result = invoke("create", "agentgroup", "parallel-agents", "--agent", "parallel-agents-worker", *flags)
    assert result.exit_code == 1
    assert field in one_error_line(result)
    assert result.stdout == ""
    assert api.requests == []


def test_create_agentgroup_non_integer_max_active_is_a_usage_error(api: GroupAPI) -> None:
    result = invoke("create", "agentgroup", "g", "--agent", "w", "--max-active", "two")
    assert result.exit_code == 2
    one_error_line(result)
    assert api.requests == []


def test_create_agentrun_in_a_group(api: GroupAPI) -> None:
    result = invoke(
        "create",
        "agentrun",
        "parallel-agents-c",
        "--agent",
        "parallel-agents-worker",
        "--prompt",
        "Sum up.",
        "--group",
        "parallel-agents",
        "--task-key",
        "c",
        "--depends-on",
        "a",
        "--depends-on",
        "b",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "agentrun/parallel-agents-c created\n"
    assert api.writes()[-1][2]["spec"] == {
        "agent": "parallel-agents-worker",
        "input": "Sum up.",
        "group": "parallel-agents",
        "taskKey": "c",
        "dependsOn": ["a", "b"],
    }


@pytest.mark.parametrize(
    "name, flags, field",
    [
        ("wrong-name", ["--group", "g", "--task-key", "a"], "metadata.name"),
        ("g-a", ["--group", "g"], "spec.taskKey"),
        ("g-a", ["--task-key", "a"], "spec.taskKey"),
        ("g-a", ["--depends-on", "b"], "spec.dependsOn"),
        # a group member may be keep-alive (decision 48: tests/unit/test_sessions.py); not hold a session
        ("g-a", ["--group", "g", "--task-key", "a", "--session-key", "s"], "spec.sessionKey"),
    ],
)
def test_create_agentrun_membership_refused_locally(
    api: GroupAPI, name: str, flags: list[str], field: str
) -> None:
    result = invoke("create", "agentrun", name, "--agent", "w", "--prompt", "x", *flags)
    assert result.exit_code == 1
    assert field in one_error_line(result)
    assert api.requests == []


GROUP_YAML = """\
apiVersion: nodus.dev/v1
kind: AgentGroup
metadata:
  name: parallel-agents
spec:
  agent: parallel-agents-worker
  limits:
    maxActive: 2
  maxCostUSD: "0.60"
"""

RUNS_YAML = """\
apiVersion: nodus.dev/v1
kind: AgentRun
metadata:
  name: parallel-agents-a
spec:
  agent: parallel-agents-worker
  group: parallel-agents
  taskKey: a
  input: "What is the capital of France?"
---
apiVersion: nodus.dev/v1
kind: AgentRun
spec:
  agent: parallel-agents-worker
  group: parallel-agents
  taskKey: b
  input: "What is the capital of Japan?"
---
apiVersion: nodus.dev/v1
kind: AgentRun
metadata:
  labels: {step: final}
spec:
  agent: parallel-agents-worker
  group: parallel-agents
  taskKey: c
  dependsOn: [a, b]
  input: "Say that both questions have been answered."
"""


def test_apply_group_and_member_runs_without_names(api: GroupAPI, tmp_path: Path) -> None:
    (tmp_path / "group.yaml").write_text(GROUP_YAML)
    (tmp_path / "runs.yaml").write_text(RUNS_YAML)
    result = invoke("apply", "-f", str(tmp_path / "group.yaml"))
    assert result.exit_code == 0, result.output
    assert result.stdout == "agentgroup/parallel-agents created\n"
    assert api.writes()[-1][:2] == ("PUT", "/v1/projects/default/agentgroups/parallel-agents")
    result = invoke("apply", "-f", str(tmp_path / "runs.yaml"))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "agentrun/parallel-agents-a created",
        "agentrun/parallel-agents-b created",
        "agentrun/parallel-agents-c created",
    ]
    puts = api.writes()[1:]
    assert [path.rsplit("/", 1)[-1] for _, path, _ in puts] == [
        "parallel-agents-a",
        "parallel-agents-b",
        "parallel-agents-c",
    ]
    assert puts[1][2]["metadata"] == {"name": "parallel-agents-b"}
    assert puts[2][2]["metadata"] == {"labels": {"step": "final"}, "name": "parallel-agents-c"}
    assert puts[2][2]["spec"]["dependsOn"] == ["a", "b"]
    # delete -f finds the members by the same names.
    result = invoke("delete", "-f", str(tmp_path / "runs.yaml"))
    assert result.stdout.splitlines()[1] == "agentrun/parallel-agents-b deleted"


def test_apply_member_run_with_another_name_is_refused_before_sending(api: GroupAPI) -> None:
    wrong = RUNS_YAML.replace("name: parallel-agents-a", "name: task-a")
    result = invoke("apply", "-f", "-", input=wrong)
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "document 1" in line and "metadata.name" in line and "'parallel-agents-a'" in line
    assert api.requests == []


def test_apply_group_with_bad_max_active_is_refused_before_sending(api: GroupAPI) -> None:
    result = invoke("apply", "-f", "-", input=GROUP_YAML.replace("maxActive: 2", "maxActive: 5000"))
    assert result.exit_code == 1 and "spec.limits.maxActive" in one_error_line(result)
    assert api.requests == []


# -- patch / cancel / delete -----------------------------------------------------------------


def test_patch_seal_and_max_active(api: GroupAPI) -> None:
    api.put("agentgroups", group())
    result = invoke("patch", "ag/parallel-agents", "--patch", '{"spec":{"sealed":true}}')
    assert result.exit_code == 0, result.output
    assert result.stdout == "agentgroup/parallel-agents patched\n"
    assert api.writes() == [
        ("PATCH", "/v1/projects/default/agentgroups/parallel-agents", {"spec": {"sealed": True}})
    ]
    invoke("patch", "agentgroup", "parallel-agents", "--patch", '{"spec":{"limits":{"maxActive":4}}}')
    assert api.writes()[-1][2] == {"spec": {"limits": {"maxActive": 4}}}
    stored = api.store[("agentgroups", "parallel-agents")]["spec"]
    assert stored["sealed"] is True and stored["limits"] == {"maxActive": 4, "maxPending": 10000}


def test_cancel_group(api: GroupAPI) -> None:
    api.put("agentgroups", group())
    api.put("agentgroups", group("finished", phase="Succeeded"))
    result = invoke("cancel", "ag/parallel-agents")
    assert result.exit_code == 0, result.output
    assert result.stdout == "agentgroup/parallel-agents cancelled\n"
    assert api.writes() == [("POST", "/v1/projects/default/agentgroups/parallel-agents/cancel", None)]
    result = invoke("cancel", "agentgroup/finished")
    assert result.stdout == "agentgroup/finished already Succeeded; nothing to cancel\n"
    result = invoke("cancel", "ag/missing")
    assert result.exit_code == 1 and "not found" in one_error_line(result)


def test_cancel_refuses_other_kinds_before_sending(api: GroupAPI) -> None:
    result = invoke("cancel", "ag/parallel-agents", "agent/worker")
    assert result.exit_code == 2
    assert "only agentruns and agentgroups can be cancelled" in one_error_line(result)
    assert api.requests == []


def test_delete_group(api: GroupAPI) -> None:
    api.put("agentgroups", group())
    api.put(
        "agentruns",
        {
            "metadata": {"name": "parallel-agents-a"},
            "spec": {"agent": "parallel-agents-worker", "group": "parallel-agents", "taskKey": "a"},
        },
    )
    result = invoke("delete", "ag/parallel-agents")
    assert result.exit_code == 0, result.output
    assert result.stdout == "agentgroup/parallel-agents deleted\n"
    assert api.writes() == [("DELETE", "/v1/projects/default/agentgroups/parallel-agents", None)]
    assert api.store == {}
    assert invoke("delete", "ag/parallel-agents", "--ignore-not-found").exit_code == 0


# -- wait ------------------------------------------------------------------------------------

FOR_SUCCEEDED = "--for=jsonpath={.status.phase}=Succeeded"


def test_wait_group_succeeds(api: GroupAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    api.put("agentgroups", group())
    polls = {"n": 0}
    real_get = Client.get

    def get(self: Client, collection: str, name: str, **kwargs: Any) -> dict[str, Any]:
        polls["n"] += 1
        if polls["n"] == 3:  # the group finishes while the CLI waits
            api.store[("agentgroups", name)]["status"]["phase"] = "Succeeded"
        return real_get(self, collection, name, **kwargs)

    monkeypatch.setattr(Client, "get", get)
    monkeypatch.setattr(commands_runs.time, "sleep", lambda _: None)
    result = invoke("wait", "ag/parallel-agents", FOR_SUCCEEDED, "--timeout=12m")
    assert result.exit_code == 0, result.output
    assert result.stdout == "agentgroup/parallel-agents condition met\n"
    assert polls["n"] == 3


def test_wait_group_fails_fast_on_another_terminal_phase(api: GroupAPI) -> None:
    api.put("agentgroups", group(phase="Failed", reason="RunsFailed", message="1 run failed"))
    result = invoke("wait", "ag/parallel-agents", FOR_SUCCEEDED, "--timeout=2s")
    assert result.exit_code == 1
    assert one_error_line(result) == (
        "error: RunsFailed: agentgroup/parallel-agents ended Failed (RunsFailed): 1 run failed; "
        "it will not become Succeeded"
    )
    assert len(api.requests) == 1


def test_wait_group_cancelling_will_not_succeed_but_may_be_cancelled(
    api: GroupAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.put("agentgroups", group(phase="Cancelling"))
    result = invoke("wait", "ag/parallel-agents", FOR_SUCCEEDED, "--timeout=2s")
    assert result.exit_code == 1
    assert one_error_line(result) == (
        "error: Cancelling: agentgroup/parallel-agents is Cancelling; it will not become Succeeded"
    )
    monkeypatch.setattr(commands_runs.time, "sleep", lambda _: None)
    result = invoke(
        "wait", "ag/parallel-agents", "--for=jsonpath={.status.phase}=Cancelled", "--timeout=0.05s"
    )
    assert result.exit_code == 1
    assert "timed out after 0.05s waiting for agentgroup/parallel-agents: {.status.phase} is Cancelling" in (
        one_error_line(result)
    )
    # Waiting for another field is not cut short by the phase.
    api.store[("agentgroups", "parallel-agents")]["status"]["phase"] = "Cancelled"
    result = invoke("wait", "ag/parallel-agents", "--for=jsonpath={.status.phase}=Cancelled", "--timeout=2s")
    assert result.exit_code == 0 and result.stdout == "agentgroup/parallel-agents condition met\n"
    result = invoke("wait", "ag/parallel-agents", "--for=jsonpath={.status.counts.total}=0", "--timeout=2s")
    assert result.exit_code == 0


def test_wait_group_delete(api: GroupAPI) -> None:
    result = invoke("wait", "ag/gone", "--for=delete")
    assert result.exit_code == 0 and result.stdout == "agentgroup/gone condition met\n"


def test_create_agentgroup_with_an_environment_sends_the_evaluation(api: GroupAPI) -> None:
    result = invoke(
        "create",
        "agentgroup",
        "eval-1",
        "--agent",
        "parallel-agents-worker",
        "--max-active",
        "2",
        "--max-cost",
        "0.20",
        "--environment",
        "nodus/arithmetic-v2@2.0.0",
        "--tasks",
        "10",
        "--seed",
        "42",
        "--timeout",
        "10m",
    )
    assert result.exit_code == 0, result.output
    ((_, _, body),) = api.writes()
    assert body["spec"] == {
        "agent": "parallel-agents-worker",
        "limits": {"maxActive": 2},
        "maxCostUSD": "0.20",
        "evaluation": {"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 10, "seed": 42, "timeout": "10m"},
    }


def test_evaluation_flags_without_an_environment_are_refused_before_sending(api: GroupAPI) -> None:
    result = invoke("create", "agentgroup", "eval-1", "--agent", "a", "--tasks", "10", "--seed", "1")
    assert result.exit_code != 0
    assert "--tasks, --seed describe an evaluation: add --environment" in one_error_line(result)
    assert api.writes() == []


def test_evaluation_results_prints_one_line_per_case(api: GroupAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    items = [
        {
            "taskId": "test-000",
            "repetition": 1,
            "run": "e-test-000-r1",
            "state": "Scored",
            "verdict": "pass",
            "reward": 1.0,
            "evidence": "matches",
            "reason": None,
        },
        {
            "taskId": "test-000",
            "repetition": 2,
            "run": "e-test-000-r2",
            "state": "RunFailed",
            "verdict": None,
            "reward": None,
            "evidence": "",
            "reason": "DeadlineExceeded",
        },
    ]
    monkeypatch.setattr(
        Client, "group_results", lambda self, name, project=None: {"evaluation": {}, "items": items}
    )
    lines = invoke("evaluation", "results", "e").stdout.splitlines()
    assert [line.split() for line in lines] == [
        ["CASE", "RUN", "STATE", "VERDICT", "REWARD"],
        ["test-000#1", "e-test-000-r1", "Scored", "pass", "1"],
        ["test-000#2", "e-test-000-r2", "RunFailed", "-", "-"],
    ]
    wide = invoke("evaluation", "results", "e", "-o", "wide").stdout.splitlines()
    assert wide[2].split()[-2:] == ["DeadlineExceeded", "-"] and wide[1].split()[-1] == "matches"
    assert "kind: EvaluationResultList" in invoke("evaluation", "results", "e", "-o", "yaml").stdout


def test_get_environments_lists_versions_and_filters_by_name(
    api: GroupAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = [
        {
            "ref": f"nodus/{name}@{version}",
            "owner": "nodus",
            "name": name,
            "version": version,
            "splits": ["train", "test"],
            "maxTasks": 1000,
            "description": "d",
            "image": None,
        }
        for name, version in (("arithmetic-v2", "2.0.0"), ("python-fix", "1.0.0"), ("python-fix", "1.1.0"))
    ]
    monkeypatch.setattr(Client, "environments", lambda self, project=None: installed)
    rows = [line.split()[:3] for line in invoke("get", "environments").stdout.splitlines()]
    assert rows == [
        ["NAME", "VERSION", "SPLITS"],
        ["nodus/arithmetic-v2", "2.0.0", "train,test"],
        ["nodus/python-fix", "1.0.0", "train,test"],
        ["nodus/python-fix", "1.1.0", "train,test"],
    ]
    versions = [line.split()[1] for line in invoke("get", "env", "nodus/python-fix").stdout.splitlines()[1:]]
    assert versions == ["1.0.0", "1.1.0"]
    missing = invoke("get", "environments", "acme/none@1.0.0")
    assert missing.exit_code != 0 and "'acme/none@1.0.0' is not installed" in one_error_line(missing)
    # Environments have no labels, fields or pages: a selector is refused, never ignored.
    for flags in (["--selector", "team=a"], ["--field-selector", "status.phase=Running"], ["--limit", "1"]):
        for kind in (["environments"], ["env", "nodus/python-fix"], ["environments/nodus/python-fix"]):
            refused = invoke("get", *kind, *flags)
            assert refused.exit_code != 0 and refused.stdout == "", (kind, flags)
            assert f"{flags[0]} does not apply to environments" in one_error_line(refused)
