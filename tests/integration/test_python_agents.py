"""Durable Python agents through the real service: a program's steps journaled and replayed,
waiting with no process (a timer, a message), and a program that raises."""

from __future__ import annotations

import os
import signal
from typing import Any

from .conftest import Server, unique, wait_for
from .kit import workspace_of

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"

SOURCE = """
import os
import time


def main(ctx, input):
    def bump():
        path = os.path.join(str(ctx.state_dir), "count")
        n = int(open(path).read()) if os.path.exists(path) else 0
        with open(path, "w") as f:
            f.write(str(n + 1))
        return n + 1

    a = ctx.step("bump", bump, effect="external")
    if input.get("slowext"):
        a = ctx.step("charge", lambda: time.sleep(input["slowext"]) or 7, effect="external")
    if input.get("slow"):
        ctx.step("slow", lambda: time.sleep(input["slow"]))
    b = ctx.step("double", lambda: a * 2)
    if input.get("sleep"):
        ctx.sleep(input["sleep"])
    approved = ctx.wait_for_message("approval") if input.get("wait") else None
    if input.get("fail"):
        raise ValueError("boom")
    if "part" in input:  # a child of the fan-out below
        with open("part.txt", "w") as f:
            f.write(f"part {input['part']}")
        ctx.save_output("part", "part.txt")
        return input["part"] * 10
    if input.get("fanout"):
        kids = ctx.map([{"part": p} for p in range(input["fanout"])])
        first = ctx.child_output(ctx.spawn({"part": 0}, "map1-0"), "part")
        return {"kids": kids, "first": first}
    if input.get("claude"):
        import anthropic

        reply = anthropic.Anthropic().messages.create(
            model="claude-haiku-4-5", max_tokens=200, messages=[{"role": "user", "content": "Say hi"}]
        )
        return {"text": reply.content[0].text}
    return {"a": a, "b": b, "approved": approved}
"""


def _agent(server: Server, name: str) -> None:
    with server.http() as http:
        uploaded = http.post("/v1/projects/default/agentsources", json={"files": {"main.py": SOURCE}})
        assert uploaded.status_code == 201, uploaded.text
        put = http.put(
            f"{AGENTS}/{name}",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Agent",
                "metadata": {"name": name},
                "spec": {"source": uploaded.json(), "entrypoint": "main:main"},
            },
        )
        assert put.status_code == 201, put.text


def _run(server: Server, input_text: str, **spec: Any) -> str:
    agent, name = unique("py"), unique("pyrun")
    _agent(server, agent)
    with server.http() as http:
        created = http.post(
            RUNS,
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent, "input": input_text, **spec},
            },
        )
        assert created.status_code == 201, created.text
    return name


def _get(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        return http.get(f"{RUNS}/{name}").json()


def _phase(
    server: Server, name: str, phase: str, reason: str | None = None, timeout: float = 90
) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def reached() -> dict[str, Any] | None:
        run = _get(server, name)
        status = last["status"] = run["status"]
        ok = status["phase"] == phase and (reason is None or status.get("reason") == reason)
        return run if ok else None

    try:
        return wait_for(
            reached, timeout=timeout, interval=0.2, message=f"{name} to be {phase} {reason or ''}"
        )
    except AssertionError as late:
        status = last.get("status") or {}
        raise AssertionError(
            f"{late}; it is {status.get('phase')} {status.get('reason')}: {status.get('message')} "
            f"(waitingFor {status.get('waitingFor')})"
        ) from None


def _answer(server: Server, name: str) -> str:
    with server.http() as http:
        return str(http.get(f"{RUNS}/{name}/answer").json().get("answer"))


def test_a_three_step_program_succeeds_with_its_answer(server: Server) -> None:
    name = _run(server, "{}")
    run = _phase(server, name, "Succeeded")
    assert run["status"]["reason"] == "Completed"
    assert '"b": 2' in _answer(server, name)


def test_a_killed_actor_replays_without_running_completed_steps_again(
    server: Server, ray_driver: Any
) -> None:
    from ray.util.state import list_actors

    name = _run(server, '{"slow": 4}')
    workspace = workspace_of(server, name)
    wait_for(lambda: (workspace / "state" / "count").exists(), timeout=60, message="the external step")
    actor_name = _get(server, name)["status"]["actorName"]
    actors = list_actors(filters=[("name", "=", actor_name), ("state", "=", "ALIVE")], detail=True)
    os.kill(int(actors[0].pid), signal.SIGKILL)
    _phase(server, name, "Succeeded", timeout=120)
    assert (workspace / "state" / "count").read_text() == "1", "the external step ran once"
    assert _get(server, name)["status"]["attempts"] >= 2


def test_a_sleep_parks_with_no_actor_and_wakes(server: Server, ray_driver: Any) -> None:
    from ray.util.state import list_actors

    name = _run(server, '{"sleep": 6}')
    waiting = _phase(server, name, "Waiting", "Sleeping")
    assert waiting["status"].get("wakeAt")

    def released() -> bool:
        alive = list_actors(filters=[("state", "=", "ALIVE")], limit=10000, detail=True)
        return not [a for a in alive if f"run=default/{name}," in (getattr(a, "repr_name", "") or "")]

    wait_for(released, timeout=10, interval=0.2, message="the sleeping run's actor to be released")
    assert _get(server, name)["status"]["phase"] == "Waiting", "released while it sleeps"
    run = _phase(server, name, "Succeeded")
    assert run["status"]["attempts"] >= 2, "a new actor woke it"


def test_wait_for_message_and_send(server: Server) -> None:
    name = _run(server, '{"wait": true}')
    waiting = _phase(server, name, "Waiting", "AwaitingMessage")
    assert (waiting["status"].get("waitingFor") or {}).get("message") == "approval"
    with server.http() as http:
        sent = http.post(f"{RUNS}/{name}/messages", json={"payload": "yes", "name": "approval"})
        assert sent.status_code in (200, 201, 202), sent.text
    _phase(server, name, "Succeeded")
    assert '"approved": "yes"' in _answer(server, name)


def test_a_program_that_raises_fails_program_failed(server: Server) -> None:
    name = _run(server, '{"fail": true}')
    run = _phase(server, name, "Failed")
    assert run["status"]["reason"] == "ProgramFailed"
    assert run["status"]["message"].startswith("ValueError: boom")


def test_children_fan_out_and_their_results_and_outputs_come_back(server: Server) -> None:
    name = _run(server, '{"fanout": 3}')
    waiting = _phase(server, name, "Waiting", "AwaitingChildren")
    assert len((waiting["status"].get("waitingFor") or {}).get("children") or []) == 3
    try:
        _phase(server, name, "Succeeded", timeout=60)
    except AssertionError as late:
        kids = [_get(server, f"{name}-map1-{i}")["status"] for i in range(3)]
        raise AssertionError(
            f"{late}; children: {[(k.get('phase'), k.get('reason'), k.get('message')) for k in kids]}"
        ) from None
    answer = _answer(server, name)
    assert '"kids": [\n    0,\n    10,\n    20\n  ]' in answer, answer
    assert '"first": "part 0"' in answer
    child = _get(server, f"{name}-map1-1")
    assert child["status"]["phase"] == "Succeeded" and child["status"].get("parent") == name


def test_the_anthropic_sdk_inside_is_a_journaled_model_step_in_turns(server: Server) -> None:
    name = _run(server, '{"claude": true}')
    run = _phase(server, name, "Succeeded")
    assert '"text":' in _answer(server, name)
    turns = run["status"]["turns"]
    assert len(turns) == 1 and turns[0]["family"] == "haiku" and turns[0]["inputTokens"] > 0
    with server.http() as http:
        steps = http.get(f"{RUNS}/{name}/steps").json()["items"]
    assert [s for s in steps if s.get("kind") == "model"], steps


def test_an_external_step_cut_by_a_crash_waits_for_a_person_and_resumes_with_their_result(
    server: Server, ray_driver: Any
) -> None:
    from ray.util.state import list_actors

    name = _run(server, '{"slowext": 30}')

    def charging() -> bool:
        with server.http() as http:
            steps = http.get(f"{RUNS}/{name}/steps").json()["items"]
        return any(s["id"] == "charge-1" for s in steps)

    wait_for(charging, timeout=60, interval=0.2, message="the external step to start")
    actor_name = _get(server, name)["status"]["actorName"]
    actors = list_actors(filters=[("name", "=", actor_name), ("state", "=", "ALIVE")], detail=True)
    os.kill(int(actors[0].pid), signal.SIGKILL)
    parked = _phase(server, name, "Waiting", "NeedsResolution")
    assert parked["status"]["step"] == "charge-1"
    with server.http() as http:
        resolved = http.post(
            f"{RUNS}/{name}/resolve",
            json={
                "step": "charge-1",
                "decision": "Completed",
                "result": 21,
                "revision": parked["metadata"]["resourceVersion"],
            },
        )
        assert resolved.status_code == 200, resolved.text
    _phase(server, name, "Succeeded")
    assert '"b": 42' in _answer(server, name), "the person's result is the step's"


def test_the_deadline_stops_a_program_that_runs_too_long(server: Server) -> None:
    name = _run(server, '{"slow": 120}', deadline="6s")
    run = _phase(server, name, "Failed", "DeadlineExceeded", timeout=60)
    assert run["status"]["phase"] == "Failed"
    workspace = workspace_of(server, name)
    assert not any(str(workspace) in line for line in os.popen("ps -eo args").read().splitlines()), (
        "no process of the program is left"
    )


CHAT_SOURCE = """
import anthropic


def main(ctx, input):
    state = input if isinstance(input, dict) else {"generation": 0, "answered": 0, "seen": []}
    for _ in range(2):
        text = ctx.wait_for_message("user")
        if text == "/bye":
            return state
        anthropic.Anthropic().messages.create(
            model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": text}]
        )
        state = {**state, "answered": state["answered"] + 1, "seen": state["seen"] + [text]}
    ctx.continue_as_new({**state, "generation": state["generation"] + 1})
"""


def test_continue_as_new_bounds_the_journal_and_carries_input_and_cost(server: Server) -> None:
    from decimal import Decimal

    agent, name = unique("pychat"), unique("pychatrun")
    with server.http() as http:
        uploaded = http.post("/v1/projects/default/agentsources", json={"files": {"main.py": CHAT_SOURCE}})
        assert uploaded.status_code == 201, uploaded.text
        document = {
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": {"name": agent},
            "spec": {"source": uploaded.json(), "entrypoint": "main:main"},
        }
        assert http.put(f"{AGENTS}/{agent}", json=document).status_code == 201
        run = {"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": name}}
        created = http.post(RUNS, json={**run, "spec": {"agent": agent, "input": "hello"}})
        assert created.status_code == 201, created.text
        for text in ["m1", "m2", "m3", "m4", "m5", "/bye"]:
            sent = http.post(f"{RUNS}/{name}/messages", json={"payload": text, "name": "user"})
            assert sent.status_code in (200, 201, 202), sent.text
    done = _phase(server, name, "Succeeded", timeout=120)
    status = done["status"]
    assert status["generation"] >= 2, status
    # Each message was read once over the generations, and the last input carried the state.
    answer = _answer(server, name)
    assert '"answered": 5' in answer and '"generation": 2' in answer, answer
    assert '"m1",\n    "m2",\n    "m3",\n    "m4",\n    "m5"' in answer, answer
    with server.http() as http:
        steps = http.get(f"{RUNS}/{name}/steps").json()["items"]
    ids = [step["id"] for step in steps]
    # The current generation's steps only: message 5, its model call, the /bye.
    assert [i for i in ids if i.startswith("message/")] == ["message/user-1", "message/user-2"], ids
    assert [i for i in ids if i.startswith("model-")] == ["model-1"], ids
    assert "continue-as-new" not in ids, ids
    prior = Decimal(status["cost"]["priorUSD"])
    here = sum((Decimal(step["costUSD"]) for step in steps), Decimal(0))
    assert prior > 0 and here > 0
    assert Decimal(status["cost"]["totalUSD"]) == prior + here, status["cost"]
