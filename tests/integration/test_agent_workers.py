"""An Agent's spec.maxWorkers through the real service: its runs hold a run actor one at a time,
the others wait Pending (MaxWorkersReached) and start as workers free, and all of them finish."""

from __future__ import annotations

from typing import Any

from .conftest import Server, unique, wait_for

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"

SOURCE = """
import time


def main(ctx, input):
    ctx.step("work", lambda: time.sleep(1.5))
    return {"done": input}
"""


def test_max_workers_runs_an_agents_runs_one_at_a_time_and_all_succeed(server: Server) -> None:
    agent = unique("workers")
    names = [unique("wrun") for _ in range(3)]
    with server.http() as http:
        uploaded = http.post("/v1/projects/default/agentsources", json={"files": {"main.py": SOURCE}})
        assert uploaded.status_code == 201, uploaded.text
        put = http.put(
            f"{AGENTS}/{agent}",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": agent},
                "spec": {
                    "source": uploaded.json(),
                    "entrypoint": "main:main",
                    "maxWorkers": 1,
                    # one parked run actor kept for it (taken first by its runs once the pool has it)
                    "minWorkers": 1,
                    "scaledownWindow": "30s",
                },
            },
        )
        assert put.status_code == 201, put.text
        spec = put.json()["spec"]
        assert (spec["maxWorkers"], spec["minWorkers"], spec["scaledownWindow"]) == (1, 1, "30s")
        for index, name in enumerate(names):
            created = http.post(
                RUNS,
                json={
                    "apiVersion": "nodus.dev/v1",
                    "kind": "AgentRun",
                    "metadata": {"name": name},
                    "spec": {"agent": agent, "input": str(index)},
                },
            )
            assert created.status_code == 201, created.text

        reasons: dict[str, set[str]] = {name: set() for name in names}
        messages: set[str] = set()
        most_running = 0
        started: list[str] = []

        def all_finished() -> bool:
            nonlocal most_running
            listed = http.get(RUNS, params={"agent": agent})
            assert listed.status_code == 200, listed.text
            runs: list[dict[str, Any]] = [
                run for run in listed.json()["items"] if run["metadata"]["name"] in reasons
            ]
            running = [run["metadata"]["name"] for run in runs if run["status"]["phase"] == "Running"]
            most_running = max(most_running, len(running))
            assert len(running) <= 1, f"more than maxWorkers=1 Running at once: {running}"
            for run in runs:
                status, name = run["status"], run["metadata"]["name"]
                if status.get("reason"):
                    reasons[name].add(status["reason"])
                if status.get("reason") == "MaxWorkersReached":
                    messages.add(status.get("message") or "")
                if status["phase"] != "Pending" or status.get("reason") is None:
                    if name not in started and status["phase"] == "Running":
                        started.append(name)
                assert status["phase"] not in ("Failed", "Cancelled"), status
            return len(runs) == 3 and all(run["status"]["phase"] == "Succeeded" for run in runs)

        wait_for(all_finished, timeout=180, interval=0.1, message="all three runs to succeed")
        final = {
            r["metadata"]["name"]: r["status"]
            for r in http.get(RUNS, params={"agent": agent}).json()["items"]
        }

    queued = [name for name in names if "MaxWorkersReached" in reasons[name]]
    assert len(queued) >= 2, reasons  # the second and third waited for the first's worker
    assert all(message.startswith("1 of 1 workers busy") for message in messages), messages
    assert most_running == 1
    assert started == names[: len(started)]  # oldest first, as far as the polls saw them start
    # One after another, never side by side: each run started after the one before it ended.
    spans = sorted((final[name]["startedAt"], final[name]["finishedAt"]) for name in names)
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), spans
