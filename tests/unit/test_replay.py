"""Replay checks that it replays the same program: the step at each recorded position must be the
step the code asks for (same id and kind), or the run stops with `NonDeterministic` naming it.

Every test records a journal on a real directory by running a small program through `Steps`,
then replays it from storage with a fresh `Steps`, as a new run actor would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import Effect, NeedsResolution, NonDeterministic, Steps
from nodus_ray.store.storage import Storage

PREFIX = "projects/p/agentruns/r/journal"

Plan = list[tuple[str, str, Effect]]

# The shape of the conversation's program: its sandbox, then a turn's routing, model call and
# command, and the model call after the command.
RECORDED: Plan = [
    ("sandbox", "sandbox", "idempotent"),
    ("turn-1/route", "route", "idempotent"),
    ("turn-1/model-1", "model", "idempotent"),
    ("turn-1/command-1-1", "command", "external"),
    ("turn-1/model-2", "model", "idempotent"),
]


def journal_at(tmp_path: Path) -> Journal:
    journal = Journal(Storage(str(tmp_path / "store")), PREFIX)
    journal.load()
    return journal


class Executed:
    """The actions that really ran, in order; each returns a result naming its step and run."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def action(self, step_id: str) -> Callable[[], Awaitable[dict[str, Any]]]:
        async def act() -> dict[str, Any]:
            self.steps.append(step_id)
            return {"step": step_id, "run": len(self.steps)}

        return act


async def program(steps: Steps, plan: Plan, executed: Executed) -> list[dict[str, Any]]:
    """Asks for each planned step in order and writes a message between them, as the
    conversation does (messages are content, not steps)."""
    results = []
    for index, (step_id, kind, effect) in enumerate(plan):
        await steps.record_message(index, {"role": "user", "content": f"before {step_id}"})
        results.append(await steps.run(step_id, kind, executed.action(step_id), effect=effect))
    return results


def record(tmp_path: Path, plan: Plan = RECORDED) -> list[dict[str, Any]]:
    executed = Executed()
    results = asyncio.run(program(Steps(journal_at(tmp_path)), plan, executed))
    assert executed.steps == [step_id for step_id, _, _ in plan]
    return results


def replay(tmp_path: Path, plan: Plan) -> tuple[list[dict[str, Any]], Executed]:
    executed = Executed()
    return asyncio.run(program(Steps(journal_at(tmp_path)), plan, executed)), executed


def test_the_same_program_gets_the_recorded_results_and_executes_nothing(tmp_path: Path) -> None:
    recorded = record(tmp_path)
    before = len(journal_at(tmp_path).records)
    results, executed = replay(tmp_path, RECORDED)
    assert executed.steps == []
    assert results == recorded
    assert [r["run"] for r in results] == [1, 2, 3, 4, 5], "each result is the one recorded when it ran"
    assert len(journal_at(tmp_path).records) == before, "replay writes nothing"


def test_a_program_that_goes_on_past_the_journal_runs_only_the_new_steps(tmp_path: Path) -> None:
    record(tmp_path)
    longer = [*RECORDED, ("turn-1/command-2-1", "command", "external")]
    results, executed = replay(tmp_path, longer)
    assert executed.steps == ["turn-1/command-2-1"]
    assert results[-1] == {"step": "turn-1/command-2-1", "run": 1}
    # And that run's journal replays in turn.
    again, executed = replay(tmp_path, longer)
    assert executed.steps == []
    assert again == results


def test_another_step_id_at_a_recorded_position_fails_naming_both(tmp_path: Path) -> None:
    record(tmp_path)
    # The program skips the command this time: its next model call lands where the command was.
    diverged: Plan = [*RECORDED[:3], ("turn-1/model-2", "model", "idempotent")]
    with pytest.raises(NonDeterministic) as caught:
        replay(tmp_path, diverged)
    error = caught.value
    assert error.reason == "NonDeterministic"
    assert error.step_id == "turn-1/model-2"
    assert error.position == 3
    assert error.recorded == ("turn-1/command-1-1", "command")
    assert error.requested == ("turn-1/model-2", "model")
    message = str(error)
    assert "turn-1/command-1-1 (command)" in message
    assert "turn-1/model-2 (model)" in message
    assert "step 4" in message


def test_another_kind_under_a_recorded_id_fails_and_executes_nothing(tmp_path: Path) -> None:
    record(tmp_path)
    before = journal_at(tmp_path).records
    diverged: Plan = [*RECORDED[:3], ("turn-1/command-1-1", "inbox", "idempotent")]
    executed = Executed()
    with pytest.raises(NonDeterministic) as caught:
        asyncio.run(program(Steps(journal_at(tmp_path)), diverged, executed))
    assert caught.value.recorded == ("turn-1/command-1-1", "command")
    assert caught.value.requested == ("turn-1/command-1-1", "inbox")
    assert "turn-1/command-1-1 (inbox)" in str(caught.value)
    assert executed.steps == []
    assert journal_at(tmp_path).records == before, "nothing is journaled for the diverging step"


def test_a_recorded_step_asked_for_out_of_order_fails(tmp_path: Path) -> None:
    record(tmp_path)
    swapped: Plan = [RECORDED[0], RECORDED[2], RECORDED[1]]
    with pytest.raises(NonDeterministic) as caught:
        replay(tmp_path, swapped)
    assert caught.value.recorded == ("turn-1/route", "route")
    assert caught.value.requested == ("turn-1/model-1", "model")


def test_a_step_asked_for_again_after_the_journal_fails(tmp_path: Path) -> None:
    record(tmp_path)
    repeated: Plan = [*RECORDED, ("turn-1/route", "route", "idempotent")]
    with pytest.raises(NonDeterministic) as caught:
        replay(tmp_path, repeated)
    assert caught.value.recorded is None
    assert caught.value.requested == ("turn-1/route", "route")
    assert "turn-1/route (route)" in str(caught.value)
    assert "already ran" in str(caught.value)


def test_an_interrupted_idempotent_step_reruns_in_its_position_without_a_divergence(tmp_path: Path) -> None:
    record(tmp_path, RECORDED[:2])
    journal = journal_at(tmp_path)
    journal.append("turn-1/model-1", "model", "Started", {"model": "m"})  # the actor died here
    results, executed = replay(tmp_path, RECORDED[:4])
    assert executed.steps == ["turn-1/model-1", "turn-1/command-1-1"]
    assert results[2] == {"step": "turn-1/model-1", "run": 1}
    attempts = [r.attempt for r in journal_at(tmp_path).records if r.step_id == "turn-1/model-1"]
    assert attempts == [1, 2, 2]


def test_an_interrupted_command_parks_and_after_no_effect_reruns_in_its_position(tmp_path: Path) -> None:
    record(tmp_path, RECORDED[:3])
    journal = journal_at(tmp_path)
    journal.append("turn-1/command-1-1", "command", "Started", {"command": "make"})
    with pytest.raises(NeedsResolution):
        replay(tmp_path, RECORDED)
    # A person decides it had no effect (as `control.resolution` writes it): it runs again.
    journal = journal_at(tmp_path)
    journal.append("turn-1/command-1-1", "command", "NoEffect", {"summary": "no effect"}, attempt=1)
    results, executed = replay(tmp_path, RECORDED)
    assert executed.steps == ["turn-1/command-1-1", "turn-1/model-2"]
    assert [r["step"] for r in results] == [step_id for step_id, _, _ in RECORDED]
    replayed, executed = replay(tmp_path, RECORDED)
    assert executed.steps == []
    assert replayed == results


def test_messages_between_steps_are_not_positions(tmp_path: Path) -> None:
    """A journal written with more messages than the replay asks for still replays: messages are
    stored once by index, and only steps are checked for order."""
    journal = journal_at(tmp_path)
    journal.append("message-0", "message", "Completed", {"role": "user", "content": "hi"})
    journal.append("message-1", "message", "Completed", {"role": "assistant", "content": "hello"})
    journal.append("sandbox", "sandbox", "Started", {})
    journal.append("sandbox", "sandbox", "Completed", {"result": {"backend": "bubblewrap"}})
    executed = Executed()
    steps = Steps(journal_at(tmp_path))
    result = asyncio.run(steps.run("sandbox", "sandbox", executed.action("sandbox")))
    assert result == {"backend": "bubblewrap"}
    assert executed.steps == []
