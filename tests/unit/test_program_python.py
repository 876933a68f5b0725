"""PythonProgram: the real bootstrap under real bubblewrap, a real Journal on local storage.

A program that counts its external step's executions in its state dir: it succeeds with its
answer, a second actor over the same journal replays without running the step again, a
sleep parks with its wake time, and a raise fails ProgramFailed with the exception.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import Steps
from nodus_ray.models.offline.provider import OfflineProvider
from nodus_ray.money.billing import RunBudget
from nodus_ray.money.prices import PriceTable
from nodus_ray.money.spend import RunSpend
from nodus_ray.runtime.conversation import RunFailure
from nodus_ray.runtime.program.model_calls import ModelCalls
from nodus_ray.runtime.program.python_program import ProgramSpec, PythonProgram
from nodus_ray.runtime.program.server import Parked
from nodus_ray.runtime.program.waits import ProgramWaits
from nodus_ray.sandbox import bwrap_available, create_sandbox
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap cannot run here")

SOURCE = """
import os


def main(ctx, input):
    def bump():
        path = os.path.join(str(ctx.state_dir), "count")
        n = int(open(path).read()) if os.path.exists(path) else 0
        with open(path, "w") as f:
            f.write(str(n + 1))
        return n + 1

    print("hello from the program")
    a = ctx.step("bump", bump, effect="external")
    b = ctx.step("double", lambda: a * 2)
    if input.get("sleep"):
        ctx.sleep(input["sleep"])
    if input.get("fail"):
        raise ValueError("boom")
    if input.get("spin"):
        while True:
            pass
    if input.get("installed"):
        import installed_by_setup

        return installed_by_setup.X
    if input.get("claude"):
        import anthropic

        def ask():
            reply = anthropic.Anthropic().messages.create(
                model="claude-haiku-4-5", max_tokens=200, messages=[{"role": "user", "content": "Say hi"}]
            )
            return {"text": reply.content[0].text, "model": reply.model}

        return ctx.step("ask", ask) if input.get("in_step") else ask()
    return {"a": a, "b": b}
"""
DIGEST = "sha256:" + "ab" * 32


class FakeControl:
    async def next_message(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def send_message(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    async def spawn_child(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"name": "child"}

    async def children_status(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return []


async def _route(prompt: str, allowed: list[str]) -> dict[str, Any]:
    return {"family": allowed[0]}


async def _reserve(amount: Decimal) -> None:
    return None


def run_program(
    tmp_path: Path,
    input: dict[str, Any],
    attempt: int = 1,
    cpu_seconds: int = 3600,
    setup: str | None = None,
    sandbox: Any = None,
) -> str:
    storage = Storage(str(tmp_path / "store"))
    storage.write_bytes(
        layout.agent_source("p", DIGEST.split(":")[1]), json.dumps({"files": {"main.py": SOURCE}}).encode()
    )
    prefix = layout.run_prefix("p", "r")
    journal = Journal(storage, layout.journal_folder("p", "r"))
    journal.load()
    steps = Steps(journal)
    workspace = tmp_path / "ws"
    spend = RunSpend(
        prices=PriceTable.load(), access="Nodus", budget=RunBudget(cap=None), reserve_credits=_reserve
    )
    program = PythonProgram(
        spec=ProgramSpec(
            project="p",
            run="r",
            attempt=attempt,
            input=json.dumps(input),
            entrypoint="main:main",
            source_digest=DIGEST,
            cpu_seconds=cpu_seconds,
            setup=setup,
        ),
        steps=steps,
        storage=storage,
        open_sandbox=lambda: (sandbox or create_sandbox)(workspace),
        waits=ProgramWaits(
            steps=steps, control=FakeControl(), storage=storage, project="p", run="r", workspace=workspace
        ),
        models=ModelCalls(steps=steps, provider=OfflineProvider(), spend=spend, router=_route, families=None),
        workspace=WorkspaceSnapshots(storage, prefix, workspace),
    )
    return asyncio.run(asyncio.wait_for(program.run(), timeout=60))


def count(tmp_path: Path) -> int:
    return int((tmp_path / "ws" / "state" / "count").read_text())


@needs_bwrap
def test_a_program_succeeds_and_a_second_actor_replays_without_running_its_steps(tmp_path: Path) -> None:
    answer = run_program(tmp_path, {})
    assert json.loads(answer) == {"a": 1, "b": 2}
    storage = Storage(str(tmp_path / "store"))
    assert json.loads(storage.read_bytes(layout.run_result("p", "r"))) == {"a": 1, "b": 2}
    assert "hello from the program" in storage.read_bytes(layout.program_log("p", "r", 1)).decode()
    assert count(tmp_path) == 1
    again = run_program(tmp_path, {}, attempt=2)
    assert json.loads(again) == {"a": 1, "b": 2}
    assert count(tmp_path) == 1, "the external step ran once"
    assert not storage.exists(layout.program_log("p", "r", 2)), "nothing is printed twice on replay"


@needs_bwrap
def test_a_sleep_parks_with_its_wake_time_and_keeps_it(tmp_path: Path) -> None:
    with pytest.raises(Parked) as parked:
        run_program(tmp_path, {"sleep": 3600})
    assert parked.value.reason == "Sleeping" and parked.value.wake_at
    with pytest.raises(Parked) as again:
        run_program(tmp_path, {"sleep": 3600}, attempt=2)
    assert again.value.wake_at == parked.value.wake_at, "the wake time is recorded once"
    assert count(tmp_path) == 1


@needs_bwrap
def test_a_program_that_raises_fails_with_its_exception(tmp_path: Path) -> None:
    with pytest.raises(RunFailure) as failed:
        run_program(tmp_path, {"fail": True})
    assert failed.value.reason == "ProgramFailed"
    assert failed.value.message.startswith("ValueError: boom")


@needs_bwrap
def test_a_program_that_spins_is_stopped_by_its_cpu_limit(tmp_path: Path) -> None:
    with pytest.raises(RunFailure) as failed:
        run_program(tmp_path, {"spin": True}, cpu_seconds=1)
    assert failed.value.reason == "ProgramFailed"
    assert "CPU limit of 1 s" in failed.value.message


@needs_bwrap
def test_the_anthropic_sdk_inside_is_a_journaled_model_step(tmp_path: Path) -> None:
    answer = json.loads(run_program(tmp_path, {"claude": True}))
    assert answer["text"]
    storage = Storage(str(tmp_path / "store"))
    journal = Journal(storage, layout.journal_folder("p", "r"))
    models = [r for r in journal.load() if r.kind == "model"]
    assert [(r.step_id, r.state) for r in models] == [("model-1", "Completed")]
    assert json.loads(run_program(tmp_path, {"claude": True}, attempt=2)) == answer, "replayed, not called"
    assert [r.kind for r in journal.load()].count("model") == 1


@needs_bwrap
def test_the_sdk_called_inside_a_step_is_a_nested_model_step(tmp_path: Path) -> None:
    answer = json.loads(run_program(tmp_path, {"claude": True, "in_step": True}))
    assert answer["text"]
    journal = Journal(Storage(str(tmp_path / "store")), layout.journal_folder("p", "r"))
    ids = [(r.step_id, r.state) for r in journal.load() if r.step_id.startswith("ask")]
    assert ids == [("ask-1", "Started"), ("ask-1/model-1", "Completed"), ("ask-1", "Completed")]
    assert json.loads(run_program(tmp_path, {"claude": True, "in_step": True}, attempt=2)) == answer


@needs_bwrap
def test_setup_runs_once_and_what_it_installs_is_importable(tmp_path: Path) -> None:
    setup = (
        'mkdir -p "$PIP_TARGET" && echo X = 5 > "$PIP_TARGET/installed_by_setup.py" && echo ran >> setup.log'
    )
    assert run_program(tmp_path, {"installed": True}, setup=setup) == "5"
    assert run_program(tmp_path, {"installed": True}, setup=setup, attempt=2) == "5"
    assert (tmp_path / "ws" / "setup.log").read_text() == "ran\n", "setup is a journaled step: once"


def test_without_bubblewrap_a_program_does_not_run_at_all(tmp_path: Path) -> None:
    # Commands of a Claude run may fall back to plain processes (with a note); a program, the
    # user's own code, runs inside bubblewrap or not at all.
    from nodus_ray.sandbox.process import ProcessSandbox

    def fallback(workspace: Path) -> ProcessSandbox:
        return ProcessSandbox(workspace, note="bubblewrap not available (this test)")

    with pytest.raises(RunFailure) as refused:
        run_program(tmp_path, {}, sandbox=fallback)
    assert refused.value.reason == "SandboxUnavailable"
    assert "only inside bubblewrap" in refused.value.message and "this test" in refused.value.message
    assert not (tmp_path / "ws" / "state" / "count").exists(), "no step of the program ran"
