"""ProgramServer over a real Journal on local storage: each request a journaled step.

The program is played by the test (requests handed to `dispatch`, or a tiny client over the
real Unix socket); the ops are fakes. What is checked: replayed steps are answered from the
journal without executing, pure steps write one record and external ones two, an external
step found started parks NeedsResolution, a diverging program fails NonDeterministic, and
``replaying`` says whether recorded steps remain ahead.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from nodus._runtime import protocol as wire
from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import NeedsResolution, Steps
from nodus_ray.runtime.conversation import RunFailure
from nodus_ray.runtime.program.server import ProgramServer
from nodus_ray.store.storage import Storage

PREFIX = "projects/p/agentruns/r/journal"


class FakeOps:
    def __init__(self) -> None:
        self.external: list[str] = []
        self.calls: list[str] = []

    async def _value(self, step_id: str, request: Any) -> Any:
        self.calls.append(step_id)
        return {"step": step_id}

    model = sleep = wait_for_message = spawn = gather = child_output = send = save_output = _value

    async def after_external(self, step_id: str) -> None:
        self.external.append(step_id)

    def replayed(self, step_id: str) -> None:
        self.calls.append(f"replayed {step_id}")


def journal(tmp_path: Path) -> Journal:
    j = Journal(Storage(str(tmp_path / "store")), PREFIX)
    j.load()
    return j


def server(tmp_path: Path, ops: FakeOps | None = None) -> ProgramServer:
    return ProgramServer(Steps(journal(tmp_path)), ops or FakeOps(), {"input": {"x": 1}, "run": "r"})


async def play(srv: ProgramServer, requests: list[wire.Request]) -> list[wire.Reply | None]:
    return [await srv.dispatch(request) for request in requests]


def steps_program(values: list[int], effect: str = "pure") -> list[wire.Request]:
    requests: list[wire.Request] = [wire.Hello()]
    for value in values:
        requests += [wire.StepBegin("add", effect), wire.StepEnd("add", value)]
    return requests


def test_hello_answers_the_runs_facts_and_steps_are_numbered_by_the_actor(tmp_path: Path) -> None:
    srv = server(tmp_path)
    replies = asyncio.run(play(srv, steps_program([1, 2])))
    assert replies[0] is not None and replies[0].value == {"input": {"x": 1}, "run": "r"}
    # A pure step's end is not answered (the program goes on at once); the record is written.
    assert [None if r is None else r.outcome for r in replies[1:]] == ["execute", None, "execute", None]
    records = journal(tmp_path).records
    assert [(r.step_id, r.state) for r in records] == [("add-1", "Completed"), ("add-2", "Completed")]
    assert records[1].payload["result"] == 2


def test_a_replay_answers_from_the_journal_and_says_when_it_caught_up(tmp_path: Path) -> None:
    asyncio.run(play(server(tmp_path), steps_program([10, 20])))
    srv = server(tmp_path)
    hello, first, second, third = asyncio.run(
        play(srv, [wire.Hello(), wire.StepBegin("add"), wire.StepBegin("add"), wire.StepBegin("add")])
    )
    assert hello is not None and hello.replaying
    assert first is not None and (first.outcome, first.value, first.replaying) == ("recorded", 10, True)
    assert second is not None and (second.outcome, second.value, second.replaying) == ("recorded", 20, False)
    assert third is not None and third.outcome == "execute"


def test_a_failed_step_replays_its_error(tmp_path: Path) -> None:
    error = wire.ErrorInfo("builtins.ValueError", "bad", "Traceback...")
    asyncio.run(play(server(tmp_path), [wire.Hello(), wire.StepBegin("s"), wire.StepFail("s", error)]))
    replies = asyncio.run(play(server(tmp_path), [wire.Hello(), wire.StepBegin("s")]))
    assert replies[1] is not None and replies[1].outcome == "recorded" and replies[1].error == error


def test_external_steps_write_started_and_an_interrupted_one_needs_a_person(tmp_path: Path) -> None:
    ops = FakeOps()
    asyncio.run(play(server(tmp_path, ops), steps_program([1], "external")))
    assert [r.state for r in journal(tmp_path).records] == ["Started", "Completed"]
    assert ops.external == ["add-1"], "the workspace is snapshotted after an external step"
    # Interrupted: Started written, the program died before StepEnd.
    srv = server(tmp_path)
    asyncio.run(
        play(srv, [wire.Hello(), wire.StepBegin("add", "external"), wire.StepBegin("add", "external")])
    )
    srv = server(tmp_path)

    async def replay() -> wire.Reply | None:
        await srv.start(tmp_path / "unused.sock")
        replies = await play(
            srv, [wire.Hello(), wire.StepBegin("add", "external"), wire.StepBegin("add", "external")]
        )
        with pytest.raises(NeedsResolution):
            await srv.finished()
        await srv.close()
        return replies[-1]

    last = asyncio.run(replay())
    assert last is not None and last.outcome == "park"
    assert journal(tmp_path).records[-1].state == "NeedsResolution"


def test_a_pure_step_interrupted_simply_runs_again(tmp_path: Path) -> None:
    asyncio.run(play(server(tmp_path), [wire.Hello(), wire.StepBegin("add")]))  # died mid-step
    assert journal(tmp_path).records == []
    replies = asyncio.run(play(server(tmp_path), [wire.Hello(), wire.StepBegin("add")]))
    assert replies[1] is not None and replies[1].outcome == "execute"


def test_a_program_that_diverges_fails_naming_both_steps(tmp_path: Path) -> None:
    asyncio.run(play(server(tmp_path), steps_program([1])))
    srv = server(tmp_path)

    async def diverge() -> wire.Reply | None:
        await srv.start(tmp_path / "d.sock")
        reply = (await play(srv, [wire.Hello(), wire.StepBegin("other")]))[-1]
        with pytest.raises(RunFailure) as failed:
            await srv.finished()
        assert failed.value.reason == "NonDeterministic"
        assert "add-1" in failed.value.message and "other-1" in failed.value.message
        await srv.close()
        return reply

    reply = asyncio.run(diverge())
    assert reply is not None and reply.outcome == "fatal"


def test_the_actors_ops_get_their_step_ids(tmp_path: Path) -> None:
    ops = FakeOps()
    asyncio.run(
        play(
            server(tmp_path, ops),
            [
                wire.Hello(),
                wire.ModelCall({"messages": []}),
                wire.Sleep(seconds=1),
                wire.WaitForMessage("approval"),
                wire.WaitForMessage("approval"),
                wire.Spawn({"p": 1}, "part-0"),
                wire.Gather(["r-part-0"]),
                wire.ChildOutput("r-part-0", "report"),
                wire.Send("other", "ping"),
                wire.SaveOutput("report", "report.md"),
            ],
        )
    )
    assert ops.calls == [
        "model-1",
        "sleep-1",
        "message/approval-1",
        "message/approval-2",
        "spawn/part-0",
        "gather-1",
        "child-output-1",
        "send-1",
        "output/report-1",
    ]


def test_the_program_over_the_socket(tmp_path: Path) -> None:
    """A tiny client speaking the protocol over the real Unix socket, then Return."""
    path = tmp_path / "runtime.sock"

    def client() -> list[dict[str, Any]]:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(path))
            stream = sock.makefile("rwb")
            answers = []
            for request in [*steps_program([5]), wire.Log("hi\n"), wire.Return({"ok": True})]:
                stream.write(wire.encode(request))
                stream.flush()
                if not isinstance(request, wire.Log | wire.StepEnd):  # neither is answered
                    answers.append(json.loads(stream.readline()))
            return answers

    logs: list[str] = []

    async def main() -> Any:
        srv = ProgramServer(Steps(journal(tmp_path)), FakeOps(), {}, on_log=lambda log: logs.append(log.text))
        await srv.start(path)
        answers = await asyncio.to_thread(client)
        end = await srv.finished()
        await srv.close()
        return answers, end

    answers, end = asyncio.run(main())
    assert [a["outcome"] for a in answers] == ["ok", "execute", "ok"]
    assert end.value == {"ok": True} and logs == ["hi\n"]


def test_a_thousand_pure_steps_write_one_record_each_and_replay_writes_none(tmp_path: Path) -> None:
    """One journal object per pure step, and a replay of them all answers from the journal
    without a write (their speed is `benchmarks/python_agents.py`'s, not a test's)."""
    asyncio.run(play(server(tmp_path), steps_program(list(range(1000)))))
    assert len(journal(tmp_path).records) == 1000
    replies = asyncio.run(
        play(server(tmp_path), [wire.Hello(), *[wire.StepBegin("add") for _ in range(1000)]])
    )
    assert [r.value for r in replies[1:] if r is not None] == list(range(1000))
    assert [r.replaying for r in replies[1:] if r is not None][-2:] == [True, False]
    assert len(journal(tmp_path).records) == 1000


def test_a_retried_failed_step_runs_again_as_its_next_attempt(tmp_path: Path) -> None:
    error = wire.ErrorInfo("builtins.ValueError", "flaky")
    asyncio.run(play(server(tmp_path), [wire.Hello(), wire.StepBegin("s"), wire.StepFail("s", error)]))
    j = journal(tmp_path)  # what retry does (`control.run_controls`): the failure is forgotten
    j.append("s-1", "step", "NoEffect", {"summary": "retried"}, attempt=1)
    replies = asyncio.run(play(server(tmp_path), [wire.Hello(), wire.StepBegin("s"), wire.StepEnd("s", 3)]))
    assert replies[1] is not None and replies[1].outcome == "execute"
    last = journal(tmp_path).records[-1]
    assert (last.state, last.attempt, last.payload["result"]) == ("Completed", 2, 3)


def test_a_model_call_inside_a_step_is_nested_and_skipped_when_the_step_replays(tmp_path: Path) -> None:
    class Recording(FakeOps):
        async def model(self, step_id: str, request: Any) -> Any:  # journaled, as ModelCalls does
            begun = await srv.steps.begin(step_id, "model", write_started=False)
            if begun.recorded:
                return begun.value
            self.calls.append(step_id)
            await srv.steps.end(step_id, "model", {"text": "hi"}, attempt=begun.attempt)
            return {"text": "hi"}

    ops = Recording()
    srv = server(tmp_path, ops)
    program: list[wire.Request] = [
        wire.Hello(),
        wire.StepBegin("ask"),
        wire.ModelCall({"messages": []}),
        wire.StepEnd("ask", "hi"),
        wire.StepBegin("after"),
    ]
    asyncio.run(play(srv, program))
    assert ops.calls == ["ask-1/model-1"]
    ops = Recording()
    srv = server(tmp_path, ops)
    replies = asyncio.run(play(srv, [wire.Hello(), wire.StepBegin("ask"), wire.StepBegin("after")]))
    assert replies[1] is not None and (replies[1].outcome, replies[1].value) == ("recorded", "hi")
    assert replies[2] is not None and replies[2].outcome == "execute", (
        "no divergence: the nested call was skipped"
    )
    assert ops.calls == ["replayed ask-1/model-1"], "its charge is counted again, the call not made again"


def test_a_step_cut_after_its_model_call_runs_again_and_its_call_is_replayed(tmp_path: Path) -> None:
    made: list[str] = []

    def serve() -> ProgramServer:
        srv = server(tmp_path)

        async def model(step_id: str, request: Any) -> Any:
            begun = await srv.steps.begin(step_id, "model", write_started=False)
            if begun.recorded:
                return begun.value
            made.append(step_id)
            await srv.steps.end(step_id, "model", {"text": "hi"}, attempt=begun.attempt)
            return {"text": "hi"}

        srv.ops.model = model  # type: ignore[method-assign]
        return srv

    cut = [wire.Hello(), wire.StepBegin("ask"), wire.ModelCall({"messages": []})]
    asyncio.run(play(serve(), cut))  # the process died before StepEnd
    replies = asyncio.run(play(serve(), [*cut, wire.StepEnd("ask", "hi"), wire.StepBegin("after")]))
    outcomes = [None if r is None else r.outcome for r in replies]
    # A pure step's end is not answered: the program goes on at once.
    assert outcomes == ["ok", "execute", "recorded", None, "execute"]
    assert made == ["ask-1/model-1"], "the call was made once"


def test_a_program_that_gives_up_inside_a_step_fails_with_what_it_said(tmp_path: Path) -> None:
    # A step whose value is not JSON: the program's side says so with a Raise while the step is
    # open, and the run must fail with that message (naming the step), not a protocol error.
    srv = server(tmp_path)
    said = wire.ErrorInfo("builtins.TypeError", "step bad returned a value that is not JSON-serialisable")

    async def program() -> Any:
        srv._finished = asyncio.get_running_loop().create_future()
        replies = await play(srv, [wire.Hello(), wire.StepBegin("bad", "external"), wire.Raise(said)])
        return replies, await srv.finished()

    replies, end = asyncio.run(program())
    assert [r.outcome for r in replies if r is not None] == ["ok", "execute", "ok"]
    assert end.error == said


def test_secret_values_are_masked_in_what_the_program_hands_over_before_it_is_kept(tmp_path: Path) -> None:
    from nodus_ray.core.redaction import Redactor

    secret = "tok-0123456789abcdef"
    srv = ProgramServer(Steps(journal(tmp_path)), FakeOps(), {}, redact=Redactor({"api/TOKEN": secret}))
    leaked = wire.ErrorInfo("builtins.ValueError", f"bad token {secret}", f"line 3: {secret}")

    async def program() -> Any:
        srv._finished = asyncio.get_running_loop().create_future()
        await play(
            srv,
            [
                wire.Hello(),
                wire.StepBegin("read"),
                wire.StepEnd("read", {"token": secret}),
                wire.StepBegin("use"),
                wire.StepFail("use", leaked),
                wire.Raise(leaked),
            ],
        )
        return await srv.finished()

    end = asyncio.run(program())
    kept = json.dumps([r.payload for r in journal(tmp_path).records])
    assert secret not in kept and "[REDACTED:api/TOKEN]" in kept
    assert end.error is not None and secret not in end.error.message + end.error.traceback
