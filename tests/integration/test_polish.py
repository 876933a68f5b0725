"""Issue 18's small things, end to end (decision 49): a BYOK agent on a model the price table
lacks runs and bills nothing, a CLI refusal names its reason code, and a command in progress
shows what it runs and for how long in `nodus agentrun steps`."""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.fakes.anthropic_api import text_reply

from .conftest import Server, unique, wait_for
from .kit import agent as apply_agent
from .test_claude_access import _agent, _requests_for, _run, _settled

UNPRICED = "claude-sonnet-4-5"


def test_a_byok_agent_runs_a_model_the_price_table_lacks_and_says_it_has_no_list_price(
    server: Server, fake_anthropic: Any
) -> None:
    key = f"sk-ant-byok-{uuid.uuid4().hex}"
    secret, agent = unique("anthropic-key"), unique("byok-any")
    created = server.cli("create", "secret", secret, "--from-literal", f"ANTHROPIC_API_KEY={key}")
    assert created.returncode == 0, created.stderr
    _agent(server, agent, model={"access": "BYOK", "name": UNPRICED, "apiKeySecret": secret})
    marker = f"any-{uuid.uuid4().hex[:6]}"
    fake_anthropic.script(text_reply("Hello.", usage={"input_tokens": 50, "output_tokens": 5}))
    run = _settled(server, _run(server, agent, f"{marker}: say hello"))
    assert run["status"]["phase"] == "Succeeded", run["status"]
    [sent] = _requests_for(fake_anthropic, marker)
    assert sent.body["model"] == UNPRICED and sent.api_key == key
    cost, [turn] = run["status"]["cost"], run["status"]["turns"]
    assert cost["totalUSD"] == "0"  # nothing billed
    assert cost["listUSD"] is None and UNPRICED in cost["listNote"]  # and no made-up list cost
    assert (turn["model"], turn["family"], turn["routing"]) == (UNPRICED, "sonnet", "pinned")
    assert turn["listCostUSD"] is None and turn["unpricedModels"] == [UNPRICED]


def test_a_running_command_shows_in_steps_with_its_time_and_a_refusal_names_its_code(
    server: Server,
) -> None:
    agent, name = unique("sleeper"), unique("sleeper-run")
    apply_agent(server, agent)
    created = server.cli(
        "create", "agentrun", name, "--agent", agent, "--prompt", "Use the shell to run `sleep 30`"
    )
    assert created.returncode == 0, created.stderr
    try:

        def running_row() -> str | None:
            listed = server.cli("agentrun", "steps", name)
            rows = [line for line in listed.stdout.splitlines() if "command-1-1" in line]
            return rows[0] if rows and "Started" in rows[0] and "(running " in rows[0] else None

        row = wait_for(running_row, timeout=90, message="the sleep command to show as running")
        assert row is not None and "$ sleep 30 (running " in row
        steps = json.loads(server.cli("agentrun", "steps", name, "-o", "json").stdout)["items"]
        [command] = [step for step in steps if step["kind"] == "command"]
        assert command["summary"] == "$ sleep 30" and command["runningSeconds"] >= 0
        assert command["runningSince"]
    finally:
        cancelled = server.cli("cancel", f"agentrun/{name}")
        assert cancelled.returncode == 0, cancelled.stderr
    # A cancelled run's started command is no longer said to run.
    steps = json.loads(server.cli("agentrun", "steps", name, "-o", "json").stdout)["items"]
    [command] = [step for step in steps if step["kind"] == "command"]
    assert command["state"] == "Started" and "runningSeconds" not in command

    # Refusals name their reason first, in one line: a run that reads no messages, a stopped agent.
    refused = server.cli("agentrun", "send", name, "hello")
    assert refused.returncode == 1 and refused.stderr.startswith("error: NotKeepAlive: "), refused.stderr
    stopped = server.cli("patch", f"agent/{agent}", "--patch", '{"spec":{"state":"Stopped"}}')
    assert stopped.returncode == 0, stopped.stderr
    again = server.cli("create", "agentrun", unique("refused"), "--agent", agent, "--prompt", "hi")
    assert again.returncode == 1
    assert again.stderr.startswith(f"error: AgentStopped: agent {agent!r} is stopped"), again.stderr
    for line in (refused.stderr, again.stderr):
        assert line.count("\n") == 1 and "Traceback" not in line
