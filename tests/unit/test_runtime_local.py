"""Agent.local's runtime (`run_local`) and the definition's rules: steps journaled in memory with
the actor's ids, map over in-process children, messages, outputs, continue_as_new, and what a
step is outside a run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nodus._runtime.definition import ProgramDefinition
from nodus._runtime.local import run_local
from nodus.errors import AgentRunFailed, Conflict, Unsupported


def test_steps_run_once_each_with_the_actors_ids_and_their_json_value() -> None:
    agent = ProgramDefinition()
    calls: list[int] = []

    @agent.step(effect="idempotent")
    def fetch(n: int) -> Any:
        calls.append(n)
        return (n, n * 2)  # a tuple: JSON makes it a list, on the first run as on a replay

    @agent.step(name="outer")
    def outer() -> int:
        return int(fetch(100)[0]) + 1  # nested: a plain call inside the step, not journaled

    @agent.entrypoint
    def main(ctx: Any, input: dict[str, int]) -> Any:
        values = [fetch(input["n"]), fetch(input["n"] + 1), outer(), ctx.step("fetch", lambda: "direct")]
        ctx.sleep("10m")
        ctx.sleep_until("2099-01-01T00:00:00Z")
        return values

    journal: list[dict[str, Any]] = []
    assert run_local(agent, {"n": 1}, journal=journal) == [[1, 2], [2, 4], 101, "direct"]
    assert calls == [1, 2, 100]
    assert [(e["id"], e["kind"]) for e in journal] == [
        ("fetch-1", "step"),
        ("fetch-2", "step"),
        ("outer-1", "step"),
        ("fetch-3", "step"),
        ("sleep-1", "sleep"),
        ("sleep-2", "sleep"),
    ]
    assert journal[-1]["value"].startswith("2099-01-01")  # the virtual clock, not a wait
    assert fetch(5) == (5, 10)  # outside a run a step is a plain call (JSON only in a run)


def test_a_step_result_that_is_not_json_fails_naming_the_step_and_ctx_in_a_step_is_refused() -> None:
    agent = ProgramDefinition()

    @agent.step
    def fetch_issue() -> Any:
        return {"labels": {"bug"}}

    @agent.entrypoint
    def main(ctx: Any, input: Any) -> Any:
        return fetch_issue()

    with pytest.raises(TypeError, match="step fetch_issue returned a value that is not JSON-serialisable"):
        run_local(agent)

    inner = ProgramDefinition()

    @inner.entrypoint
    def sleepy(ctx: Any, input: Any) -> Any:
        return ctx.step("nap", lambda: ctx.sleep(1))

    with pytest.raises(RuntimeError, match=r"ctx.sleep\(\) cannot be called inside a running step"):
        run_local(inner)


def test_map_runs_children_in_process_and_gather_reports_a_failed_child() -> None:
    agent = ProgramDefinition()

    @agent.entrypoint
    def main(ctx: Any, input: Any) -> Any:
        if isinstance(input, dict):
            if input["part"] == 9:
                raise ValueError("part 9 is broken")
            return input["part"] * 10
        first = ctx.map([{"part": p} for p in range(3)])
        again = ctx.map([{"part": 4}])
        broken = ctx.spawn({"part": 9}, key="broken")
        gathered = ctx.gather([broken], return_exceptions=True)
        try:
            ctx.gather([broken])
            raised = None
        except AgentRunFailed as exc:
            raised = str(exc)
        return {"first": first, "again": again, "gathered": repr(gathered[0]), "raised": raised}

    journal: list[dict[str, Any]] = []
    out = run_local(agent, "root", journal=journal)
    assert out["first"] == [0, 10, 20] and out["again"] == [40]
    assert "AgentRunFailed" in out["gathered"]
    assert out["raised"] == "agentrun/local-broken: Failed (ProgramFailed): ValueError: part 9 is broken"
    spawned = [e["value"]["name"] for e in journal if e["kind"] == "spawn"]
    assert spawned == ["local-map1-0", "local-map1-1", "local-map1-2", "local-map2-0", "local-broken"]


def test_a_child_key_used_again_for_another_input_is_refused_and_permissions_are_unsupported() -> None:
    agent = ProgramDefinition()

    @agent.entrypoint
    def main(ctx: Any, input: Any) -> Any:
        if input != "root":
            return input
        same = [ctx.spawn("a", key="k").name, ctx.spawn("a", key="k").name]
        with pytest.raises(Unsupported) as unsupported:
            ctx.spawn("a", key="p", permissions={"network": "none"})
        assert unsupported.value.details == {"field": "permissions"}
        try:
            ctx.spawn("b", key="k")
        except Conflict as exc:
            return [same, exc.code, exc.details]
        return None

    assert run_local(agent, "root") == [["local-k", "local-k"], "ChildKeyReused", {"field": "key"}]


def test_messages_outputs_sends_and_continue_as_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    agent = ProgramDefinition()
    seen: list[Any] = []

    @agent.entrypoint
    def main(ctx: Any, input: Any) -> Any:
        if input == "child":
            Path("part.txt").write_text("from the child")
            ctx.save_output("part", "part.txt")
            return "ok"
        round_ = input["round"]
        seen.append([round_, ctx.wait_for_message("chat", timeout="1h"), ctx.wait_for_message("approval")])
        if round_ < 2:
            ctx.continue_as_new({"round": round_ + 1})
        child = ctx.spawn("child", key="c")
        ctx.gather([child])
        Path("report.md").write_text("# report")
        ctx.save_output("report", "report.md")
        ctx.send("other-run", "hello", {"x": 1})
        (ctx.state_dir / "kept").write_text("state")
        return {
            "child": ctx.child_output(child, "part"),
            "key": ctx.idempotency_key,
            "state": (ctx.state_dir / "kept").read_text(),
        }

    journal: list[dict[str, Any]] = []
    out = run_local(
        agent,
        {"round": 1},
        messages={"chat": ["hi", "again"], "approval": True},
        outputs_dir=tmp_path / "out",
        journal=journal,
    )
    assert seen == [[1, "hi", True], [2, "again", None]]  # a list is consumed in order; a value once
    assert out["child"] == "from the child" and out["state"] == "state"
    assert out["key"] == run_local(agent, {"round": 2}, outputs_dir=tmp_path / "out2")["key"]  # stable
    assert (tmp_path / "out" / "report").read_text() == "# report"
    assert (tmp_path / "out" / "local-c" / "part").read_text() == "from the child"
    sends = [e["value"] for e in journal if e["kind"] == "send"]
    assert sends == [{"target": "other-run", "name": "hello", "payload": {"x": 1}}]
    generations = sorted({(e["run"], e["generation"]) for e in journal if e["kind"] == "inbox"})
    assert generations == [("local", 0), ("local", 1)]  # a fresh journal after continue_as_new
    assert [e["id"] for e in journal if e["run"] == "local" and e["generation"] == 1][:2] == [
        "message/chat-1",
        "message/approval-1",
    ]


def test_async_entrypoints_and_steps() -> None:
    agent = ProgramDefinition()

    @agent.step
    async def fetch(n: int) -> int:
        await asyncio.sleep(0)
        return n + 1

    @agent.entrypoint
    async def main(ctx: Any, input: int) -> Any:
        return [await fetch(input), await fetch(input + 1)]

    journal: list[dict[str, Any]] = []
    assert run_local(agent, 1, journal=journal) == [2, 3]
    assert [e["id"] for e in journal] == ["fetch-1", "fetch-2"]


def test_the_definition_refuses_an_unknown_effect_and_names_its_entrypoint() -> None:
    agent = ProgramDefinition()
    with pytest.raises(ValueError, match="'maybe'"):
        agent.step(effect="maybe")

    def main(ctx: Any, input: Any) -> None:
        return None

    assert agent.entrypoint(main) is main
    with pytest.raises(Exception, match="top level"):
        agent.entrypoint_ref()
    agent.entrypoint(top_level_entrypoint)
    assert agent.entrypoint_ref() == f"{__name__}:top_level_entrypoint"
    [(path, text)] = agent.module_source().items()
    assert path == __name__.replace(".", "/") + ".py" and "def top_level_entrypoint" in text


def top_level_entrypoint(ctx: Any, input: Any) -> Any:
    return input


def test_a_child_output_that_is_not_utf8_comes_back_as_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    agent = ProgramDefinition()

    @agent.entrypoint
    def main(ctx: Any, input: Any) -> Any:
        if input == "child":
            Path("blob.bin").write_bytes(b"\xff\x00\xfe")
            ctx.save_output("blob", "blob.bin")
            return None
        child = ctx.spawn("child", key="c")
        ctx.gather([child])
        data = ctx.child_output(child, "blob")
        return [type(data).__name__, list(data)]

    assert run_local(agent, "root") == ["bytes", [255, 0, 254]]


def _claude_program() -> ProgramDefinition:
    import anthropic

    definition = ProgramDefinition()

    @definition.entrypoint
    def main(ctx: Any, input: Any) -> Any:
        reply = anthropic.Anthropic().messages.create(
            model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": "What is 6*7?"}]
        )
        return {"model": reply.model, "text": reply.content[0].text}

    return definition


def test_without_an_anthropic_key_local_claude_calls_are_answered_by_the_offline_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    answer = run_local(_claude_program(), None)
    assert answer["model"] == "offline-haiku" and "42" in answer["text"]
    # The relay lives for the local run only: the environment is as it was.
    assert "ANTHROPIC_BASE_URL" not in __import__("os").environ


def test_with_claude_configured_local_calls_go_where_the_environment_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import anthropic

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # nothing listens: refused
    with pytest.raises(anthropic.APIConnectionError):
        run_local(_claude_program(), None)
