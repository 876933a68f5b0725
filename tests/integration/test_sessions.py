"""Session keys and keep-alive group members on the session cluster (decision 48).

A session key names one live keep-alive run per project and agent: the first submit starts
it, the next ones reach it as messages, a finished run frees the key, concurrent submits start
one run, and a key that is not a DNS label is refused naming the field (API, SDK, CLI). A
keep-alive group member answers, waits for a message without holding the group's maxActive
slot, answers the message, and the group's cost cap holds while members wait.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest

import nodus
from nodus import errors

from .conftest import Server, unique, wait_for
from .kit import agent as _agent
from .kit import finished as _finished
from .kit import get_group as _get_group
from .kit import group as _group
from .kit import seal as _seal

RUNS = "/v1/projects/default/agentruns"
V1 = "nodus.dev/v1"


def _get(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        return http.get(f"{RUNS}/{name}").json()


def _answered(server: Server, name: str, turns: int) -> dict[str, Any]:
    """The run once it has answered ``turns`` turns and waits for the next message."""

    def ready() -> dict[str, Any] | None:
        status = _get(server, name)["status"]
        waiting = (status["phase"], status.get("reason")) == ("Waiting", "AwaitingMessage")
        return status if waiting and len(status["turns"]) == turns else None

    return wait_for(ready, timeout=90, interval=0.1, message=f"{name} to answer turn {turns}")


def _cancel(server: Server, name: str) -> None:
    with server.http() as http:
        assert http.post(f"{RUNS}/{name}/cancel").status_code == 200


def _session_run(agent: str, name: str, text: str, key: str) -> dict[str, Any]:
    spec = {"agent": agent, "input": text, "sessionKey": key}
    return {"apiVersion": V1, "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}


# -- session keys ----------------------------------------------------------------------------------


def test_two_submits_with_one_key_reach_one_run_and_a_finished_run_frees_the_key(sdk_env: Server) -> None:
    agent = nodus.ClaudeAgent(unique("session"), system="Answer briefly.")
    first = agent.submit("What is 2 + 2?", session_key="conv-1")
    assert first.answer() == "2 + 2 = 4."
    second = agent.submit("What is 3 + 3?", session_key="conv-1")
    assert second.name == first.name  # the same run, the input as its next message
    assert second.answer() == "3 + 3 = 6."
    status = _answered(sdk_env, first.name, 2)
    assert [turn["prompt"] for turn in status["turns"]] == ["What is 2 + 2?", "What is 3 + 3?"]
    assert _get(sdk_env, first.name)["spec"]["sessionKey"] == "conv-1"

    # The same submit again (an idempotency key) is delivered once.
    again = [agent.submit("What is 4 + 4?", session_key="conv-1", idempotency_key="evt-9") for _ in range(2)]
    assert {run.name for run in again} == {first.name}
    assert again[1].answer() == "4 + 4 = 8."
    assert len(_answered(sdk_env, first.name, 3)["turns"]) == 3

    first.cancel()
    third = agent.submit("What is 5 + 5?", session_key="conv-1")
    assert third.name != first.name  # the cancelled run freed the key
    assert third.answer() == "5 + 5 = 10."
    assert len(_answered(sdk_env, third.name, 1)["turns"]) == 1
    third.cancel()


def test_the_api_says_created_or_delivered_and_concurrent_submits_start_one_run(server: Server) -> None:
    agent = unique("session")
    _agent(server, agent)
    with server.http() as http:
        created = http.post(RUNS, json=_session_run(agent, unique("s"), "What is 1 + 1?", "chat"))
        assert created.status_code == 201 and created.headers["X-Nodus-Result"] == "created", created.text
        holder = created.json()["metadata"]["name"]
        delivered = http.post(RUNS, json=_session_run(agent, unique("s"), "What is 1 + 2?", "chat"))
        assert delivered.status_code == 202 and delivered.headers["X-Nodus-Result"] == "delivered"
        assert delivered.headers["X-Nodus-Message-Seq"] == "1"
        assert delivered.json()["metadata"]["name"] == holder

    key = unique("burst")

    def submit(index: int) -> Any:
        with server.http() as http:
            return http.post(RUNS, json=_session_run(agent, f"{key}-{index}", f"What is {index} + 1?", key))

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(submit, range(6)))
    assert sorted(answer.status_code for answer in answers) == [201, 202, 202, 202, 202, 202]
    assert len({answer.json()["metadata"]["name"] for answer in answers}) == 1
    burst_holder = answers[0].json()["metadata"]["name"]
    with server.http() as http:
        runs = http.get(RUNS, params={"agent": agent}).json()["items"]
    assert sorted(run["metadata"]["name"] for run in runs) == sorted({holder, burst_holder})
    assert len(_answered(server, burst_holder, 6)["turns"]) == 6  # one turn per submit, none lost
    _cancel(server, holder)
    _cancel(server, burst_holder)


def test_a_session_key_that_is_not_a_dns_label_is_refused_everywhere(sdk_env: Server) -> None:
    agent = unique("session")
    _agent(sdk_env, agent)
    with sdk_env.http() as http:
        refused = http.post(RUNS, json=_session_run(agent, unique("s"), "hi", "Not A Label"))
        assert refused.status_code == 422, refused.text
        assert refused.json()["details"]["field"] == "spec.sessionKey"
        in_batch = http.post(
            RUNS,
            json={"apiVersion": V1, "kind": "AgentRunList", "items": [_session_run(agent, "x", "hi", "ok")]},
        )
        assert (
            in_batch.status_code == 422 and in_batch.json()["details"]["field"] == "items[0].spec.sessionKey"
        )
        assert http.get(RUNS, params={"agent": agent}).json()["items"] == []
    with pytest.raises(errors.Invalid) as sdk_refused:
        nodus.ClaudeAgent.from_name(agent).submit("hi", session_key="under_score")
    assert sdk_refused.value.details["field"] == "session_key"
    cli = sdk_env.cli("create", "agentrun", "--agent", agent, "--session-key", "UPPER", "--prompt", "hi")
    assert cli.returncode == 1 and "spec.sessionKey" in cli.stderr, cli.stderr

    made = sdk_env.cli(
        "create", "agentrun", "--agent", agent, "--session-key", "cli-1", "--prompt", "What is 7 + 1?"
    )
    assert made.returncode == 0 and made.stdout.endswith("created (session cli-1)\n"), made.stderr
    sent = sdk_env.cli(
        "create", "agentrun", "--agent", agent, "--session-key", "cli-1", "--prompt", "What is 7 + 2?"
    )
    assert sent.returncode == 0 and sent.stdout.endswith("message delivered (session cli-1)\n"), sent.stderr
    name = made.stdout.split()[0].removeprefix("agentrun/")
    assert [turn["prompt"] for turn in _answered(sdk_env, name, 2)["turns"]] == [
        "What is 7 + 1?",
        "What is 7 + 2?",
    ]
    _cancel(sdk_env, name)


# -- keep-alive group members ----------------------------------------------------------------------


def test_a_keep_alive_member_answers_waits_gets_a_message_and_the_group_cap_holds(sdk_env: Server) -> None:
    agent, name = unique("member"), unique("gk")
    _agent(sdk_env, agent, cap="0.10")
    # One run at a time, and room under the cap for two runs' caps, not three.
    _group(sdk_env, name, agent, limits={"maxActive": 1}, maxCostUSD="0.25")
    group = nodus.AgentGroup.from_name(name)
    a, b, c = group.submit_many(
        [
            {"key": "a", "input": "What is 2 + 2?", "keep_alive": True},
            {"key": "b", "input": "What is 3 + 3?", "keep_alive": True},
            {"key": "c", "input": "What is 4 + 4?"},
        ]
    )

    def capped() -> dict[str, Any]:
        status = _get_group(sdk_env, name)["status"]
        cost = status["cost"]
        assert Decimal(cost["totalUSD"]) + Decimal(cost["reservedUSD"]) <= Decimal("0.25"), status
        return status

    # a answers and waits: it gives its only slot back, so b starts (maxActive 1) and answers too.
    assert _answered(sdk_env, a.name, 1)["answer"]["preview"] == "2 + 2 = 4."
    assert _answered(sdk_env, b.name, 1)["answer"]["preview"] == "3 + 3 = 6."
    # c waits for room under the cap: a and b hold what they may still spend while they wait.
    status = wait_for(
        lambda: (s := capped())["blockedReasons"]["MaxCostReached"] == 1 and s,
        timeout=30,
        message="c to wait for room under the cap",
    )
    assert status["counts"]["waiting"] == 2 and status["waitingReasons"] == {"AwaitingMessage": 2}
    assert _get(sdk_env, c.name)["status"]["phase"] == "Pending"

    # A message to a: it answers again, in the same run.
    a.send("message", "What is 5 + 5?")
    assert a.answer() == "5 + 5 = 10."
    turns = _answered(sdk_env, a.name, 2)["turns"]
    assert [turn["prompt"] for turn in turns] == ["What is 2 + 2?", "What is 5 + 5?"]
    capped()

    # Ending a frees its reservation: c starts and succeeds; the cap still holds.
    a.cancel()
    assert c.wait(timeout=90).phase == "Succeeded"
    capped()
    # Sealed, the group stays Running while b waits for a message, and says so.
    _seal(sdk_env, name)
    waiting = wait_for(
        lambda: "keep-alive run waits for a message" in (capped().get("message") or "") and capped(),
        timeout=30,
        message="the group to say it waits for b",
    )
    assert waiting["phase"] == "Running"
    b.cancel()
    final = _finished(sdk_env, name)["status"]
    assert final["phase"] == "Succeeded" and final["counts"]["succeeded"] == 1
    assert Decimal(final["cost"]["totalUSD"]) <= Decimal("0.25")
