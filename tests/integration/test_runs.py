"""Run behaviour that only shows end to end: tool-call limits, containment, the journal's shape."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from .conftest import Server, unique, wait_for
from .kit import workspace_of

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"


def _start(server: Server, prompt: str, **agent_spec: Any) -> str:
    agent, run = unique("agent"), unique("run")
    with server.http() as http:
        assert (
            http.put(
                f"{AGENTS}/{agent}",
                json={
                    "apiVersion": "nodus.dev/v1",
                    "kind": "Agent",
                    "metadata": {"name": agent},
                    "spec": {"system": "x", **agent_spec},
                },
            ).status_code
            == 201
        )
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": "nodus.dev/v1",
                    "kind": "AgentRun",
                    "metadata": {"name": run},
                    "spec": {"agent": agent, "input": prompt},
                },
            ).status_code
            == 201
        )
    return run


def _finished(server: Server, run: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        with server.http() as http:
            body = http.get(f"{RUNS}/{run}").json()
        return body if body["status"]["phase"] in ("Succeeded", "Failed", "Cancelled", "Waiting") else None

    return wait_for(done, timeout=90, message=f"run {run} to finish")


def _steps(server: Server, run: str) -> list[dict[str, Any]]:
    with server.http() as http:
        return http.get(f"{RUNS}/{run}/steps").json()["items"]


def test_max_tool_calls_bounds_the_commands_of_a_turn(server: Server) -> None:
    run = _start(
        server, "Use the shell to run `echo one`, then `echo two`, then `echo three`", maxToolCalls=2
    )
    final = _finished(server, run)
    assert final["status"]["phase"] == "Succeeded"
    assert final["status"]["turns"][0]["toolCalls"] == 2
    commands = [s for s in _steps(server, run) if s["kind"] == "command"]
    assert [s["detail"]["command"] for s in commands] == ["echo one", "echo two"]


def test_a_runs_commands_have_no_network_and_cannot_write_outside(server: Server) -> None:
    run = _start(
        server,
        "Use the shell to run `python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"`"
        " and `touch /etc/nodus-escape` and `echo ok > inside.txt`",
    )
    final = _finished(server, run)
    assert final["status"]["phase"] == "Succeeded"
    commands = [s for s in _steps(server, run) if s["kind"] == "command"]
    exits = [s["detail"]["result"]["exit_code"] for s in commands]
    assert exits[0] != 0 and exits[1] != 0 and exits[2] == 0
    assert (workspace_of(server, run) / "inside.txt").read_text() == "ok\n"


def test_the_journal_stores_each_message_once_as_arrow(server: Server) -> None:
    run = _start(server, "Use the shell to print the Python version")
    assert _finished(server, run)["status"]["phase"] == "Succeeded"
    journal = server.storage / "projects" / "default" / "agentruns" / run / "journal"
    table = pa.concat_tables(
        ipc.open_stream(p.read_bytes()).read_all() for p in sorted(journal.glob("*.arrow"))
    )
    rows = table.to_pylist()
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    messages = [r for r in rows if r["kind"] == "message"]
    # user prompt, assistant tool call, tool result, assistant answer: each exactly once
    assert [r["step_id"] for r in messages] == [f"message-{i}" for i in range(4)]
    # Every step has a Started record before its Completed one, but routing, which is
    # idempotent and internal: it is one Completed record (issue 19).
    for step_id in {r["step_id"] for r in rows if r["kind"] != "message"}:
        states = [r["state"] for r in rows if r["step_id"] == step_id]
        expected = ["Completed"] if step_id.endswith("/route") else ["Started", "Completed"]
        assert states == expected, (step_id, states)
    # Each model answer is stored once: the assistant message refers to its model step's result.
    answers = [json.loads(r["payload"]) for r in messages if '"assistant"' in r["payload"]]
    assert answers and all(set(a) == {"role", "contentOf"} for a in answers)
    # A model call refers to the conversation by its length instead of copying it.
    model_started = [r for r in rows if r["kind"] == "model" and r["state"] == "Started"]
    assert all('"role"' not in r["payload"] for r in model_started)


def test_a_run_cannot_see_other_runs_workspaces_or_the_storage(server: Server) -> None:
    first = _start(server, "Use the shell to run `echo hidden-value > secret.txt`")
    assert _finished(server, first)["status"]["phase"] == "Succeeded"
    other_workspace = workspace_of(server, first)
    assert (other_workspace / "secret.txt").exists()
    second = _start(
        server,
        f"Use the shell to run `cat {other_workspace}/secret.txt` and `ls -A {server.sandbox_root}` "
        f"and `ls -A {server.storage}`",
    )
    final = _finished(server, second)
    assert final["status"]["phase"] == "Succeeded"
    results = [s["detail"]["result"] for s in _steps(server, second) if s["kind"] == "command"]
    # The session keeps these outside /tmp (conftest), where a sandbox would see them were they
    # not hidden: missing, not forbidden (a permission bit would say "Permission denied").
    assert not any(str(p.resolve()).startswith("/tmp/") for p in (other_workspace, server.storage))
    assert results[0]["exit_code"] != 0 and "No such file or directory" in results[0]["output"]
    assert "hidden-value" not in results[0]["output"]
    # Empty mounts: not even the projects' or the runs' names show.
    assert (results[1]["exit_code"], results[1]["output"]) == (0, "")
    assert (results[2]["exit_code"], results[2]["output"]) == (0, "")
    assert final["status"]["sandbox"]["uid"] != _finished(server, first)["status"]["sandbox"]["uid"]
