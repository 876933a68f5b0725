"""A run that may have reached outside its sandbox waits for a person, and everything says so.

An Agent with ``network.allowedHosts`` runs a group of two runs whose command ticks a counter
and sleeps; one run's actor is killed mid-command. That command may have acted outside, so the
run parks ``Waiting`` / ``NeedsResolution``: the group counts it (``counts.waiting``,
``blockedReasons.NeedsResolution``), ``nodus get ag`` shows it in the WAITING column,
``nodus describe ag`` names the run and its step, the run's message says which step and why a
person must decide, and the step's evidence lists the command's connections (this command makes
none, and the evidence says so rather than nothing). A person resolves it and the group ends.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from .conftest import Server, unique, wait_for
from .kit import RUNS, agent, batch, finished, get_group, group, member, runs_of, seal, workspace_of

STEP = "turn-1/command-1-1"
COMMAND = "Use the shell to run `echo tick >> counter.txt; sleep 30`"


def _agent_with_egress(server: Server, name: str) -> None:
    agent(server, name, allowed_hosts=["example.com"])


def _run(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        response = http.get(f"{RUNS}/{name}")
        assert response.status_code == 200, response.text
        return response.json()


def _counter(server: Server, name: str) -> str:
    path = workspace_of(server, name) / "counter.txt"
    return path.read_text() if path.exists() else ""


def _column(output: str, row_name: str, header: str) -> str:
    lines = output.splitlines()
    headers = lines[0].split()
    (row,) = [line.split() for line in lines[1:] if line.split() and line.split()[0] == row_name]
    return row[headers.index(header)]


def test_a_run_that_may_have_reached_outside_waits_for_a_person_and_every_view_says_why(
    server: Server, ray_driver: Any
) -> None:
    from ray.util.state import list_actors

    agent_name, group_name = unique("wp"), unique("wpg")
    _agent_with_egress(server, agent_name)
    group(server, group_name, agent_name, limits={"maxActive": 2})
    members = [member(group_name, agent_name, f"t{i}", COMMAND) for i in range(2)]
    assert batch(server, members).status_code == 201
    seal(server, group_name)
    victim = f"{group_name}-t0"

    # Kill the first run's actor once its command had its effect (the tick), during its sleep.
    wait_for(lambda: _counter(server, victim) == "tick\n", timeout=90, message="the command's tick")
    actor_name = _run(server, victim)["status"]["actorName"]
    actors = list_actors(filters=[("name", "=", actor_name), ("state", "=", "ALIVE")], detail=True)
    os.kill(int(actors[0].pid), signal.SIGKILL)

    parked = wait_for(
        lambda: (r := _run(server, victim))["status"].get("reason") == "NeedsResolution" and r,
        timeout=90,
        message="the run to wait for a person",
    )
    status = parked["status"]
    assert status["phase"] == "Waiting" and status["step"] == STEP
    message = status["message"]
    assert f"step {STEP} (command) was interrupted" in message, message
    assert "allowedHosts: example.com" in message and "it made no connections" in message, message
    assert f"nodus agentrun resolve {victim} --step {STEP}" in message, message

    # The group says one run waits for a person.
    counted = wait_for(
        lambda: (
            (s := get_group(server, group_name).get("status") or {}).get("counts", {}).get("waiting") == 1
            and s
        ),
        timeout=60,
        message="the group to count the waiting run",
    )
    assert counted["blockedReasons"]["NeedsResolution"] == 1, counted
    assert counted["waitingReasons"] == {"NeedsResolution": 1}, counted

    # The evidence: the command's connections, durable although it never ended (here: none).
    with server.http() as http:
        steps = {s["id"]: s for s in http.get(f"{RUNS}/{victim}/steps").json()["items"]}
    assert steps[STEP]["state"] == "NeedsResolution"
    assert steps[STEP]["detail"]["egress"] == {"recorded": True, "connections": []}, steps[STEP]

    table = server.cli("get", "ag", group_name)
    assert table.returncode == 0, table.stderr
    assert _column(table.stdout, group_name, "WAITING") == "1", table.stdout
    wide = server.cli("get", "ag", group_name, "-o", "wide")
    assert "NeedsResolution=1" in _column(wide.stdout, group_name, "BLOCKED"), wide.stdout
    described = server.cli("describe", "ag", group_name)
    assert described.returncode == 0, described.stderr
    waiting_rows = described.stdout.split("Waiting runs:\n", 1)[1].splitlines()[1:]
    assert [row.split()[:3] for row in waiting_rows] == [[victim, "NeedsResolution", STEP]], described.stdout

    # A person looks at the effect (one tick), records the command as Completed: the group ends.
    with server.http() as http:
        resolved = http.post(
            f"{RUNS}/{victim}/resolve",
            json={
                "step": STEP,
                "decision": "Completed",
                "revision": _run(server, victim)["metadata"]["resourceVersion"],
                "result": {"exitCode": 0, "output": ""},
                "evidence": "counter.txt has one tick; no connections",
            },
        )
        assert resolved.status_code == 200, resolved.text
    done = finished(server, group_name, timeout=180)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert (
        done["status"]["counts"]["waiting"] == 0 and done["status"]["blockedReasons"]["NeedsResolution"] == 0
    )
    for run in runs_of(server, group_name):
        assert run["status"]["phase"] == "Succeeded", run["status"]
        assert _counter(server, run["metadata"]["name"]) == "tick\n", "each command ran once"
