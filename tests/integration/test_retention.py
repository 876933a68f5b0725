"""Retention on the real service: payloads expire on schedule, the run and its totals stay.

The session gives one project, ``RETENTION_PROJECT``, a retention of seconds (its workspace
goes 2 s after a run ends, its payloads 4 s after): every other project keeps the shipped
defaults, so no other test's run loses anything while it is read. The test waits for the
conditions (``status.sandbox.workspaceDeletedAt``, then ``status.payloadsExpiredAt``), never
for an amount of time.
"""

from __future__ import annotations

from typing import Any

import pytest

import nodus
from nodus.errors import PayloadExpired

from .conftest import RETENTION_PROJECT, Server, unique, wait_for
from .kit import workspace_of

RUNS = f"/v1/projects/{RETENTION_PROJECT}/agentruns"


def _run(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        response = http.get(f"{RUNS}/{name}")
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def test_payloads_and_the_workspace_expire_on_schedule_and_the_run_and_its_totals_remain(
    sdk_env: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = sdk_env
    monkeypatch.setenv("NODUS_PROJECT", RETENTION_PROJECT)
    agent = nodus.ClaudeAgent(
        unique("keeper"), system="Answer in one sentence.", families=["haiku"], project=RETENTION_PROJECT
    )
    # A keep-alive run that waits for its next message is unfinished: it keeps everything.
    alive = agent.submit("Say hello", keep_alive=True)
    alive.wait(timeout=120)
    alive_answer = alive.answer()
    assert _run(server, alive.name)["status"]["phase"] == "Waiting"

    run = agent.submit("Use the shell to print the Python version")
    status = run.wait(timeout=120)
    assert status.phase == "Succeeded"
    answer = run.answer()
    assert "Python 3." in answer
    before = _run(server, run.name)
    steps_before = [(s["id"], s["kind"], s["state"], s["attempts"], s["costUSD"]) for s in run.steps()]
    assert any(kind == "command" for _, kind, *_ in steps_before)
    workspace = workspace_of(server, run.name, RETENTION_PROJECT)

    deleted = wait_for(
        lambda: _run(server, run.name)["status"]["sandbox"].get("workspaceDeletedAt"),
        timeout=120,
        message="the run's workspace deleted (2 s after it ended)",
    )
    assert deleted > before["status"]["finishedAt"]
    assert not workspace.exists()

    expired = wait_for(
        lambda: _run(server, run.name)["status"].get("payloadsExpiredAt"),
        timeout=120,
        message="the run's payloads expired (4 s after it ended)",
    )
    assert expired > before["status"]["finishedAt"]
    after = _run(server, run.name)
    wait_for(
        lambda: (_run(server, run.name)["status"].get("retention") or {}).get("payloads") == "Expired",
        timeout=60,
        message="the expiry finished",
    )

    # The SDK: reading the answer raises PayloadExpired; the run and its totals remain.
    with pytest.raises(PayloadExpired) as raised:
        run.answer()
    assert raised.value.code == "PayloadExpired" and raised.value.status == 410
    assert after["status"]["phase"] == "Succeeded"
    assert after["status"]["cost"]["totalUSD"] == before["status"]["cost"]["totalUSD"]
    assert after["spec"]["input"] == "" and after["status"]["answer"]["preview"] == ""
    assert after["status"]["answer"]["bytes"] == before["status"]["answer"]["bytes"]
    for turn, was in zip(after["status"]["turns"], before["status"]["turns"], strict=True):
        assert turn["prompt"] == "" and turn["costUSD"] == was["costUSD"]
        assert (turn["inputTokens"], turn["outputTokens"]) == (was["inputTokens"], was["outputTokens"])

    # The steps' skeleton stays: ids, kinds, states, attempts, costs; no values.
    steps_after = run.steps()
    assert [
        (s["id"], s["kind"], s["state"], s["attempts"], s["costUSD"]) for s in steps_after
    ] == steps_before
    assert "Python 3." not in repr([step.to_dict() for step in steps_after])

    # The API: 410 with the reason; the CLI: one line naming PayloadExpired, exit code not 0.
    with server.http() as http:
        response = http.get(f"{RUNS}/{run.name}/answer")
    assert response.status_code == 410 and response.json()["code"] == "PayloadExpired"
    cli = server.cli("agentrun", "answer", run.name, "-p", RETENTION_PROJECT)
    assert cli.returncode != 0
    assert "PayloadExpired" in cli.stderr and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    steps = server.cli("agentrun", "steps", run.name, "-p", RETENTION_PROJECT)
    assert steps.returncode == 0, steps.stderr

    # Storage holds no answer, and the journal is its skeleton alone.
    store = server.store()
    prefix = f"projects/{RETENTION_PROJECT}/agentruns/{run.name}"
    assert not store.exists(f"{prefix}/answer.txt")
    journal = store.list_dir(f"{prefix}/journal")
    assert len(journal) == 1 and journal[0].endswith(".skeleton.arrow"), journal

    # The keep-alive run, unfinished all along, kept its payloads.
    waiting = _run(server, alive.name)
    assert waiting["status"]["phase"] == "Waiting" and waiting["status"].get("payloadsExpiredAt") is None
    assert waiting["spec"]["input"] == "Say hello"
    assert alive.answer() == alive_answer
    alive.cancel()
