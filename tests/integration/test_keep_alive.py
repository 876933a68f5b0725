"""Keep-alive runs: a conversation that outlives its turn, messages delivered once, the
deadline while waiting, and no actor while a run waits for a message."""

from __future__ import annotations

from typing import Any

import nodus
from nodus import errors

from .conftest import Server, unique, wait_for
from .kit import workspace_of

AGENTS = "/v1/projects/default/agents"
RUNS = "/v1/projects/default/agentruns"


def _agent(server: Server, name: str) -> None:
    with server.http() as http:
        assert (
            http.put(
                f"{AGENTS}/{name}",
                json={
                    "apiVersion": "nodus.dev/v1",
                    "kind": "Agent",
                    "metadata": {"name": name},
                    "spec": {"system": "Answer briefly."},
                },
            ).status_code
            == 201
        )


def _run(server: Server, agent: str, name: str, text: str, **spec: Any) -> None:
    with server.http() as http:
        created = http.post(
            RUNS,
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent, "input": text, "keepAlive": True, **spec},
            },
        )
        assert created.status_code == 201, created.text


def _get(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        return http.get(f"{RUNS}/{name}").json()


def _awaiting(server: Server, name: str, turns: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        run = _get(server, name)
        status = run["status"]
        waiting = status["phase"] == "Waiting" and status["reason"] == "AwaitingMessage"
        return run if waiting and len(status["turns"]) == turns else None

    return wait_for(ready, timeout=60, interval=0.1, message=f"{name} to answer turn {turns}")


def _send(server: Server, name: str, payload: Any, key: str | None = None) -> Any:
    body: dict[str, Any] = {"payload": payload}
    if key is not None:
        body["messageKey"] = key
    with server.http() as http:
        return http.post(f"{RUNS}/{name}/messages", json=body)


def _live_actors_of(run: str) -> list[Any]:
    from ray.util.state import list_actors

    return [
        a
        for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10000, detail=True)
        if f"run=default/{run}," in (getattr(a, "repr_name", "") or "")
    ]


def test_messages_continue_the_conversation_once_each_and_a_waiting_run_holds_no_actor(
    server: Server, ray_driver: Any
) -> None:
    agent, run = unique("keep"), unique("talk")
    _agent(server, agent)
    _run(server, agent, run, "What is 2 + 2?")
    first = _awaiting(server, run, 1)
    assert first["status"]["answer"]["preview"] == "2 + 2 = 4."
    wait_for(
        lambda: not _live_actors_of(run), timeout=30, interval=0.2, message="the waiting run's actor to go"
    )
    workspace = workspace_of(server, run)
    assert workspace.is_dir(), "a waiting run keeps its sandbox"

    sent = _send(server, run, "What is 3 + 3?", key="k1")
    assert sent.status_code == 202 and sent.json()["seq"] == 1 and sent.json()["duplicate"] is False
    again = _send(server, run, "What is 3 + 3?", key="k1")
    assert again.status_code == 200 and again.json()["duplicate"] is True and again.json()["seq"] == 1
    second = _awaiting(server, run, 2)
    assert second["status"]["answer"]["preview"] == "3 + 3 = 6."
    assert [turn["prompt"] for turn in second["status"]["turns"]] == ["What is 2 + 2?", "What is 3 + 3?"]

    # Two messages at once: read one per turn, in the order they arrived.
    assert _send(server, run, "What is 4 + 4?", key="k2").status_code == 202
    assert _send(server, run, "What is 5 + 5?").status_code == 202
    final = _awaiting(server, run, 4)
    assert final["status"]["answer"]["preview"] == "5 + 5 = 10."
    with server.http() as http:
        steps = http.get(f"{RUNS}/{run}/steps").json()["items"]
        assert http.get(f"{RUNS}/{run}/answer").json()["answer"] == "5 + 5 = 10."
    inbox = [step for step in steps if step["kind"] == "inbox"]
    assert [step["id"] for step in inbox] == ["turn-2/message", "turn-3/message", "turn-4/message"]
    assert all(step["attempts"] == 1 for step in steps), "no step ran twice across the actors"

    with server.http() as http:
        assert http.post(f"{RUNS}/{run}/cancel").json()["status"]["phase"] == "Cancelled"
    finished = _send(server, run, "anything else?")
    assert finished.status_code == 409 and finished.json()["code"] == "AgentRunFinished"
    wait_for(lambda: not workspace.exists(), timeout=30, message="the cancelled run's sandbox to be deleted")


def test_the_deadline_ends_a_waiting_run_without_another_model_call(server: Server) -> None:
    agent, run = unique("keep"), unique("expire")
    _agent(server, agent)
    _run(server, agent, run, "What is 2 + 2?", deadline="8s")
    _awaiting(server, run, 1)

    def expired() -> dict[str, Any] | None:
        status = _get(server, run)["status"]
        return status if status["phase"] == "Failed" else None

    status = wait_for(expired, timeout=30, interval=0.2, message="the deadline")
    assert status["reason"] == "DeadlineExceeded"
    with server.http() as http:
        models = [s for s in http.get(f"{RUNS}/{run}/steps").json()["items"] if s["kind"] == "model"]
    assert len(models) == 1
    assert not workspace_of(server, run).exists()


def test_bad_messages_are_refused_and_change_nothing(server: Server) -> None:
    agent, run, plain = unique("keep"), unique("strict"), unique("plain")
    _agent(server, agent)
    _run(server, agent, run, "What is 2 + 2?")
    with server.http() as http:
        assert (
            http.post(
                RUNS,
                json={
                    "apiVersion": "nodus.dev/v1",
                    "kind": "AgentRun",
                    "metadata": {"name": plain},
                    "spec": {"agent": agent, "input": "What is 1 + 1?"},
                },
            ).status_code
            == 201
        )
    big = _send(server, run, "a" * (256 * 1024 + 1))
    assert big.status_code == 413 and big.json()["details"]["field"] == "payload"
    assert _send(server, run, 42).status_code == 422
    assert _send(server, unique("missing"), "hello").status_code == 404
    not_open = _send(server, plain, "hello")
    assert not_open.status_code == 409 and not_open.json()["code"] == "NotKeepAlive"
    with server.http() as http:
        unknown = http.post(f"{RUNS}/{run}/messages", json={"text": "hi"})
        assert unknown.status_code == 422 and unknown.json()["details"]["field"] == "text"
    status = _awaiting(server, run, 1)["status"]
    assert (status.get("messages") or {}).get("received") is None


def test_the_sdk_submits_a_keep_alive_run_and_sends_it_messages(sdk_env: Server) -> None:
    agent = nodus.ClaudeAgent(unique("sdk-keep"), system="Answer briefly.")
    run = agent.submit("What is 6 + 1?", keep_alive=True)
    assert run.wait(timeout=60).reason == "AwaitingMessage"
    assert run.answer() == "6 + 1 = 7."
    receipt = run.send("message", "What is 6 + 2?", message_key="m-1")
    assert receipt.seq == 1 and not receipt.duplicate
    assert run.send("message", "What is 6 + 2?", message_key="m-1").duplicate
    assert run.wait(timeout=60).reason == "AwaitingMessage"
    assert run.answer() == "6 + 2 = 8."
    run.cancel()
    try:
        run.send("message", "too late")
    except errors.Conflict as refused:
        assert refused.code == "AgentRunFinished"
    else:
        raise AssertionError("a cancelled run took a message")


def test_the_keep_alive_snippet_of_document_001_answers_the_message_sent_right_after_submit(
    sdk_env: Server,
) -> None:
    # Document 001's lines, with arithmetic the offline model answers: send at once, then
    # answer() gives the answer to that message, not an error and not the first turn's answer.
    agent = nodus.ClaudeAgent(unique("helper"), system="You are careful.", families=["haiku", "sonnet"])
    run = agent.submit("What is 40 + 2?", keep_alive=True)
    run.send("message", "What is 40 + 3?")
    assert run.answer() == "40 + 3 = 43."
    turns = [step for step in run.steps() if step.kind == "inbox"]
    assert len(turns) == 1
    run.cancel()
    assert run.status().status.phase == "Cancelled"
