"""Unit tests of `nodus.AgentGroup` and `Agent.map`, without a server.

`FakeGroupsAPI` is an httpx MockTransport over an in-memory model of the group endpoints of
docs/api.md: groups (create, seal, cancel, delete), AgentRunList batches (all or nothing,
dependencies checked, Idempotency-Key replayed) and answers. Time in the fake is a tick that
advances on every poll (a group or run-list GET), and each task finishes at a scripted tick, so
runs finish in a chosen order without any sleep.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
import uuid
from typing import Any

import httpx
import pytest

import nodus
from nodus import agent_map as agent_map_module
from nodus import errors
from nodus import handles as handles_module
from nodus.client import Client
from nodus.resources import GROUP_TERMINAL_PHASES, TERMINAL_PHASES, parse_resource, parse_run_list


def _error(status: int, code: str, message: str, **details: Any) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": message, "details": details})


class FakeGroupsAPI:
    """Agents (stored only), AgentGroups, member runs and their answers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any, dict[str, str]]] = []
        self.agents: dict[str, dict[str, Any]] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}  # in creation order
        self.born: dict[str, int] = {}  # run name -> the tick it was created at
        self.batches: dict[str, list[dict[str, Any]]] = {}  # Idempotency-Key -> the answer
        self.batch_keys: list[str] = []  # every key received, replays included
        self.deleted: list[str] = []
        # taskKey -> (ticks after creation, final phase, reason, message); default: Succeeded at 1.
        self.plan: dict[str, tuple[int, str, str | None, str | None]] = {}
        self.default_ticks = 1
        self.tick = 0
        self.unavailable = 0  # answer this many GETs with 503
        self.delete_fails = False

    def client(self) -> Client:
        return Client(
            api_url="http://nodus.test", project="default", transport=httpx.MockTransport(self.handle)
        )

    # -- what was sent ----------------------------------------------------------------------

    def writes(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _, _, _ in self.requests if method != "GET"]

    def batch_posts(self) -> list[list[dict[str, Any]]]:
        return [
            body["items"]
            for method, path, _, body, _ in self.requests
            if method == "POST" and path.endswith("/agentruns")
        ]

    # -- the model --------------------------------------------------------------------------

    def _run_status(self, name: str) -> None:
        run = self.runs[name]
        status = run["status"]
        if status["phase"] in TERMINAL_PHASES:
            return
        group = self.groups.get(run["spec"]["group"])
        if group is not None and group["spec"]["state"] == "Cancelled":
            status.update(phase="Cancelled", reason="GroupCancelled", message=None)
            return
        ticks, phase, reason, message = self.plan.get(
            run["spec"]["taskKey"], (self.default_ticks, "Succeeded", None, None)
        )
        if self.tick - self.born[name] >= ticks:
            status.update(phase=phase, reason=reason, message=message)
        else:
            status.update(phase="Running")

    def _members(self, group: str) -> list[dict[str, Any]]:
        members = [run for run in self.runs.values() if run["spec"]["group"] == group]
        for run in members:
            self._run_status(run["metadata"]["name"])
        return members

    def _group_status(self, name: str) -> dict[str, Any]:
        group = self.groups[name]
        members = self._members(name)
        phases = [run["status"]["phase"] for run in members]
        counts = {
            "queued": phases.count("Pending"),
            "active": phases.count("Running"),
            "waiting": phases.count("Waiting"),
            "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"),
            "cancelled": phases.count("Cancelled"),
            "total": len(phases),
        }
        if group["status"]["phase"] in GROUP_TERMINAL_PHASES:
            phase = group["status"]["phase"]
        elif group["spec"]["state"] == "Cancelled":
            phase = "Cancelled"
        elif group["spec"]["sealed"] and all(p in TERMINAL_PHASES for p in phases):
            phase = "Succeeded" if all(p == "Succeeded" for p in phases) else "Failed"
        else:
            phase = "Running"
        group["status"].update(phase=phase, counts=counts)
        return group

    # -- HTTP -------------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        params = dict(request.url.params)
        self.requests.append((request.method, request.url.path, params, body, dict(request.headers)))
        if request.method == "GET" and self.unavailable:
            self.unavailable -= 1
            return _error(503, "Unavailable", "the control plane is restarting")
        parts = request.url.path.strip("/").split("/")
        assert parts[:3] == ["v1", "projects", "default"], parts
        collection = parts[3]
        name = parts[4] if len(parts) > 4 else None
        sub = parts[5] if len(parts) > 5 else None
        if collection == "agents":
            assert request.method == "PUT"
            created = name not in self.agents
            self.agents[name] = body
            return httpx.Response(201 if created else 200, json=body)
        if collection == "agentgroups":
            return self._groups(request.method, name, sub, body)
        assert collection == "agentruns", collection
        return self._agentruns(request, name, sub, params, body)

    def _groups(self, method: str, name: str | None, sub: str | None, body: Any) -> httpx.Response:
        if name is None:
            assert method == "POST"
            try:
                resource = parse_resource(body, expected_kind="AgentGroup").model_dump(mode="json")
            except errors.Invalid as exc:
                return _error(422, exc.code, exc.message, **exc.details)
            name = resource["metadata"]["name"]
            if name in self.groups:
                return _error(409, "AlreadyExists", f"agentgroup {name} exists", kind="AgentGroup", name=name)
            resource["metadata"]["uid"] = str(uuid.uuid4())
            resource["status"] = {"phase": "Running", "counts": {}}
            self.groups[name] = resource
            return httpx.Response(201, json=self._group_status(name))
        if name not in self.groups:
            return _error(404, "NotFound", f"agentgroup {name} not found", kind="AgentGroup", name=name)
        if method == "GET":
            self.tick += 1
            return httpx.Response(200, json=self._group_status(name))
        if method == "PATCH":
            self.groups[name]["spec"].update(body["spec"])
            return httpx.Response(200, json=self._group_status(name))
        if method == "POST" and sub == "cancel":
            self.groups[name]["spec"]["state"] = "Cancelled"
            return httpx.Response(200, json=self._group_status(name))
        if method == "DELETE":
            if self.delete_fails:
                return _error(503, "Unavailable", "the control plane is restarting")
            self.deleted.append(name)
            for run in self._members(name):
                del self.runs[run["metadata"]["name"]]
            return httpx.Response(200, json=self.groups.pop(name))
        raise AssertionError((method, name, sub))

    def _agentruns(
        self, request: httpx.Request, name: str | None, sub: str | None, params: dict[str, str], body: Any
    ) -> httpx.Response:
        if name is None and request.method == "GET":
            self.tick += 1
            items = self._members(params["group"])
            return httpx.Response(200, json={"kind": "AgentRunList", "items": items})
        if name is None and request.method == "POST":
            return self._create_batch(request.headers["Idempotency-Key"], body)
        if name not in self.runs:
            return _error(404, "NotFound", f"agentrun {name} not found", kind="AgentRun", name=name)
        run = self.runs[name]
        self._run_status(name)
        if sub == "answer":
            if run["status"]["phase"] != "Succeeded":
                return _error(409, "AnswerNotReady", f"agentrun {name} has no answer yet")
            return httpx.Response(
                200, json={"name": name, "phase": "Succeeded", "answer": f"answer: {run['spec']['input']}"}
            )
        assert sub is None and request.method == "GET"
        return httpx.Response(200, json=run)

    def _create_batch(self, key: str, body: Any) -> httpx.Response:
        self.batch_keys.append(key)
        if key in self.batches:
            return httpx.Response(201, json={"kind": "AgentRunList", "items": self.batches[key]})
        try:
            parsed = parse_run_list(body)
        except errors.Invalid as exc:
            return _error(422, exc.code, exc.message, **exc.details)
        known: set[str] = set()
        for run in parsed:
            group = run.spec.group
            if group not in self.groups:
                return _error(404, "NotFound", f"agentgroup {group} not found")
            if self.groups[group]["spec"]["sealed"]:
                return _error(409, "GroupSealed", f"agentgroup {group} is sealed")
            keys = {r["spec"]["taskKey"] for r in self.runs.values() if r["spec"]["group"] == group} | known
            for dep in run.spec.dependsOn or []:
                if dep not in keys:
                    return _error(422, "Invalid", f"dependency {dep} is not in the group", field="dependsOn")
            if run.metadata.name in self.runs:
                return _error(409, "AlreadyExists", f"agentrun {run.metadata.name} exists")
            known.add(run.spec.taskKey)
        created = []
        for run in parsed:
            resource = run.model_dump(mode="json")
            resource["status"] = {"phase": "Pending", "reason": None, "message": None}
            self.runs[run.metadata.name] = resource
            self.born[run.metadata.name] = self.tick
            created.append(resource)
        self.batches[key] = created
        return httpx.Response(201, json={"kind": "AgentRunList", "items": created})


@pytest.fixture()
def api() -> FakeGroupsAPI:
    return FakeGroupsAPI()


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handles_module, "_POLL_MAX_DELAY", 0.001)  # the handles' waits
    monkeypatch.setattr(agent_map_module, "_POLL_MAX_DELAY", 0.001)  # Agent.map's poll of the group


def make_group(api: FakeGroupsAPI, name: str = "g", **kwargs: Any) -> nodus.AgentGroup:
    group = nodus.AgentGroup.create(name, "helper", client=api.client(), **kwargs)
    api.requests.clear()
    return group


# -- create ------------------------------------------------------------------------------------


def test_create_deploys_the_agent_and_sends_the_limits(api: FakeGroupsAPI) -> None:
    agent = nodus.ClaudeAgent("helper", system="Be brief.", client=api.client())
    group = nodus.AgentGroup.create("batch", agent, max_active=2, max_pending=50, max_cost=0.6)
    assert group.name == "batch" and group.agent == "helper"
    assert api.writes() == [
        ("PUT", "/v1/projects/default/agents/helper"),
        ("POST", "/v1/projects/default/agentgroups"),
    ]
    sent = api.requests[1][3]
    assert sent["spec"] == {
        "agent": "helper",
        "limits": {"maxActive": 2, "maxPending": 50},
        "maxCostUSD": "0.6",
    }
    assert "AgentGroup(name='batch', project='default'" in repr(group)
    again = nodus.AgentGroup.from_name("batch", client=api.client())
    assert again.name == "batch" and again.status().status.phase == "Running"
    with pytest.raises(errors.Conflict):
        nodus.AgentGroup.create("batch", "helper", client=api.client())


def test_create_unsupported_settings_send_nothing(api: FakeGroupsAPI) -> None:
    agent = nodus.ClaudeAgent("helper", client=api.client())
    with pytest.raises(errors.Unsupported) as caught:
        nodus.AgentGroup.create("g", agent, max_held=2)
    assert caught.value.details["field"] == "max_held"
    assert api.requests == []


def test_create_an_evaluation_sends_it_as_written(api: FakeGroupsAPI) -> None:
    api.agents["helper"] = {"metadata": {"name": "helper"}}
    evaluation = {
        "environment": "nodus/arithmetic-v2@2.0.0",
        "split": "test",
        "tasks": 2,
        "repetitions": 1,
        "seed": 42,
        "timeout": "10m",
    }
    nodus.AgentGroup.create(
        "parallel-agents-eval",
        "helper",
        max_active=2,
        max_cost="0.20",
        evaluation=evaluation,
        client=api.client(),
    )
    sent = next(body for method, path, _, body, _ in api.requests if method == "POST")
    assert sent["spec"]["evaluation"] == evaluation


@pytest.mark.parametrize(
    "evaluation, field",
    [
        ({"environment": "nodus/arithmetic-v2", "tasks": 2}, "spec.evaluation.environment"),
        ({"environment": "nodus/arithmetic-v2@2.0.0", "tasks": True}, "evaluation.tasks"),
        ({"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 60, "repetitions": 2}, "spec.evaluation"),
        (
            {"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 2, "timeout": "2d"},
            "spec.evaluation.timeout",
        ),
        ("nodus/arithmetic-v2@2.0.0", "evaluation"),
    ],
)
def test_a_bad_evaluation_is_refused_before_anything_is_sent(
    api: FakeGroupsAPI, evaluation: Any, field: str
) -> None:
    with pytest.raises(errors.Invalid) as caught:
        nodus.AgentGroup.create("g", "helper", evaluation=evaluation, client=api.client())
    assert caught.value.details["field"] == field
    assert api.requests == []


@pytest.mark.parametrize(
    "kwargs", [{"max_active": 0}, {"max_active": True}, {"max_pending": 1.5}, {"max_cost": "lots"}]
)
def test_create_invalid_limits_send_nothing(api: FakeGroupsAPI, kwargs: dict[str, Any]) -> None:
    agent = nodus.ClaudeAgent("helper", client=api.client())
    with pytest.raises(errors.Invalid):
        nodus.AgentGroup.create("g", agent, **kwargs)
    with pytest.raises(errors.Invalid):
        nodus.AgentGroup.create("Not_A_Label", agent)
    assert api.requests == []


def test_results_reads_the_cases_with_snake_case_names() -> None:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(
            200,
            json={
                "kind": "EvaluationResultList",
                "evaluation": {"passRate": 0.5},
                "items": [
                    {
                        "taskId": "test-000",
                        "repetition": 1,
                        "run": "e-test-000",
                        "state": "Scored",
                        "verdict": "pass",
                        "reward": 1.0,
                        "evidence": "ok",
                    },
                    {
                        "taskId": "test-001",
                        "repetition": 1,
                        "run": "e-test-001",
                        "state": "RunFailed",
                        "verdict": None,
                        "reward": None,
                        "evidence": "",
                    },
                ],
            },
        )

    client = Client(api_url="http://nodus.test", project="default", transport=httpx.MockTransport(handle))
    results = nodus.AgentGroup("e", client=client).results()
    assert seen == ["/v1/projects/default/agentgroups/e/results"]
    assert [(r.task_id, r.state, r.get("verdict")) for r in results] == [
        ("test-000", "Scored", "pass"),
        ("test-001", "RunFailed", None),
    ]


# -- submit_many -------------------------------------------------------------------------------


def test_submit_many_sends_dependencies_first_and_returns_the_callers_order(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    runs = group.submit_many(
        [
            {"key": "c", "input": "both", "depends_on": ["a", "b"]},
            {"key": "a", "input": "first"},
            {"key": "b", "input": {"n": 2}, "depends_on": ["a"]},
            {"key": "d"},
        ]
    )
    assert [run.name for run in runs] == ["g-c", "g-a", "g-b", "g-d"]
    (batch,) = api.batch_posts()
    assert [item["spec"]["taskKey"] for item in batch] == ["a", "b", "c", "d"]
    assert batch[2]["spec"]["dependsOn"] == ["a", "b"]
    assert batch[1]["spec"]["input"] == '{"n": 2}' and batch[3]["spec"]["input"] == ""
    assert all(item["spec"]["agent"] == "helper" and item["spec"]["group"] == "g" for item in batch)


def test_submit_many_without_dependencies_keeps_the_callers_order(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    keys = ["z", "m", "a", "q"]
    group.submit_many([{"key": key, "input": key} for key in keys])
    assert [item["spec"]["taskKey"] for item in api.batch_posts()[0]] == keys


def test_submit_many_batches_by_100_with_stable_idempotency_keys(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    # A chain against the caller's order: k000 waits on k001, ..., k248 on k249.
    tasks = [
        {"key": f"k{i:03d}", "input": str(i), **({"depends_on": [f"k{i + 1:03d}"]} if i < 249 else {})}
        for i in range(250)
    ]
    runs = group.submit_many(tasks)
    assert [run.name for run in runs] == [f"g-k{i:03d}" for i in range(250)]
    batches = api.batch_posts()
    assert [len(batch) for batch in batches] == [100, 100, 50]
    sent = [item["spec"]["taskKey"] for batch in batches for item in batch]
    assert sent == [f"k{i:03d}" for i in reversed(range(250))]
    first_keys = list(api.batch_keys)
    assert len(set(first_keys)) == 3
    assert len(api.runs) == 250

    # The same call again (a retry after a lost answer) sends the same keys and creates nothing.
    again = group.submit_many(tasks)
    assert api.batch_keys[3:] == first_keys
    assert len(api.runs) == 250
    assert [run.name for run in again] == [run.name for run in runs]


def test_idempotency_keys_differ_for_a_recreated_group(api: FakeGroupsAPI) -> None:
    tasks = [{"key": "a", "input": "x"}]
    make_group(api).submit_many(tasks)
    nodus.AgentGroup("g", client=api.client()).delete()
    make_group(api)
    nodus.AgentGroup("g", client=api.client()).submit_many(tasks)  # a handle that learns the uid
    assert len(api.batch_keys) == 2 and api.batch_keys[0] != api.batch_keys[1]
    assert "g-a" in api.runs


def test_submit_many_may_depend_on_an_earlier_call(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    group.submit_many([{"key": "a", "input": "x"}])
    (run,) = group.submit_many([{"key": "b", "input": "y", "depends_on": ["a"]}])
    assert run.name == "g-b" and api.runs["g-b"]["spec"]["dependsOn"] == ["a"]
    with pytest.raises(errors.Invalid, match="dependency nope"):  # the server's refusal comes back
        group.submit_many([{"key": "c", "depends_on": ["nope"]}])


@pytest.mark.parametrize(
    "tasks, message",
    [
        (
            [{"key": "a", "depends_on": ["b"]}, {"key": "b", "depends_on": ["a"]}],
            "dependency cycle: a -> b -> a",
        ),
        (
            [
                {"key": "x"},
                {"key": "a", "depends_on": ["c"]},
                {"key": "b", "depends_on": ["a"]},
                {"key": "c", "depends_on": ["b", "x"]},
            ],
            "dependency cycle: a -> c -> b -> a",
        ),
        ([{"key": "a", "depends_on": ["a"]}], "dependency cycle: a -> a"),
        (
            [
                {"key": "d", "depends_on": ["a"]},
                {"key": "a", "depends_on": ["b"]},
                {"key": "b", "depends_on": ["a"]},
            ],
            "dependency cycle: a -> b -> a",
        ),
        ([{"key": "a"}, {"key": "b"}, {"key": "a"}], "task key 'a' is repeated"),
        ([{"key": "a", "prompt": "x"}], "unknown field 'prompt'"),
        ([{"input": "x"}], "has no key"),
        ([{"key": "Bad_Key"}], "not a DNS label"),
        ([{"key": "a", "depends_on": "b"}], "must be a list of task keys"),
        ([{"key": "a", "depends_on": ["B!"]}], "not a DNS label"),
        (["a"], "must be a dict"),
        ([{"key": "k" * 62}], "longer than 63 characters"),
    ],
)
def test_submit_many_refusals_send_nothing(api: FakeGroupsAPI, tasks: list[Any], message: str) -> None:
    group = nodus.AgentGroup(
        {"metadata": {"name": "g", "uid": "u1"}, "spec": {"agent": "helper"}}, client=api.client()
    )
    with pytest.raises(errors.Invalid, match=re.escape(message)) as caught:
        group.submit_many(tasks)
    assert not isinstance(caught.value, errors.Unsupported)
    assert api.requests == []


def test_submit_many_refusals_name_the_field(api: FakeGroupsAPI) -> None:
    group = nodus.AgentGroup("g", client=api.client())
    with pytest.raises(errors.Invalid) as caught:
        group.submit_many([{"key": "a"}, {"key": "a"}])
    assert caught.value.details == {"field": "tasks[1].key", "key": "a"}
    with pytest.raises(errors.Invalid) as caught:
        group.submit_many([{"key": "a", "inputs": "x"}])
    assert caught.value.details["field"] == "tasks[0].inputs"
    with pytest.raises(errors.Invalid) as caught:
        group.submit_many([{"key": "a", "depends_on": ["b"]}, {"key": "b", "depends_on": ["a"]}])
    assert caught.value.details["cycle"] == ["a", "b", "a"]
    assert group.submit_many([]) == []
    assert api.requests == []


# -- seal, wait, runs, cancel, delete ----------------------------------------------------------


def test_wait_returns_the_status_when_the_group_succeeds(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    api.default_ticks = 3
    group.submit_many([{"key": "a", "input": "x"}, {"key": "b", "input": "y", "depends_on": ["a"]}])
    group.seal()
    assert api.requests[-1][3] == {"spec": {"sealed": True}}
    status = group.wait(timeout=5)
    assert status.phase == "Succeeded"
    assert (status.counts.succeeded, status.counts.total) == (2, 2)
    runs = group.runs()
    assert [run.name for run in runs] == ["g-a", "g-b"]
    assert [run.answer() for run in runs] == ["answer: x", "answer: y"]
    group.delete()
    assert api.deleted == ["g"] and api.runs == {}


def test_wait_returns_a_failed_status_without_raising(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    api.plan["b"] = (2, "Failed", "ModelError", "boom")
    group.submit_many([{"key": "a", "input": "x"}, {"key": "b", "input": "y"}])
    group.seal()
    status = group.wait()
    assert status.phase == "Failed"
    assert (status.counts.succeeded, status.counts.failed) == (1, 1)


def test_wait_times_out_on_an_unsealed_group(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    group.submit_many([{"key": "a", "input": "x"}])
    with pytest.raises(errors.WaitTimeout, match="not sealed") as caught:
        group.wait(timeout=0.05)
    assert caught.value.details == {"name": "g", "phase": "Running"}


def test_wait_rides_out_an_unreachable_api(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    group.submit_many([{"key": "a", "input": "x"}])
    group.seal()
    api.unavailable = 2
    assert group.wait(timeout=5).phase == "Succeeded"


def test_cancel_ends_the_group_cancelled(api: FakeGroupsAPI) -> None:
    group = make_group(api)
    api.default_ticks = 1000
    group.submit_many([{"key": "a", "input": "x"}])
    group.cancel()
    assert api.writes()[-1] == ("POST", "/v1/projects/default/agentgroups/g/cancel")
    assert group.wait(timeout=5).phase == "Cancelled"


# -- Agent.map ---------------------------------------------------------------------------------


def map_agent(api: FakeGroupsAPI) -> nodus.Agent:
    return nodus.ClaudeAgent("helper", system="Be brief.", client=api.client())


def only_group_name(api: FakeGroupsAPI) -> str:
    names = {
        body["metadata"]["name"]
        for method, path, _, body, _ in api.requests
        if method == "POST" and path.endswith("/agentgroups")
    }
    assert len(names) == 1
    return names.pop()


def test_map_yields_answers_in_input_order_and_deletes_the_group(api: FakeGroupsAPI) -> None:
    api.plan.update(
        {
            "t0": (3, "Succeeded", None, None),
            "t1": (2, "Succeeded", None, None),
            "t2": (1, "Succeeded", None, None),
        }
    )
    answers = list(map_agent(api).map(["q0", "q1", "q2"], max_active=2))
    assert answers == ["answer: q0", "answer: q1", "answer: q2"]
    name = only_group_name(api)
    assert re.fullmatch(r"helper-map-[0-9a-f]{8}", name)
    assert api.deleted == [name] and api.groups == {} and api.runs == {}
    posted = next(
        body
        for method, path, _, body, _ in api.requests
        if method == "POST" and path.endswith("/agentgroups")
    )
    assert posted["spec"]["limits"] == {"maxActive": 2}
    writes = api.writes()
    assert writes[0] == ("PUT", "/v1/projects/default/agents/helper")  # deployed first
    assert ("PATCH", f"/v1/projects/default/agentgroups/{name}") in writes  # sealed
    # One list call per poll: no run is fetched on its own, only answers.
    for method, path, params, _, _ in api.requests:
        if method == "GET" and "/agentruns" in path:
            assert params == {"group": name} or path.endswith("/answer")


def test_map_out_of_order_yields_as_runs_finish(api: FakeGroupsAPI) -> None:
    api.plan.update(
        {
            "t0": (3, "Succeeded", None, None),
            "t1": (1, "Succeeded", None, None),
            "t2": (2, "Succeeded", None, None),
        }
    )
    answers = list(map_agent(api).map(["q0", "q1", "q2"], order_outputs=False))
    assert answers == ["answer: q1", "answer: q2", "answer: q0"]
    assert len(api.deleted) == 1


def test_map_zero_pads_the_task_keys(api: FakeGroupsAPI) -> None:
    answers = list(map_agent(api).map(f"q{i}" for i in range(12)))
    assert answers == [f"answer: q{i}" for i in range(12)]
    (batch,) = api.batch_posts()
    assert [item["spec"]["taskKey"] for item in batch] == [f"t{i:02d}" for i in range(12)]


def test_map_raises_for_a_failed_run_and_still_deletes(api: FakeGroupsAPI) -> None:
    api.plan["t1"] = (1, "Failed", "ModelError", "boom")
    seen: list[str] = []
    with pytest.raises(errors.AgentRunFailed) as caught:
        for answer in map_agent(api).map(["q0", "q1", "q2"]):
            seen.append(answer)
    assert seen == ["answer: q0"]
    name = only_group_name(api)
    assert caught.value.details == {
        "name": f"{name}-t1",
        "phase": "Failed",
        "reason": "ModelError",
        "message": "boom",
    }
    assert str(caught.value) == f"agentrun/{name}-t1 ended Failed (ModelError): boom"
    assert api.deleted == [name]


def test_map_return_exceptions_yields_the_failure_in_place(api: FakeGroupsAPI) -> None:
    api.plan["t1"] = (1, "Failed", "ModelError", "boom")
    api.plan["t2"] = (1, "Waiting", "MaxCostReached", "the run reached its cost cap")
    answers = list(map_agent(api).map(["q0", "q1", "q2"], return_exceptions=True))
    assert answers[0] == "answer: q0"
    assert isinstance(answers[1], errors.AgentRunFailed) and answers[1].details["phase"] == "Failed"
    assert isinstance(answers[2], errors.AgentRunFailed)
    assert answers[2].details["reason"] == "MaxCostReached"
    assert len(api.deleted) == 1


def test_map_deletes_the_group_when_the_caller_breaks(api: FakeGroupsAPI) -> None:
    api.plan["t1"] = (10_000, "Succeeded", None, None)  # still running when the loop stops
    for answer in map_agent(api).map(["q0", "q1"], order_outputs=False):
        assert answer == "answer: q0"
        break
    name = only_group_name(api)
    assert api.deleted == [name] and api.runs == {}


def test_map_close_and_with_delete_the_group(api: FakeGroupsAPI) -> None:
    api.default_ticks = 10_000
    results = map_agent(api).map(["q0"])
    results.close()  # never started: nothing was created, nothing to delete
    assert api.requests == []
    api.plan["t0"] = (1, "Succeeded", None, None)
    with map_agent(api).map(["q0", "q1"]) as results:
        assert next(results) == "answer: q0"
        assert api.deleted == []
    assert len(api.deleted) == 1


def test_map_failed_delete_warns_without_hiding_the_failure(api: FakeGroupsAPI) -> None:
    api.plan["t0"] = (1, "Failed", "ModelError", "boom")
    api.delete_fails = True
    with pytest.warns(RuntimeWarning, match="could not delete agentgroup/helper-map-"):
        with pytest.raises(errors.AgentRunFailed):
            list(map_agent(api).map(["q0"]))


def test_map_with_no_inputs_creates_nothing(api: FakeGroupsAPI) -> None:
    assert list(map_agent(api).map([])) == []
    assert list(map_agent(api).map(iter(()))) == []
    assert api.requests == []


def test_map_refuses_bad_settings_before_sending(api: FakeGroupsAPI) -> None:
    with pytest.raises(errors.Invalid):
        map_agent(api).map(["q"], max_active=0)
    with pytest.raises(errors.PayloadTooLarge, match=re.escape("inputs[1]")):
        map_agent(api).map(["q", "x" * (256 * 1024 + 1)])
    with pytest.raises(errors.Invalid, match="JSON"):
        map_agent(api).map([object()])
    assert api.requests == []


def test_map_group_name_leaves_room_for_the_keys(api: FakeGroupsAPI) -> None:
    agent = nodus.ClaudeAgent("a" * 63, client=api.client())
    assert list(agent.map(["q"] * 11)) == ["answer: q"] * 11
    names = [f"{item['spec']['group']}-{item['spec']['taskKey']}" for item in api.batch_posts()[0]]
    assert re.fullmatch(r"a+-map-[0-9a-f]{8}-t10", names[-1]) and len(names[-1]) == 63
    assert all(name in api.born for name in names)


def test_map_supports_async_for(api: FakeGroupsAPI) -> None:
    api.plan.update({"t0": (2, "Succeeded", None, None), "t1": (1, "Succeeded", None, None)})

    async def collect() -> list[str]:
        return [answer async for answer in map_agent(api).map(["q0", "q1"])]

    assert asyncio.run(collect()) == ["answer: q0", "answer: q1"]
    assert len(api.deleted) == 1

    async def first() -> str:
        async with map_agent(api).map(["q0", "q1"]) as results:
            async for answer in results:
                return answer
        raise AssertionError("no answer")

    api.plan["t1"] = (10_000, "Succeeded", None, None)
    assert asyncio.run(first()) == "answer: q0"
    assert len(api.deleted) == 2


def test_map_rides_out_an_unreachable_api(api: FakeGroupsAPI) -> None:
    api.plan["t1"] = (5, "Succeeded", None, None)
    results = map_agent(api).map(["q0", "q1"])
    first = next(results)
    api.unavailable = 2
    assert [first, *results] == ["answer: q0", "answer: q1"]


def test_map_shows_progress_only_on_a_terminal(api: FakeGroupsAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert list(map_agent(api).map(["q0", "q1"])) == ["answer: q0", "answer: q1"]
    assert "helper map" in terminal.getvalue()
    assert "2/2" in terminal.getvalue()
