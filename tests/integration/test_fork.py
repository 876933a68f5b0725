"""Forking a run (decision 58) on the session's real service: offline model, real sandbox, storage.

A run's offline model runs the commands of its ``run:`` prompt one per line, so a run whose
commands append to a file shows, in that file, which of them ran and how often. A fork at a
middle command keeps the steps before it (not run again: the file says so), starts from the
workspace snapshot taken there (the command that lists the files says so), runs the rest
itself and succeeds; the original is unchanged. Then a fork with a new prompt, a keep-alive
conversation branched at its second message, and the refusals through the API and the CLI.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import nodus
from nodus.errors import Invalid

from .conftest import Server, unique, wait_for
from .kit import RUNS, V1, agent, workspace_of

_COMMANDS = "\n".join(
    [
        "run: echo one >> log.txt",
        "echo two > two.txt",
        "find . -type f | sort | tr '\\n' ' '",
        "echo three >> log.txt",
    ]
)
_KEPT = ("phase", "reason", "turns", "answer", "cost")
_MIDDLE = "turn-1/command-1-3"  # the listing command: step 6 (sandbox, route, model-1, 3 commands)


def _create(server: Server, name: str, agent_name: str, text: str, **spec: Any) -> None:
    with server.http() as http:
        response = http.post(
            RUNS,
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent_name, "input": text, **spec},
            },
        )
        assert response.status_code == 201, response.text


def _run(server: Server, name: str) -> dict[str, Any]:
    with server.http() as http:
        response = http.get(f"{RUNS}/{name}")
        assert response.status_code == 200, response.text
        return dict(response.json())


def _finished(server: Server, name: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        run = _run(server, name)
        return run if run["status"]["phase"] in ("Succeeded", "Failed", "Cancelled") else None

    run: dict[str, Any] = wait_for(ended, timeout=180, message=f"agentrun {name} to finish")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    return run


def _steps(server: Server, name: str) -> list[dict[str, Any]]:
    with server.http() as http:
        response = http.get(f"{RUNS}/{name}/steps")
        assert response.status_code == 200, response.text
        return list(response.json()["items"])


def _output(step: dict[str, Any]) -> str:
    return str((step["detail"].get("result") or {}).get("output", "")).strip()


def _same(step: dict[str, Any]) -> tuple[Any, ...]:
    """What a copied step shares with the original's (its cost is the original's, not the fork's)."""
    return (step["id"], step["kind"], step["state"], step["summary"], step["startedAt"], _output(step))


def test_a_fork_at_a_middle_command_keeps_what_came_before_and_goes_on(sdk_env: Server) -> None:
    server = sdk_env
    agent_name, source = unique("fork-agent"), unique("fork-src")
    agent(server, agent_name)
    _create(server, source, agent_name, _COMMANDS)
    original = _finished(server, source)
    before = _steps(server, source)
    ids = [step["id"] for step in before]
    assert ids.index(_MIDDLE) == 5, ids
    assert _output(before[5]) == "./log.txt ./two.txt"
    assert (workspace_of(server, source) / "log.txt").read_text() == "one\nthree\n"

    forked = nodus.AgentRun(source).fork(at=6, name=f"{source}-b")
    assert forked.name == f"{source}-b"
    fork = _finished(server, forked.name)
    assert fork["status"]["forkedFrom"]["run"] == source
    assert fork["status"]["forkedFrom"]["step"] == _MIDDLE and fork["status"]["forkedFrom"]["stepNumber"] == 6
    steps = _steps(server, forked.name)
    assert [step["id"] for step in steps] == ids, "the same program: the same steps"
    assert [_same(step) for step in steps[:5]] == [_same(step) for step in before[:5]], "copied, not redone"
    assert {step["costUSD"] for step in steps[:5]} == {"0"}, "the original paid for them"
    assert steps[5]["startedAt"] != before[5]["startedAt"], "the step named ran again"
    assert _output(steps[5]) == "./log.txt ./two.txt", "the workspace as it was after command 2"
    workspace = workspace_of(server, forked.name)
    assert workspace != workspace_of(server, source)
    assert (workspace / "log.txt").read_text() == "one\nthree\n", "command 1 ran once, in the original"
    assert sorted(p.name for p in workspace.iterdir()) == ["log.txt", "two.txt"]
    own = sum((Decimal(step["costUSD"]) for step in steps[5:]), Decimal(0))
    copied = sum((Decimal(step["costUSD"]) for step in before[:5]), Decimal(0))
    assert Decimal(fork["status"]["cost"]["totalUSD"]) == own, "only what the fork did itself"
    assert own == Decimal(original["status"]["cost"]["totalUSD"]) - copied, (
        "the same calls after the boundary"
    )

    after = _run(server, source)["status"]
    assert [after[k] for k in _KEPT] == [original["status"][k] for k in _KEPT], "the original is unchanged"
    assert _steps(server, source) == before


def test_a_fork_with_a_new_prompt_and_a_branched_conversation(sdk_env: Server) -> None:
    server = sdk_env
    agent_name, source = unique("fork-agent"), unique("fork-src")
    agent(server, agent_name)
    _create(server, source, agent_name, _COMMANDS)
    _finished(server, source)
    client = nodus.Client()
    prompt = client.fork_run(source, "turn-1/route", input="run: echo other > other.txt")
    assert prompt["spec"]["input"] == "run: echo other > other.txt"
    _finished(server, prompt["metadata"]["name"])
    assert sorted(p.name for p in workspace_of(server, prompt["metadata"]["name"]).iterdir()) == ["other.txt"]

    chat = unique("fork-chat")
    _create(server, chat, agent_name, "run: echo a >> log.txt", keepAlive=True)

    def answered(turns: int) -> bool:
        status = _run(server, chat)["status"]
        return status["phase"] == "Waiting" and len(status.get("turns") or []) == turns

    wait_for(lambda: answered(1), timeout=180, message="turn 1 answered")
    client.send_message(chat, "run: echo b >> log.txt")
    wait_for(lambda: answered(2), timeout=180, message="turn 2 answered")
    assert (workspace_of(server, chat) / "log.txt").read_text() == "a\nb\n"
    branch = client.fork_run(chat, "turn-2/message", new_name=f"{chat}-c", input="run: echo c >> log.txt")
    assert branch["status"]["forkedFrom"]["input"] == "message"

    def branch_answered() -> bool:
        status = _run(server, f"{chat}-c")["status"]
        return status["phase"] == "Waiting" and len(status.get("turns") or []) == 2

    wait_for(branch_answered, timeout=180, message="the branch's turn 2 answered")
    assert (workspace_of(server, f"{chat}-c") / "log.txt").read_text() == "a\nc\n"
    assert (workspace_of(server, chat) / "log.txt").read_text() == "a\nb\n", "the original is untouched"
    for name in (chat, f"{chat}-c"):
        client.cancel_run(name)


def test_bad_forks_are_refused_through_the_api_sdk_and_cli(sdk_env: Server) -> None:
    server = sdk_env
    agent_name, source = unique("fork-agent"), unique("fork-src")
    agent(server, agent_name)
    _create(server, source, agent_name, "What is 2 + 2?")
    _finished(server, source)
    fork = f"{RUNS}/{source}/fork"
    cases: list[tuple[str, dict[str, Any], int, str, str]] = [
        (fork, {"at": 99}, 422, "Invalid", "at"),
        (fork, {}, 422, "Invalid", "at"),
        (fork, {"at": "turn-7/model-1"}, 422, "Invalid", "at"),
        (fork, {"at": 3, "input": "x"}, 422, "Invalid", "at"),
        (fork, {"at": 1, "name": "Bad_Name"}, 422, "Invalid", "name"),
        (fork, {"at": 1, "bogus": True}, 422, "Invalid", "bogus"),
        (fork, {"at": 1, "name": source}, 409, "AlreadyExists", ""),
        (f"{RUNS}/{unique('nope')}/fork", {"at": 1}, 404, "NotFound", ""),
    ]
    with server.http() as http:
        for path, body, status, code, field in cases:
            response = http.post(path, json=body)
            assert response.status_code == status, (body, response.text)
            error = response.json()
            assert error["code"] == code and error["message"], (body, error)
            if field:
                assert error["details"]["field"] == field, (body, error)
    try:
        nodus.AgentRun(source).fork(at=99)
    except Invalid as refused:
        assert "step 99 does not exist" in refused.message
    else:  # pragma: no cover
        raise AssertionError("a fork at a step that does not exist was accepted")
    cli = server.cli("agentrun", "fork", source, "--at", "99")
    assert cli.returncode != 0
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: Invalid: at: step 99 does not exist"), cli.stderr
    ok = server.cli("agentrun", "fork", source, "--at", "1", "--name", f"{source}-cli")
    assert ok.returncode == 0, ok.stderr
    assert f"agentrun/{source}-cli forked from agentrun/{source} at step 1 (sandbox)" in ok.stdout
    _finished(server, f"{source}-cli")


_PROGRAM = """
def main(ctx, input):
    def add(text):
        with open("log.txt", "a") as f:
            f.write(text + "\\n")
        return text

    ctx.step("one", lambda: add("one"), effect="external")
    ctx.step("two", lambda: add("two"), effect="external")
    ctx.step("three", lambda: add(input.get("third", "three")), effect="external")
    return open("log.txt").read()
"""


def test_a_python_programs_fork_replays_its_first_steps_on_their_workspace(sdk_env: Server) -> None:
    server = sdk_env
    agent_name, source = unique("fork-py"), unique("fork-pyrun")
    with server.http() as http:
        uploaded = http.post("/v1/projects/default/agentsources", json={"files": {"main.py": _PROGRAM}})
        assert uploaded.status_code == 201, uploaded.text
        spec = {"source": uploaded.json(), "entrypoint": "main:main"}
        document = {"apiVersion": V1, "kind": "Agent", "metadata": {"name": agent_name}, "spec": spec}
        assert http.put(f"/v1/projects/default/agents/{agent_name}", json=document).status_code == 201
    _create(server, source, agent_name, "{}")
    _finished(server, source)
    ids = [step["id"] for step in _steps(server, source)]
    assert ids.index("three-1") > ids.index("two-1") > ids.index("one-1"), ids  # {name}-{n}
    client = nodus.Client()
    fork = client.fork_run(source, "three-1")["metadata"]["name"]
    _finished(server, fork)
    assert (workspace_of(server, fork) / "log.txt").read_text() == "one\ntwo\nthree\n", "one and two ran once"
    with server.http() as http:
        refused = http.post(f"{RUNS}/{source}/fork", json={"at": "three-1", "input": '{"third": "3"}'})
    assert refused.status_code == 422 and "reads its input once" in refused.json()["message"]
    fresh = client.fork_run(source, 1, input='{"third": "3"}')["metadata"]["name"]
    _finished(server, fresh)
    assert (workspace_of(server, fresh) / "log.txt").read_text() == "one\ntwo\n3\n"
