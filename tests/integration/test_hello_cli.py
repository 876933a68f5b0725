"""The hello example of document 002, driven through the `nodus` CLI like a user."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from .conftest import Server, unique, wait_for
from .kit import workspace_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hello"


def test_hello_agent_end_to_end(server: Server) -> None:
    applied = server.cli("apply", "-f", str(EXAMPLES / "agent.yaml"))
    assert applied.returncode == 0, applied.stderr
    assert "agent/hello-agent" in applied.stdout
    again = server.cli("apply", "-f", str(EXAMPLES / "agent.yaml"))
    assert again.returncode == 0 and "unchanged" in again.stdout

    assert server.cli("apply", "-f", str(EXAMPLES / "run.yaml")).returncode == 0
    waited = server.cli(
        "wait", "agentrun/hello-agent-run", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=2m"
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr

    as_yaml = yaml.safe_load(server.cli("get", "agentrun/hello-agent-run", "-o", "yaml").stdout)
    status = as_yaml["status"]
    assert status["phase"] == "Succeeded"
    assert status["sandbox"]["backend"] == "bubblewrap"
    assert status["agentRevision"] == 1
    assert status["turns"][0]["model"].startswith("offline-")
    assert status["turns"][0]["routing"] == "jev"
    assert status["turns"][0]["toolCalls"] == 1
    assert "Python 3." in status["answer"]["preview"]
    assert status["startedAt"] and status["finishedAt"] and status["createdAt"]

    as_json = json.loads(server.cli("get", "agentrun/hello-agent-run", "-o", "json").stdout)
    assert as_json["metadata"]["name"] == "hello-agent-run"

    table = server.cli("get", "ar")
    assert table.returncode == 0
    assert "hello-agent-run" in table.stdout and "Succeeded" in table.stdout

    answer = server.cli("agentrun", "answer", "hello-agent-run")
    assert answer.returncode == 0
    assert answer.stdout.strip() == _answer_via_api(server, "hello-agent-run")
    assert "Python 3." in answer.stdout

    steps = server.cli("agentrun", "steps", "hello-agent-run", "-o", "json")
    kinds = [step["kind"] for step in json.loads(steps.stdout)["items"]]
    assert kinds == ["sandbox", "route", "model", "command", "model"]
    assert "python3 --version" in server.cli("agentrun", "steps", "hello-agent-run").stdout


def _answer_via_api(server: Server, name: str) -> str:
    with server.http() as http:
        return http.get(f"/v1/projects/default/agentruns/{name}/answer").json()["answer"].strip()


def test_create_cancel_delete(server: Server) -> None:
    assert server.cli("apply", "-f", str(EXAMPLES / "agent.yaml")).returncode == 0
    name = unique("triage")
    created = server.cli(
        "create", "agentrun", name, "--agent", "hello-agent", "--prompt", "Use the shell to run `sleep 60`"
    )
    assert created.returncode == 0, created.stderr

    def command_started() -> bool:
        steps = json.loads(server.cli("agentrun", "steps", name, "-o", "json").stdout or "{}").get(
            "items", []
        )
        return any(step["kind"] == "command" and step["state"] == "Started" for step in steps)

    wait_for(command_started, timeout=60, message="the sleep command to start")
    workspace = workspace_of(server, name)
    assert workspace.is_dir()

    cancelled = server.cli("cancel", f"agentrun/{name}")
    assert cancelled.returncode == 0, cancelled.stderr
    run = json.loads(server.cli("get", f"agentrun/{name}", "-o", "json").stdout)
    assert run["status"]["phase"] == "Cancelled"
    assert not workspace.exists(), "cancel deletes the sandbox"
    # The sleep was stopped, not waited for: the run ended well before the command would have.
    steps = json.loads(server.cli("agentrun", "steps", name, "-o", "json").stdout)["items"]
    assert [s["state"] for s in steps if s["kind"] == "command"] == ["Started"]

    deleted = server.cli("delete", f"agentrun/{name}")
    assert deleted.returncode == 0, deleted.stderr
    missing = server.cli("get", f"agentrun/{name}")
    assert missing.returncode != 0
    assert "not found" in missing.stderr
    assert not (server.storage / "projects" / "default" / "agentruns" / name).exists()
