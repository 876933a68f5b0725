"""Bad input gets one clear refusal naming the problem, and loses nothing already accepted."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from .conftest import NODUS, PORT, Server, unique

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"


def agent(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": name}, "spec": spec}


def run(name: str, agent_name: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"agent": agent_name, "input": "What is 2 + 2?", **spec},
    }


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({**agent("a1"), "apiVersion": "v9"}, 422, "apiVersion"),
        ({**agent("a1"), "kind": "Pod"}, 422, "kind"),
        (agent("Not_A_Label"), 422, "metadata.name"),
        (agent("a1", perRunMaxCostUSD="lots"), 422, "spec.perRunMaxCostUSD"),
        (agent("a1", maxToolCalls="fifty"), 422, "spec.maxToolCalls"),
        (agent("a1", unknownThing=True), 422, "spec.unknownThing"),
    ],
)
def test_agent_refusals(server: Server, body: dict[str, object], status: int, field: str) -> None:
    with server.http() as http:
        response = http.post(AGENTS, json=body)
    assert response.status_code == status
    error = response.json()
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == "Invalid"
    assert error["details"]["field"] == field


def test_unreadable_bodies_are_400_json(server: Server) -> None:
    with server.http() as http:
        for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
            response = http.post(AGENTS, content=raw, headers={"content-type": "application/json"})
            assert response.status_code == 400
            assert response.json()["code"] == "Invalid"


def test_run_refusals(server: Server) -> None:
    name = unique("agent")
    with server.http() as http:
        assert http.put(f"{AGENTS}/{name}", json=agent(name)).status_code == 201
        too_big = http.post(RUNS, json=run(unique("r"), name, input="x" * (256 * 1024 + 1)))
        assert too_big.status_code == 413 and too_big.json()["details"]["field"] == "spec.input"
        missing_agent = http.post(RUNS, json=run(unique("r"), "no-such-agent"))
        assert missing_agent.status_code == 404
        assert missing_agent.json()["details"]["field"] == "spec.agent"
        assert http.get(f"{RUNS}/no-such-run").status_code == 404
        assert http.get(f"{RUNS}/no-such-run/steps").json()["code"] == "NotFound"
        assert http.post(f"{RUNS}/no-such-run/cancel").status_code == 404
        bad_deadline = http.post(RUNS, json=run(unique("r"), name, deadline="tomorrow"))
        assert bad_deadline.json()["details"]["field"] == "spec.deadline"
        bad_project = http.get("/v1/projects/Bad_Project/agents")
        assert bad_project.status_code == 422 and bad_project.json()["details"]["field"] == "project"


def test_a_refused_change_leaves_the_accepted_resource_untouched(server: Server) -> None:
    name = unique("agent")
    with server.http() as http:
        first = http.put(f"{AGENTS}/{name}", json=agent(name, system="v1"))
        assert first.status_code == 201
        refused = http.put(f"{AGENTS}/{name}", json=agent(name, system="v2", perRunMaxCostUSD="free"))
        assert refused.status_code == 422
        current = http.get(f"{AGENTS}/{name}").json()
        assert current["spec"]["system"] == "v1"
        assert current["status"]["revision"] == 1
        duplicate = http.post(AGENTS, json=agent(name, system="v3"))
        assert duplicate.status_code == 409 and duplicate.json()["code"] == "AlreadyExists"
        assert http.get(f"{AGENTS}/{name}").json()["spec"]["system"] == "v1"


def test_revisions_and_pinning(server: Server) -> None:
    name = unique("agent")
    with server.http() as http:
        http.put(f"{AGENTS}/{name}", json=agent(name, system="first"))
        early = http.post(RUNS, json=run(unique("r"), name)).json()
        changed = http.put(f"{AGENTS}/{name}", json=agent(name, system="second"))
        assert changed.status_code == 200 and changed.json()["status"]["revision"] == 2
        unchanged = http.put(f"{AGENTS}/{name}", json=agent(name, system="second"))
        assert unchanged.json()["status"]["revision"] == 2
        late = http.post(RUNS, json=run(unique("r"), name)).json()
        patched = http.patch(f"{AGENTS}/{name}", json={"spec": {"maxToolCalls": 7}})
        assert patched.status_code == 200
        assert patched.json()["status"]["revision"] == 3
        assert patched.json()["spec"]["system"] == "second"
    assert early["status"]["phase"] == "Pending"
    assert early["status"]["agentRevision"] == 1
    assert late["status"]["agentRevision"] == 2


def test_a_stopped_agent_refuses_runs(server: Server) -> None:
    name = unique("agent")
    with server.http() as http:
        http.put(f"{AGENTS}/{name}", json=agent(name, state="Stopped"))
        refused = http.post(RUNS, json=run(unique("r"), name))
        assert refused.status_code == 409
        assert refused.json()["code"] == "AgentStopped"


def test_the_same_run_applied_twice_is_one_run(server: Server) -> None:
    agent_name, run_name = unique("agent"), unique("r")
    with server.http() as http:
        http.put(f"{AGENTS}/{agent_name}", json=agent(agent_name))
        assert http.put(f"{RUNS}/{run_name}", json=run(run_name, agent_name)).status_code == 201
        assert http.put(f"{RUNS}/{run_name}", json=run(run_name, agent_name)).status_code == 200
        changed = http.put(f"{RUNS}/{run_name}", json=run(run_name, agent_name, input="different"))
        assert changed.status_code == 409
        names = [r["metadata"]["name"] for r in http.get(RUNS).json()["items"]]
        assert names.count(run_name) == 1


def test_openapi_and_probes(server: Server) -> None:
    with server.http() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz").json()
        assert ready["status"] == "ready" and ready["modelBackend"] == "offline"
        paths = http.get("/openapi.json").json()["paths"]
        assert "/v1/projects/{project}/agentruns/{name}/steps" in paths


def test_cli_refusals_are_one_line_without_traceback(server: Server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: [unclosed\n")
    good_then_bad = tmp_path / "two.yaml"
    first = unique("agent")
    good_then_bad.write_text(
        json.dumps(agent(first)) + "\n---\n" + json.dumps({**agent("second"), "kind": "Gizmo"}) + "\n"
    )
    cases = [
        server.cli("apply", "-f", str(bad_yaml)),
        server.cli("apply", "-f", str(good_then_bad)),
        server.cli("apply", "-f", str(tmp_path / "missing.yaml")),
        server.cli("get", "agentrun/does-not-exist"),
        server.cli("create", "agentrun", "x1", "--agent", "no-such-agent", "--prompt", "hi"),
        server.cli("get", "gizmos"),
    ]
    for result in cases:
        assert result.returncode != 0
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Gizmo" in cases[1].stderr
    # The valid first document was not applied: the file was refused as a whole.
    with server.http() as http:
        assert http.get(f"{AGENTS}/{first}").status_code == 404


def test_unknown_routes_and_methods_answer_json(server: Server) -> None:
    with server.http() as http:
        missing = http.get("/v1/nowhere")
        assert missing.status_code == 404 and missing.json()["code"] == "NotFound"
        wrong = http.patch(f"{RUNS}/whatever", json={})
        assert wrong.status_code == 405 and wrong.json()["code"] == "MethodNotAllowed"


def test_nodus_up_refuses_to_change_a_running_servers_settings(server: Server) -> None:
    again = subprocess.run(
        [NODUS, "up", "--port", str(PORT)],
        env={**server.env, "NODUS_OFFLINE_LATENCY": "7"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert again.returncode != 0
    assert "offline_latency_seconds" in again.stderr and "nodus down" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    bad = subprocess.run(
        [NODUS, "up", "--port", str(PORT)],
        env={**server.env, "NODUS_OFFLINE_LATENCY": "soon"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert bad.returncode != 0 and "NODUS_OFFLINE_LATENCY" in bad.stderr
    # The running server is untouched.
    with server.http() as http:
        assert http.get("/readyz").status_code == 200


# -- nesting, size, merge patches, strict types, under every role's token ---------------------

GROUPS = "/v1/projects/default/agentgroups"
DEEP_BODIES = {
    "100k-brackets": b"[" * 100_000,
    "50k-objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "33-levels": b"[" * 33 + b"]" * 33,
    "nan": b'{"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "x"}, "spec": {"a": NaN}}',
}


def _role_token(server: Server, role: str) -> str:
    with server.http() as http:
        created = http.post(
            "/v1/projects/default/tokens",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Token",
                "metadata": {"name": unique(role)},
                "spec": {"role": role},
            },
        )
    assert created.status_code == 201, created.text
    return str(created.json()["status"]["token"])


def _refusal(response: httpx.Response, status: int | None = None) -> dict[str, object]:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    if status is not None:
        assert response.status_code == status, response.text[:300]
    body = response.json()
    assert set(body) == {"code", "message", "details"}
    return dict(body)


def test_deep_huge_and_malformed_bodies_are_4xx_json_under_every_role(server: Server) -> None:
    name, group = unique("agent"), unique("g")
    with server.http() as http:
        assert http.put(f"{AGENTS}/{name}", json=agent(name, system="keep me")).status_code == 201
        group_doc = {
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentGroup",
            "metadata": {"name": group},
            "spec": {"agent": name},
        }
        assert http.put(f"{GROUPS}/{group}", json=group_doc).status_code == 201
        before = http.get(f"{AGENTS}/{name}").json()
    routes = [
        ("POST", RUNS),
        ("PATCH", f"{AGENTS}/{name}"),
        ("PUT", f"{AGENTS}/{name}"),
        ("PATCH", f"{GROUPS}/{group}"),
        ("POST", f"{RUNS}/{unique('r')}/messages"),
        ("POST", "/v1/projects/default/secrets"),
        ("POST", "/v1/projects/default/tokens"),
        ("POST", "/v1/projects/default/credits"),
    ]
    tokens = {role: _role_token(server, role) for role in ("read", "write", "admin")}
    tokens["operator"] = server.token
    bodies = {
        **DEEP_BODIES,
        "over-1MiB": b" " * (1024 * 1024 + 1),
        "not-utf8": b"\xff\xfe{",
        "a-list": b"[1]",
    }
    for role, token in tokens.items():
        with server.http(token) as http:
            for method, path in routes:
                for label, content in bodies.items():
                    answer = http.request(
                        method, path, content=content, headers={"content-type": "application/json"}
                    )
                    _refusal(answer)
                    if answer.status_code not in (401, 403):
                        expected = 413 if label == "over-1MiB" else 400
                        assert answer.status_code == expected, (role, method, path, label, answer.text[:200])
    with server.http() as http:
        after = http.get(f"{AGENTS}/{name}").json()
        assert after["spec"] == before["spec"] and after["status"]["revision"] == before["status"]["revision"]
        assert http.get("/readyz").status_code == 200
        assert http.delete(f"{GROUPS}/{group}").status_code == 200


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"spec": None}, "spec"),
        ({"spec": {"system": None}}, "spec.system"),
        ({"spec": {"perRunMaxCostUSD": None}}, "spec.perRunMaxCostUSD"),
        ({"metadata": None}, "metadata"),
        ({"spec": {"maxTokens": "100"}}, "spec.maxTokens"),
        ({"spec": {"maxToolCalls": True}}, "spec.maxToolCalls"),
    ],
)
def test_a_patch_that_removes_what_an_agent_needs_is_refused(
    server: Server, patch: dict[str, object], field: str
) -> None:
    name = unique("agent")
    with server.http() as http:
        created = http.put(f"{AGENTS}/{name}", json=agent(name, system="keep me", perRunMaxCostUSD="5.00"))
        assert created.status_code == 201
        refused = http.patch(f"{AGENTS}/{name}", json=patch)
        assert _refusal(refused, 422)["details"]["field"] == field  # type: ignore[index]
        current = http.get(f"{AGENTS}/{name}").json()
        assert current["spec"]["system"] == "keep me" and current["spec"]["perRunMaxCostUSD"] == "5.00"
        assert current["status"]["revision"] == 1  # no new revision
        removable = http.patch(
            f"{AGENTS}/{name}", json={"metadata": {"labels": {"a": None}}, "spec": {"image": None}}
        )
        assert removable.status_code == 200 and removable.json()["spec"]["system"] == "keep me"


def test_a_patch_that_removes_what_a_group_needs_is_refused(server: Server) -> None:
    name, group = unique("agent"), unique("g")
    with server.http() as http:
        http.put(f"{AGENTS}/{name}", json=agent(name))
        doc = {
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentGroup",
            "metadata": {"name": group},
            "spec": {"agent": name, "limits": {"maxActive": 3}},
        }
        assert http.put(f"{GROUPS}/{group}", json=doc).status_code == 201
        for patch, field in (
            ({"spec": None}, "spec"),
            ({"spec": {"agent": None}}, "spec.agent"),
            ({"spec": {"limits": None}}, "spec.limits"),
            ({"spec": {"sealed": "yes"}}, "spec.sealed"),
            ({"spec": {"limits": {"maxActive": "4"}}}, "spec.limits.maxActive"),
        ):
            assert _refusal(http.patch(f"{GROUPS}/{group}", json=patch), 422)["details"]["field"] == field  # type: ignore[index]
        current = http.get(f"{GROUPS}/{group}").json()
        assert current["spec"]["limits"]["maxActive"] == 3 and current["spec"]["sealed"] is False
        assert http.delete(f"{GROUPS}/{group}").status_code == 200


def test_a_string_is_not_a_boolean(server: Server) -> None:
    name, run_name = unique("agent"), unique("r")
    with server.http() as http:
        http.put(f"{AGENTS}/{name}", json=agent(name))
        refused = http.post(RUNS, json=run(run_name, name, keepAlive="yes"))
        assert _refusal(refused, 422)["details"]["field"] == "spec.keepAlive"  # type: ignore[index]
        assert http.get(f"{RUNS}/{run_name}").status_code == 404  # nothing was created


def test_deep_and_exploding_yaml_is_one_cli_line(server: Server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    deep = tmp_path / "deep.yaml"
    deep.write_text(
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: deep}\nspec: "
        + "[" * 100_000
        + "]" * 100_000
        + "\n"
    )
    laughs = [
        "apiVersion: nodus.dev/v1",
        "kind: Agent",
        "metadata: {name: laughs}",
        "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]",
    ]
    laughs += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join([*laughs, "spec: {system: *a8}"]) + "\n")
    for path, words in ((deep, "nested more than"), (bomb, "aliases")):
        result = server.cli("apply", "-f", str(path))
        assert result.returncode != 0
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr
    deep_patch = server.cli("patch", "agent/deep", "--patch", "[" * 100_000)
    assert deep_patch.returncode != 0 and "Traceback" not in deep_patch.stderr
    assert len(deep_patch.stderr.strip().splitlines()) == 1, deep_patch.stderr
