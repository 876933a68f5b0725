"""Finding runs among many (issue 20, item 6), through the API, the SDK and the CLI of a real service.

A project of its own holds ~30 labelled runs made cheaply: members of two groups whose cost cap
is below one run's cap, so they stay queued and hold no actor; a few are cancelled, and one run
submitted from the SDK with labels runs to its end on the offline model. Then: pages of 7 whose
union is every run exactly once, each selector (labels, phase, agent, group, creation time),
and a selector that does not parse refused as a 400 naming the parameter (API), `BadRequest`
before sending (SDK), and one error line with a non-zero exit (CLI).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import nodus
from nodus.client import Client
from nodus.errors import BadRequest

from .conftest import Server, unique, wait_for

V1 = "nodus.dev/v1"
COUNT = 30
CANCELLED = (4, 11, 17, 25)


def _labels(index: int) -> dict[str, str]:
    return {
        "team": "a" if index % 2 else "b",
        "env": "prod" if index % 5 == 0 else "dev",
        "tier": str(index % 3),
    }


def _setup(server: Server, project: str) -> dict[int, dict[str, Any]]:
    """Two agents, two groups that admit nothing, and COUNT labelled members; index -> run."""
    base = f"/v1/projects/{project}"
    with server.http() as http:
        for agent in ("helper", "other"):
            spec = {
                "system": "Answer in one sentence.",
                "perRunMaxCostUSD": "0.10",
                "model": {"families": ["haiku"]},
            }
            document = {
                "apiVersion": V1,
                "kind": "Agent",
                "metadata": {"name": agent, "labels": {"role": agent}},
            }
            response = http.put(f"{base}/agents/{agent}", json={**document, "spec": spec})
            assert response.status_code == 201, response.text
        for group, agent in (("g1", "helper"), ("g2", "other")):
            # A cap below one run's: no run fits, every member stays queued (no actor, no spend).
            spec = {"agent": agent, "maxCostUSD": "0.05", "limits": {"maxActive": 1}}
            document = {"apiVersion": V1, "kind": "AgentGroup", "metadata": {"name": group}, "spec": spec}
            assert http.post(f"{base}/agentgroups", json=document).status_code == 201
        items = []
        for index in range(COUNT):
            group, agent = ("g2", "other") if index % 3 == 0 else ("g1", "helper")
            items.append(
                {
                    "apiVersion": V1,
                    "kind": "AgentRun",
                    "metadata": {"labels": _labels(index)},
                    "spec": {
                        "agent": agent,
                        "group": group,
                        "taskKey": f"t{index:02d}",
                        "input": "What is 2 + 2?",
                    },
                }
            )
        created = http.post(
            f"{base}/agentruns", json={"apiVersion": V1, "kind": "AgentRunList", "items": items}
        )
        assert created.status_code == 201, created.text
        runs = {index: run for index, run in enumerate(created.json()["items"])}
        for index in CANCELLED:
            name = runs[index]["metadata"]["name"]
            assert http.post(f"{base}/agentruns/{name}/cancel").status_code == 200
    for index in CANCELLED:
        name = runs[index]["metadata"]["name"]
        wait_for(
            lambda name=name: _get(server, project, name)["status"]["phase"] == "Cancelled",
            timeout=60,
            message=f"{name} cancelled",
        )
    return runs


def _get(server: Server, project: str, name: str) -> dict[str, Any]:
    with server.http() as http:
        return dict(http.get(f"/v1/projects/{project}/agentruns/{name}").json())


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _names(items: list[dict[str, Any]]) -> set[str]:
    return {item["metadata"]["name"] for item in items}


def _select(server: Server, project: str, **params: str) -> set[str]:
    with server.http() as http:
        response = http.get(f"/v1/projects/{project}/agentruns", params=params)
    assert response.status_code == 200, response.text
    return _names(response.json()["items"])


def test_runs_are_found_by_selectors_and_paged_through_the_api_sdk_and_cli(server: Server) -> None:
    project = unique("sel")
    runs = _setup(server, project)
    names = {index: run["metadata"]["name"] for index, run in runs.items()}

    def where(keep: Any) -> set[str]:
        return {names[index] for index in runs if keep(index)}

    # A run of the SDK, labelled at submit, that runs to its end on the offline model.
    client = Client(api_url=server.api_url, project=project, token=server.token)
    submitted = nodus.Agent.from_name("helper", client=client).submit("What is 2 + 2?", labels={"team": "c"})
    submitted.wait(timeout=180)
    everything = set(names.values()) | {submitted.name}

    # -- API: pages of 7, every run exactly once --------------------------------------------
    seen: list[str] = []
    remaining: list[int] = []
    params: dict[str, str] = {"limit": "7"}
    with server.http() as http:
        while True:
            body = http.get(f"/v1/projects/{project}/agentruns", params=params).json()
            assert body["kind"] == "AgentRunList" and len(body["items"]) <= 7
            seen += [item["metadata"]["name"] for item in body["items"]]
            remaining.append(body["metadata"]["remainingItemCount"])
            token = body["metadata"].get("continue")
            if token is None:
                break
            params["continue"] = token
    assert sorted(seen) == sorted(everything) and len(seen) == COUNT + 1
    assert remaining == [24, 17, 10, 3, 0]

    # -- API: each selector ----------------------------------------------------------------
    assert _select(server, project, labelSelector="team=a") == where(lambda i: i % 2)
    assert _select(server, project, labelSelector="team=a,env!=prod,tier in (0,1)") == where(
        lambda i: i % 2 and i % 5 and i % 3 in (0, 1)
    )
    assert _select(server, project, labelSelector="team notin (a,b)") == {submitted.name}
    assert _select(server, project, labelSelector="!env") == {submitted.name}
    assert _select(server, project, fieldSelector="status.phase=Cancelled") == where(lambda i: i in CANCELLED)
    assert _select(server, project, fieldSelector="status.phase=Succeeded") == {submitted.name}
    assert _select(server, project, fieldSelector="status.phase=Pending,spec.agent=other") == where(
        lambda i: i % 3 == 0 and i not in CANCELLED
    )
    assert _select(server, project, fieldSelector="spec.group=g1,status.phase!=Cancelled") == where(
        lambda i: i % 3 and i not in CANCELLED
    )
    reason = _get(server, project, names[CANCELLED[0]])["status"]["reason"]
    assert _select(server, project, fieldSelector=f"status.reason={reason}") == where(
        lambda i: i in CANCELLED
    )
    assert _select(server, project, group="g2", labelSelector="env=prod") == where(lambda i: i % 15 == 0)
    moment = max((run["metadata"]["creationTimestamp"] for run in runs.values()), key=_instant)
    later = _select(server, project, fieldSelector=f"metadata.creationTimestamp>{moment}")
    assert later == {submitted.name}
    assert _select(server, project, fieldSelector=f"metadata.creationTimestamp<={moment}") == set(
        names.values()
    )
    with server.http() as http:
        groups = http.get(
            f"/v1/projects/{project}/agentgroups", params={"fieldSelector": "status.phase=Running"}
        )
        assert _names(groups.json()["items"]) == {"g1", "g2"}
        agents = http.get(f"/v1/projects/{project}/agents", params={"labelSelector": "role in (other)"})
        assert _names(agents.json()["items"]) == {"other"}

        # -- API: bad input, one 400 naming the parameter ------------------------------------
        for param, value, says in (
            ("labelSelector", "team=a=b", "does not parse"),
            (
                "fieldSelector",
                "spec.model=x",
                "supported: status.phase, status.reason, spec.agent, spec.group",
            ),
            ("fieldSelector", "metadata.creationTimestamp>yesterday", "RFC 3339"),
            ("limit", "1001", "1 to 1000"),
            ("continue", "forged", "damaged"),
        ):
            answer = http.get(f"/v1/projects/{project}/agentruns", params={"limit": "7", param: value})
            assert answer.status_code == 400, (param, answer.text)
            refusal = answer.json()
            assert refusal["details"] == {"field": param} and says in refusal["message"], refusal
        first = http.get(f"/v1/projects/{project}/agentruns", params={"limit": "7"}).json()
        other_query = http.get(
            f"/v1/projects/{project}/agentruns",
            params={"limit": "7", "labelSelector": "team=a", "continue": first["metadata"]["continue"]},
        )
        assert other_query.status_code == 400 and "another query" in other_query.json()["message"]
        bad_label = {
            "apiVersion": V1,
            "kind": "AgentRun",
            "metadata": {"name": "x", "labels": {"bad key": "v"}},
        }
        refused = http.post(
            f"/v1/projects/{project}/agentruns",
            json={**bad_label, "spec": {"agent": "helper", "input": "hi"}},
        )
        assert refused.status_code == 422 and refused.json()["details"]["field"] == "metadata.labels"

    # -- SDK ---------------------------------------------------------------------------------
    paged = [run["metadata"]["name"] for run in client.iter_runs(labels={"team": "b"}, page_size=7)]
    assert sorted(paged) == sorted(where(lambda i: i % 2 == 0)) and len(paged) == len(set(paged))
    cancelled = nodus.list_runs(phase="Cancelled", project=project, client=client)
    assert {run.name for run in cancelled} == where(lambda i: i in CANCELLED)
    assert [run.name for run in nodus.list_runs(labels="team=c", client=client)] == [submitted.name]
    group_runs = nodus.AgentGroup.from_name("g2", client=client).runs(labels={"env": "prod"})
    assert {run.name for run in group_runs} == where(lambda i: i % 15 == 0)
    page = client.list_page("agentruns", field_selector="spec.agent=helper", limit=5)
    assert len(page.items) == 5 and page.remaining_item_count == 16 and page.continue_
    try:
        client.list("agentruns", label_selector="team in (a")
    except BadRequest as error:
        assert error.details == {"field": "labelSelector"}
    else:
        raise AssertionError("a selector that does not parse was accepted")

    # -- CLI ---------------------------------------------------------------------------------
    listed = server.cli("get", "ar", "-p", project, "-l", "team=a", "--limit", "7", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    first_page = [line.removeprefix("agentrun/") for line in listed.stdout.splitlines()]
    assert len(first_page) == 7 and "8 more; next page: --continue " in listed.stderr
    token = listed.stderr.strip().rsplit(" ", 1)[1]
    rest = server.cli(
        "get", "ar", "-p", project, "-l", "team=a", "--limit", "7", "--continue", token, "-o", "name"
    )
    second_page = [line.removeprefix("agentrun/") for line in rest.stdout.splitlines()]
    assert len(second_page) == 7 and not set(first_page) & set(second_page)
    table = server.cli(
        "get", "ar", "-p", project, "--field-selector", "status.phase=Cancelled,spec.group=g1", "-o", "name"
    )
    assert table.returncode == 0 and {
        line.removeprefix("agentrun/") for line in table.stdout.splitlines()
    } == where(lambda i: i in CANCELLED and i % 3)
    whole = server.cli("get", "ar", "-p", project, "-o", "name")
    assert len(whole.stdout.splitlines()) == COUNT + 1 and whole.stderr == ""
    for args, says in (
        (["-l", "team=a=b"], "error: Invalid: --selector: 'team=a=b' does not parse"),
        (
            ["--field-selector", "status.phase=Runing"],
            "error: Invalid: --field-selector: 'status.phase=Runing'",
        ),
        (["--limit", "0"], "error: Invalid: --limit: 0 is out of range"),
        (["--limit", "7", "--continue", "forged"], "error: Invalid: continue: the token is damaged"),
    ):
        refused_cli = server.cli("get", "ar", "-p", project, *args)
        lines = refused_cli.stderr.strip().splitlines()
        assert refused_cli.returncode != 0 and len(lines) == 1 and lines[0].startswith(says), (
            refused_cli.stderr
        )

    with server.http() as http:  # leave nothing queued behind
        for group in ("g1", "g2"):
            assert http.post(f"/v1/projects/{project}/agentgroups/{group}/cancel").status_code == 200
