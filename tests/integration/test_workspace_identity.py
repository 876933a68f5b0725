"""A workspace belongs to one run, end to end: a new run named like a deleted one sees none of its files.

Workspaces are keyed by the run's uid (``<sandbox root>/<project>/<name>-<uid>``). The test
leaves behind, on purpose, what a delete that did not finish or a service on another storage
would: the deleted run's own directory and a name-only directory of the layout before uids,
each with a file and a marker. The new run of the same name lists an empty workspace, and the
sweep after the next delete removes the leftovers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .conftest import Server, unique, wait_for
from .kit import workspace_of

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"


def _agent(server: Server) -> str:
    name = unique("ws-agent")
    with server.http() as http:
        response = http.put(
            f"{AGENTS}/{name}",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": name},
                "spec": {"system": "x"},
            },
        )
    assert response.status_code == 201, response.text
    return name


def _run(server: Server, agent: str, name: str, prompt: str) -> dict[str, Any]:
    with server.http() as http:
        created = http.post(
            RUNS,
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent, "input": prompt},
            },
        )
        assert created.status_code == 201, created.text

        def done() -> dict[str, Any] | None:
            body: dict[str, Any] = http.get(f"{RUNS}/{name}").json()
            return (
                body if body["status"]["phase"] in ("Succeeded", "Failed", "Cancelled", "Waiting") else None
            )

        final = wait_for(done, timeout=90, message=f"run {name} to finish")
    assert final["status"]["phase"] == "Succeeded", final["status"]
    return final


def _commands(server: Server, name: str) -> list[dict[str, Any]]:
    with server.http() as http:
        steps = http.get(f"{RUNS}/{name}/steps").json()["items"]
    return [step["detail"]["result"] for step in steps if step["kind"] == "command"]


def _delete(server: Server, name: str) -> None:
    with server.http() as http:
        assert http.delete(f"{RUNS}/{name}").status_code == 200
        assert http.get(f"{RUNS}/{name}").status_code == 404


def _leave(workspace: Path) -> list[Path]:
    """A directory with a file and its marker, as a run that is gone would have left them."""
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "old.txt").write_text("the earlier run's\n")
    marker = workspace.parent / f".{workspace.name}.workspace"
    marker.write_text("3")
    return [workspace, marker]


def test_a_new_run_named_like_a_deleted_one_does_not_see_its_files(server: Server) -> None:
    agent, name = _agent(server), unique("ws-run")
    first = _run(server, agent, name, "Use the shell to run `echo mine > old.txt`")
    old = workspace_of(server, name)
    assert old.name == f"{name}-{first['metadata']['uid']}"
    assert (old / "old.txt").read_text() == "mine\n"

    _delete(server, name)
    wait_for(lambda: not old.exists(), timeout=30, message="the deleted run's workspace removed")
    # Left behind on purpose: the deleted run's directory (a delete that did not finish) and a
    # name-only directory (the layout before uids, or the same name from another storage).
    leftovers = _leave(old) + _leave(server.sandbox_root / "default" / name)

    second = _run(server, agent, name, "Use the shell to run `ls -A` and `cat old.txt`")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    new = workspace_of(server, name)
    assert new.name == f"{name}-{second['metadata']['uid']}" and new not in leftovers
    listed, cat = _commands(server, name)
    assert listed["exit_code"] == 0 and "old.txt" not in listed["output"], listed
    assert cat["exit_code"] != 0 and "mine" not in cat["output"] and "earlier" not in cat["output"], cat
    assert not (new / "old.txt").exists()

    # The sweep after a delete removes what runs that no longer exist left, whenever it came.
    _delete(server, name)
    wait_for(
        lambda: not any(path.exists() for path in [new, *leftovers]),
        timeout=30,
        message="the leftovers of runs that no longer exist swept",
    )
