"""A run's events stream: steps, phase changes, turns and the answer as they happen, resumable
with Last-Event-ID without losing or repeating an event; the CLI's `logs -f` and the SDK's
`logs(follow=True)` read it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

import nodus

from .conftest import Server, unique
from .kit import RUNS, V1, agent

PROMPT = "Use the shell to run `echo streamed`"


def _start(server: Server, agent_name: str, name: str, prompt: str = PROMPT) -> None:
    with server.http() as http:
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": V1,
                    "kind": "AgentRun",
                    "metadata": {"name": name},
                    "spec": {"agent": agent_name, "input": prompt},
                },
            ).status_code
            == 201
        )


def _read(
    server: Server, name: str, last_event_id: str | None = None, stop_after: Any = None, follow: bool = True
) -> list[dict[str, Any]]:
    """Events as {id, event, data}; stops at the end, or after the event ``stop_after`` accepts."""
    events: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {server.token}"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    with httpx.stream(
        "GET",
        f"{server.api_url}{RUNS}/{name}/events",
        params={"follow": str(follow).lower()},
        headers=headers,
        timeout=60,
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        current: dict[str, Any] = {}
        for line in response.iter_lines():
            if line.startswith(("id: ", "event: ", "data: ")):
                key, _, value = line.partition(": ")
                current[key] = json.loads(value) if key == "data" else value
            elif line == "" and current:
                events.append(current)
                if stop_after is not None and stop_after(current):
                    return events
                current = {}
    return events


def test_a_run_streams_its_steps_phase_turns_and_answer_then_ends(server: Server) -> None:
    agent_name, name = unique("streamer"), unique("streamed")
    agent(server, agent_name)
    _start(server, agent_name, name)
    events = _read(server, name)
    kinds = [event["event"] for event in events]
    assert kinds[-1] == "end" and events[-1]["data"]["phase"] == "Succeeded"
    steps = [event["data"] for event in events if event["event"] == "step"]
    assert [step["seq"] for step in steps] == sorted({step["seq"] for step in steps}), (
        "each record once, in order"
    )
    assert ("turn-1/command-1-1", "Started", "$ echo streamed") in [
        (s["step"], s["state"], s["summary"]) for s in steps
    ]
    with server.http() as http:
        recorded = http.get(f"{RUNS}/{name}/steps").json()["items"]
    # Every step's Started and its end, nothing else; routing and reading the inbox are internal
    # and idempotent, one Completed record each (decision 51).
    expected = sorted(
        pair
        for step in recorded
        for pair in (
            [(step["id"], step["state"])]
            if step["kind"] in ("route", "inbox")
            else [(step["id"], "Started"), (step["id"], step["state"])]
        )
    )
    assert sorted((s["step"], s["state"]) for s in steps) == expected
    phases = [event["data"]["phase"] for event in events if event["event"] == "phase"]
    assert phases[-1] == "Succeeded" and "Running" in phases
    turns = [event["data"] for event in events if event["event"] == "turn"]
    assert turns[-1]["index"] == 1 and turns[-1]["finishedAt"]
    answer = "".join(event["data"]["text"] for event in events if event["event"] == "answer")
    with server.http() as http:
        assert answer == http.get(f"{RUNS}/{name}/answer").json()["answer"]
    # Everything after the run ended: the same events again, and a closed stream.
    again = _read(server, name, follow=False)
    assert [e["event"] for e in again if e["event"] == "step"] == ["step"] * len(steps)


def test_a_reconnect_with_last_event_id_loses_and_repeats_nothing(server: Server) -> None:
    agent_name, name = unique("resumer"), unique("resumed")
    agent(server, agent_name)
    _start(server, agent_name, name, "Use the shell to run `sleep 2; echo later`")
    first = _read(server, name, stop_after=lambda e: e["event"] == "step" and e["data"]["kind"] == "command")
    rest = _read(server, name, last_event_id=first[-1]["id"])
    assert rest[-1]["event"] == "end"
    whole = _read(server, name)
    seqs = [e["data"]["seq"] for e in first + rest if e["event"] == "step"]
    assert seqs == [e["data"]["seq"] for e in whole if e["event"] == "step"], "no step lost or repeated"
    assert [e["data"]["phase"] for e in first + rest if e["event"] == "phase"][-1] == "Succeeded"


def test_the_cli_and_the_sdk_follow_a_runs_log(sdk_env: Server) -> None:
    server = sdk_env
    agent_name, name = unique("logger"), unique("logged")
    agent(server, agent_name)
    _start(server, agent_name, name)
    followed = server.cli("agentrun", "logs", name, "-f")
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert any(line.endswith("turn-1/command-1-1 Started  $ echo streamed") for line in lines), lines
    assert "phase Succeeded (Completed)" in lines and "answer:" in lines

    async def collect() -> list[str]:
        return [line async for line in nodus.AgentRun.from_name(name).logs(follow=True)]

    logged = asyncio.run(collect())
    assert any(line.endswith("turn-1/command-1-1 Started  $ echo streamed") for line in logged)
    assert "phase Succeeded (Completed)" in logged
    with server.http() as http:
        answer = http.get(f"{RUNS}/{name}/answer").json()["answer"]
    assert f"answer:\n{answer}" in logged
    missing = server.cli("agentrun", "logs", unique("no-such-run"))
    assert missing.returncode == 1 and "not found" in missing.stderr.lower()
