"""Runs survive their actors: a killed run actor is replaced and replays its journal."""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime
from typing import Any

from nodus_ray.durable.journal import Journal
from nodus_ray.store import layout

from .conftest import Server, unique, wait_for
from .kit import workspace_of

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"


def _agent(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": {"system": "x"},
    }


def _steps(server: Server, name: str) -> list[dict[str, Any]]:
    with server.http() as http:
        return http.get(f"{RUNS}/{name}/steps").json()["items"]


def _actor_pid(ray: Any, name: str) -> int:
    from ray.util.state import list_actors

    actors = list_actors(filters=[("name", "=", name), ("state", "=", "ALIVE")], detail=True)
    assert actors, f"no live actor named {name}"
    return int(actors[0].pid)


def test_a_killed_run_actor_is_replaced_and_completed_steps_are_not_repeated(
    server: Server, ray_driver: Any
) -> None:
    agent, run = unique("durable"), unique("counted")
    with server.http() as http:
        http.put(f"{AGENTS}/{agent}", json=_agent(agent))
        created = http.post(
            RUNS,
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": run},
                "spec": {"agent": agent, "input": "Use the shell to run `echo tick >> counter.txt`"},
            },
        )
        assert created.status_code == 201

    def command_done() -> bool:
        return any(s["kind"] == "command" and s["state"] == "Completed" for s in _steps(server, run))

    wait_for(command_done, timeout=60, interval=0.02, message="the counted command to complete")
    # The second model call is usually in flight (the test server's offline model takes 0.3 s):
    # crash the actor's process the hard way, as a node failure would. Where exactly the kill
    # lands is up to the machine; the journal says, and the checks below hold for either moment.
    # (The fault suite pins the moment with a crash point: test_faults.py.)
    # The dashboard's Actors view tells what the actor is: its name and its __repr__.
    assert any(f"run=default/{run}, agent={agent}@1" in (a.repr_name or "") for a in _live_actors_of(run))
    with server.http() as http:
        actor_name = http.get(f"{RUNS}/{run}").json()["status"]["actorName"]
    os.kill(_actor_pid(ray_driver, actor_name), signal.SIGKILL)
    killed_at = datetime.now(UTC)

    def finished() -> dict[str, Any] | None:
        with server.http() as http:
            body = http.get(f"{RUNS}/{run}").json()
        return body if body["status"]["phase"] in ("Succeeded", "Failed") else None

    final = wait_for(finished, timeout=90, message="the replayed run to finish")
    assert final["status"]["phase"] == "Succeeded", final["status"]
    assert final["status"]["attempts"] == 2, "a second actor took over"
    counter = workspace_of(server, run) / "counter.txt"
    assert counter.read_text() == "tick\n", "the completed command ran exactly once"
    steps = _steps(server, run)
    command = [s for s in steps if s["kind"] == "command"]
    assert len(command) == 1 and command[0]["attempts"] == 1
    models = [s for s in steps if s["kind"] == "model"]
    assert [m["state"] for m in models] == ["Completed", "Completed"]
    # The second call: ended by the first actor before the kill (then replayed from the journal,
    # one attempt), or interrupted by it (then made again by the new actor, attempt 2). Never
    # made twice after it was recorded, never lost.
    records = Journal(server.store(), layout.journal_folder("default", run)).load()
    second = [r for r in records if r.step_id == models[1]["id"]]
    ended_first = [r for r in second if r.state == "Completed" and r.attempt == 1]
    if ended_first and ended_first[0].at < killed_at:
        assert models[1]["attempts"] == 1 and [r.state for r in second] == ["Started", "Completed"]
    else:
        assert models[1]["attempts"] == 2, "the interrupted model call was made again by the new actor"
        assert [(r.state, r.attempt) for r in second] == [("Started", 1), ("Started", 2), ("Completed", 2)]


def test_the_control_plane_reloads_everything_after_a_crash(server: Server, ray_driver: Any) -> None:
    agent, run = unique("reload"), unique("kept")
    with server.http() as http:
        http.put(f"{AGENTS}/{agent}", json=_agent(agent))
        http.post(
            RUNS,
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": run},
                "spec": {"agent": agent, "input": "What is 3 * 3?"},
            },
        )
        wait_for(
            lambda: http.get(f"{RUNS}/{run}").json()["status"]["phase"] == "Succeeded",
            timeout=60,
            message="the run to succeed",
        )
        before = http.get(f"{RUNS}/{run}").json()
        os.kill(_actor_pid(ray_driver, "nodus-control-plane"), signal.SIGKILL)

        def reloaded() -> dict[str, Any] | None:
            response = http.get(f"{RUNS}/{run}")
            return response.json() if response.status_code == 200 else None

        after = wait_for(reloaded, timeout=120, interval=0.5, message="the restarted control plane")
        assert after == before
        assert http.get(f"{AGENTS}/{agent}").json()["status"]["revision"] == 1
        assert http.get(f"{RUNS}/{run}/answer").json()["answer"].strip() == "3 * 3 = 9."
    assert (
        json.loads((server.storage / "projects/default/agentruns" / run / "run.json").read_text())["status"][
            "phase"
        ]
        == "Succeeded"
    )


def _live_actors_of(run: str) -> list[Any]:
    """Live actors that serve ``run``: their ``__repr__`` (shown by the dashboard) names it."""
    from ray.util.state import list_actors

    return [
        a
        for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10000, detail=True)
        if f"run=default/{run}," in (getattr(a, "repr_name", "") or "")
    ]


def test_cancel_or_delete_right_after_create_leaves_no_actor_and_no_sandbox(
    server: Server, ray_driver: Any
) -> None:
    agent = unique("racy")
    cancelled, deleted = unique("cancel-now"), unique("delete-now")
    with server.http() as http:
        http.put(f"{AGENTS}/{agent}", json=_agent(agent))
        for name in (cancelled, deleted):
            assert (
                http.post(
                    RUNS,
                    json={
                        "apiVersion": "nodus.dev/v1",
                        "kind": "AgentRun",
                        "metadata": {"name": name},
                        "spec": {"agent": agent, "input": "Use the shell to run `sleep 60`"},
                    },
                ).status_code
                == 201
            )
        workspaces = {name: workspace_of(server, name) for name in (cancelled, deleted)}
        assert http.post(f"{RUNS}/{cancelled}/cancel").json()["status"]["phase"] == "Cancelled"
        assert http.delete(f"{RUNS}/{deleted}").status_code == 200

        for name in (cancelled, deleted):
            wait_for(
                lambda name=name: not _live_actors_of(name),
                timeout=30,
                interval=0.2,
                message=f"no live actor for {name}",
            )
            wait_for(
                lambda name=name: not workspaces[name].exists(),
                timeout=30,
                message=f"no workspace for {name}",
            )
        assert http.get(f"{RUNS}/{cancelled}").json()["status"]["phase"] == "Cancelled"
        assert http.get(f"{RUNS}/{deleted}").status_code == 404
        # No command of the cancelled run ever finished: the sleep never ran to its end.
        steps = http.get(f"{RUNS}/{cancelled}/steps").json()["items"]
        assert not any(s["kind"] == "command" and s["state"] == "Completed" for s in steps)
