"""The Python SDK against the real server: the snippet of document 001 and the run handle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import nodus
from nodus.errors import AgentRunFailed, NotFound

from .conftest import Server, unique
from .kit import workspace_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello" / "main.py"


def test_the_documented_snippet(sdk_env: Server) -> None:
    agent = nodus.ClaudeAgent(unique("helper"), system="You are careful.", families=["haiku", "sonnet"])
    answer = agent.remote("Use the shell to print the Python version")
    assert "Python 3." in answer

    run = agent.submit("Use the shell to count the files in the workspace")
    status = run.wait(timeout=120)
    assert status.phase == "Succeeded"
    assert "0" in run.answer()  # a new workspace holds no files
    kinds = [step.kind for step in run.steps()]
    assert kinds[:3] == ["sandbox", "route", "model"] and "command" in kinds
    assert run.result() == run.answer()


def test_the_example_script_runs(sdk_env: Server) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env=sdk_env.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Python 3." in done.stdout
    assert "command" in done.stdout


def test_agent_revision_is_pinned_by_runs_made_through_the_sdk(sdk_env: Server) -> None:
    name = unique("pinned")
    first = nodus.ClaudeAgent(name, system="first")
    first.deploy()
    run = first.submit("What is 6 * 7?")
    nodus.ClaudeAgent(name, system="second").deploy()
    assert run.result().strip().endswith("42.")
    assert run.status().status.agentRevision == 1


def test_from_name_and_failures(sdk_env: Server) -> None:
    name = unique("fails")
    agent = nodus.ClaudeAgent(name, system="x")
    run = agent.submit("Use the shell to run `sleep 30`", deadline="2s")
    with pytest.raises(AgentRunFailed) as caught:
        run.wait(timeout=120)
    assert "DeadlineExceeded" in str(caught.value) or caught.value.details.get("reason") == "DeadlineExceeded"
    again = nodus.AgentRun.from_name(run.name)
    assert again.status().status.phase == "Failed"
    assert again.status().status.reason == "DeadlineExceeded"
    assert not workspace_of(sdk_env, run.name).exists(), "a passed deadline deletes the sandbox"
    with pytest.raises(NotFound):
        nodus.AgentRun.from_name(unique("missing"))
    with pytest.raises(NotFound):
        nodus.ClaudeAgent.from_name(unique("missing"))


def test_cancel_through_the_sdk(sdk_env: Server) -> None:
    agent = nodus.ClaudeAgent(unique("cancels"), system="x")
    run = agent.submit("Use the shell to run `sleep 60`")
    run.cancel()
    with pytest.raises(AgentRunFailed):
        run.wait(timeout=60)
    assert run.status().status.phase == "Cancelled"
