"""Helpers shared by the integration tests that drive agents, groups and runs over REST."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .conftest import Server, wait_for

AGENTS = "/v1/projects/default/agents"
GROUPS = "/v1/projects/default/agentgroups"
RUNS = "/v1/projects/default/agentruns"
V1 = "nodus.dev/v1"


def agent(
    server: Server,
    name: str,
    cap: str = "0.10",
    model: dict[str, Any] | None = None,
    allowed_hosts: list[str] | None = None,
) -> None:
    """Apply an Agent; ``allowed_hosts``: its sandbox may reach those hosts (``spec.network``)."""
    spec: dict[str, Any] = {
        "system": "Answer in one sentence.",
        "perRunMaxCostUSD": cap,
        "model": model or {"access": "Nodus", "families": ["haiku"]},
    }
    if allowed_hosts is not None:
        spec["network"] = {"allowedHosts": allowed_hosts}
    with server.http() as http:
        response = http.put(
            f"{AGENTS}/{name}",
            json={"apiVersion": V1, "kind": "Agent", "metadata": {"name": name}, "spec": spec},
        )
        assert response.status_code in (200, 201), response.text


def group(server: Server, name: str, agent: str, **spec: Any) -> dict[str, Any]:
    with server.http() as http:
        response = http.post(
            GROUPS,
            json={
                "apiVersion": V1,
                "kind": "AgentGroup",
                "metadata": {"name": name},
                "spec": {"agent": agent, **spec},
            },
        )
        assert response.status_code == 201, response.text
        return response.json()


def member(
    group: str, agent: str, key: str, text: str = "What is 2 + 2?", deps: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"agent": agent, "group": group, "taskKey": key, "input": text}
    if deps:
        spec["dependsOn"] = deps
    return {"apiVersion": V1, "kind": "AgentRun", "spec": spec}


def batch(server: Server, runs: list[dict[str, Any]], key: str | None = None) -> Any:
    with server.http() as http:
        headers = {"Idempotency-Key": key} if key else {}
        return http.post(
            RUNS, json={"apiVersion": V1, "kind": "AgentRunList", "items": runs}, headers=headers
        )


def workspace_of(server: Server, name: str, project: str = "default") -> Path:
    """The run's workspace on this machine: keyed by the run's uid, so ask the run for it.

    A run never gets the directory of an earlier run of its name; call this while the run
    exists (before a delete) to know where its workspace was.
    """
    from nodus_ray.sandbox.run_workspaces import workspace_path

    with server.http() as http:
        response = http.get(f"/v1/projects/{project}/agentruns/{name}")
    assert response.status_code == 200, response.text
    return workspace_path(server.sandbox_root, project, name, response.json()["metadata"]["uid"])


def get_group(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        return http.get(f"{GROUPS}/{name}").json()


def runs_of(server: Server, group: str) -> list[dict[str, Any]]:
    with server.http() as http:
        return http.get(RUNS, params={"group": group}).json()["items"]


def seal(server: Server, name: str) -> None:
    with server.http() as http:
        assert http.patch(f"{GROUPS}/{name}", json={"spec": {"sealed": True}}).status_code == 200


def finished(server: Server, name: str, timeout: float = 120) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        group = get_group(server, name)  # no status while a restarted control plane loads (503)
        return (
            group
            if (group.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Cancelled")
            else None
        )

    try:
        return wait_for(done, timeout=timeout, interval=0.1, message=f"group {name} to finish")
    except AssertionError as stuck:  # say where it stuck: the group's status and each run's
        runs = [
            (
                r["metadata"]["name"],
                r["status"]["phase"],
                r["status"].get("reason"),
                r["status"].get("attempts"),
                r["status"].get("admittedAt"),
                r["status"].get("actorName"),
            )
            for r in runs_of(server, name)
        ]
        raise AssertionError(
            f"{stuck}; group status {get_group(server, name).get('status')}; runs {runs}"
        ) from None


def most_at_once(runs: list[dict[str, Any]]) -> int:
    """The most runs that were admitted and unfinished at one moment (from their timestamps)."""
    events = []
    for run in runs:
        status = run["status"]
        if status.get("admittedAt"):
            events.append((status["admittedAt"], 1))
            events.append((status["finishedAt"], -1))
    most = current = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at a tie
        current += change
        most = max(most, current)
    return most
