"""A command interrupted by a crash waits for a person: resolve decides what happened."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from .conftest import Server, unique, wait_for
from .kit import workspace_of

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"
STEP = "turn-1/command-1-1"


def _park_mid_command(server: Server, ray: Any) -> tuple[str, dict[str, Any]]:
    """A run whose command was cut by its actor's death: Waiting, NeedsResolution. Its Agent
    may reach a host outside (``allowedHosts``): a hermetic run's command would be undone and
    run again by itself instead (decision 38)."""
    from ray.util.state import list_actors

    agent, run = unique("resolve"), unique("cut")
    with server.http() as http:
        http.put(
            f"{AGENTS}/{agent}",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": agent},
                "spec": {"system": "x", "network": {"allowedHosts": ["example.com"]}},
            },
        )
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": "nodus.dev/v1",
                    "kind": "AgentRun",
                    "metadata": {"name": run},
                    "spec": {
                        "agent": agent,
                        "input": "Use the shell to run `echo tick >> counter.txt; sleep 6`",
                    },
                },
            ).status_code
            == 201
        )

        def command_started() -> bool:
            steps = http.get(f"{RUNS}/{run}/steps").json()["items"]
            return any(s["id"] == STEP and s["state"] == "Started" for s in steps)

        wait_for(command_started, timeout=60, interval=0.02, message="the command to start")
        # Kill only once the command had its effect (the tick), during its sleep.
        counter = workspace_of(server, run) / "counter.txt"
        wait_for(counter.exists, timeout=30, interval=0.02, message="the command's tick")
        actor_name = http.get(f"{RUNS}/{run}").json()["status"]["actorName"]
        actor = list_actors(filters=[("name", "=", actor_name), ("state", "=", "ALIVE")], detail=True)
        os.kill(int(actor[0].pid), signal.SIGKILL)

        def parked() -> dict[str, Any] | None:
            body = http.get(f"{RUNS}/{run}").json()
            return body if body["status"].get("reason") == "NeedsResolution" else None

        resource = wait_for(parked, timeout=60, interval=0.1, message="the run to wait for a resolution")
    assert resource["status"]["phase"] == "Waiting" and resource["status"]["step"] == STEP
    return run, resource


def _resolve(server: Server, run: str, **body: Any) -> Any:
    with server.http() as http:
        return http.post(f"{RUNS}/{run}/resolve", json=body)


def _finished(server: Server, run: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        with server.http() as http:
            body = http.get(f"{RUNS}/{run}").json()
        return body if body["status"]["phase"] in ("Succeeded", "Failed", "Cancelled") else None

    return wait_for(done, timeout=90, interval=0.1, message=f"{run} to finish")


def test_completed_records_the_result_and_the_command_does_not_run_again(
    server: Server, ray_driver: Any
) -> None:
    run, resource = _park_mid_command(server, ray_driver)
    revision = resource["metadata"]["resourceVersion"]
    stale = _resolve(server, run, step=STEP, decision="NoEffect", revision=revision - 1)
    assert stale.status_code == 409 and stale.json()["code"] == "RevisionMismatch"
    wrong = _resolve(server, run, step="turn-1/model-1", decision="NoEffect", revision=revision)
    assert wrong.status_code == 409 and wrong.json()["code"] == "StepNotUncertain"
    bad = _resolve(server, run, step=STEP, decision="Maybe", revision=revision)
    assert bad.status_code == 422 and bad.json()["details"]["field"] == "decision"
    no_result = _resolve(server, run, step=STEP, decision="Completed", revision=revision)
    assert no_result.status_code == 422 and no_result.json()["details"]["field"] == "result"

    done = _resolve(
        server,
        run,
        step=STEP,
        decision="Completed",
        revision=revision,
        result={"exitCode": 0, "output": ""},
        evidence="counter.txt has the tick",
    )
    assert done.status_code == 200, done.text
    again = _resolve(server, run, step=STEP, decision="NoEffect", revision=revision)
    assert again.status_code == 409  # the first decision won
    final = _finished(server, run)
    assert final["status"]["phase"] == "Succeeded", final["status"]
    assert (workspace_of(server, run) / "counter.txt").read_text() == "tick\n"
    with server.http() as http:
        steps = {s["id"]: s for s in http.get(f"{RUNS}/{run}/steps").json()["items"]}
    assert steps[STEP]["state"] == "Resolved" and steps[STEP]["attempts"] == 1
    assert steps[STEP]["detail"]["resolution"]["evidence"] == "counter.txt has the tick"


@pytest.mark.parametrize("decision", ["NoEffect", "Cancelled"])
def test_no_effect_runs_the_command_again_and_cancelled_fails_the_run(
    server: Server, ray_driver: Any, decision: str
) -> None:
    run, resource = _park_mid_command(server, ray_driver)
    answered = _resolve(
        server, run, step=STEP, decision=decision, revision=resource["metadata"]["resourceVersion"]
    )
    assert answered.status_code == 200, answered.text
    final = _finished(server, run)["status"]
    counter = (workspace_of(server, run) / "counter.txt").read_text()
    if decision == "NoEffect":
        assert final["phase"] == "Succeeded"
        assert counter == "tick\ntick\n"  # it had run once: a person said it had not, so it ran again
    else:
        assert (final["phase"], final["reason"]) == ("Failed", "StepCancelled")
        assert counter == "tick\n"
