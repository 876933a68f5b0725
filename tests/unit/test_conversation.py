"""The conversation loop without Ray: routing, model calls, tool calls, caps, refusals, replay.

`Conversation` runs here as a run actor runs it, over real parts: a journal on a temporary
directory, a sandbox from `create_sandbox` (bubblewrap where it can run) whose commands really
run, the real price table, `RunSpend` and `RunBudget`, and the jev router's own `route`. Only
the model is scripted: `ScriptedProvider` answers each call with the next scripted response and
keeps the requests it was sent. Expected costs are worked out from the published prices (haiku
$1/$5, sonnet $3/$15 per million input/output tokens, the router $0.10 per million input
tokens; Nodus bills cost / 0.875 rounded up to a microdollar), as the integration tests do.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import pytest

from nodus_ray.durable.journal import Journal, JournalRecord
from nodus_ray.durable.steps import NeedsResolution, Steps
from nodus_ray.models.base import ModelError, ModelRequest, ModelResponse, Usage
from nodus_ray.money.billing import CapExceeded, RunBudget
from nodus_ray.money.prices import DEFAULT_PRICE_TABLE
from nodus_ray.money.spend import CreditsExhausted, RunSpend
from nodus_ray.runtime.conversation import Conversation, ConversationSpec, RunFailure
from nodus_ray.runtime.router import JevRouter
from nodus_ray.runtime.turn_record import TurnRecord
from nodus_ray.sandbox import Sandbox, SandboxLimits, create_sandbox
from nodus_ray.store.storage import Storage
from tests.conftest import NO_BWRAP_ENV

MICRO = Decimal("0.000001")
PREFIX = "projects/p/agentruns/r/journal"
USAGE = Usage(input_tokens=100, output_tokens=20)


def _billed(raw: Decimal) -> Decimal:
    return (raw / Decimal("0.875")).quantize(MICRO, rounding=ROUND_CEILING)


def _model_cost(per_million_in: str, per_million_out: str, usage: Usage = USAGE) -> Decimal:
    raw = (
        usage.input_tokens * Decimal(per_million_in) + usage.output_tokens * Decimal(per_million_out)
    ) / 10**6
    return _billed(raw.quantize(MICRO, rounding=ROUND_CEILING))


HAIKU_CALL = _model_cost("1", "5")
SONNET_CALL = _model_cost("3", "15")


def _router_cost(prompt: str) -> Decimal:
    tokens = -(-len(prompt) // 4) + 64  # what the jev router bills: ceil(chars / 4) + 64 framing
    return _billed((tokens * Decimal("0.10") / 10**6).quantize(MICRO, rounding=ROUND_CEILING))


class Crash(Exception):
    """The actor died in the middle of a model call: nothing after it is journaled."""


def text(reply: str, stop_reason: str = "end_turn", usage: Usage = USAGE) -> ModelResponse:
    return ModelResponse(
        model="", content=[{"type": "text", "text": reply}], stop_reason=stop_reason, usage=usage
    )


def bash(*commands: str, usage: Usage = USAGE) -> ModelResponse:
    """The model asks for one bash command per argument, in one response."""
    uses = [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "bash", "input": {"command": command}}
        for i, command in enumerate(commands, start=1)
    ]
    return ModelResponse(model="", content=uses, stop_reason="tool_use", usage=usage)


class ScriptedProvider:
    """A `ModelProvider` that answers with its script, in order, and records every request.

    A script entry that is an exception is raised instead of answered. Calling it past the end
    of its script fails the test: replay must not call the model for a recorded step.
    """

    name = "scripted"

    def __init__(self, *script: ModelResponse | Exception):
        self.script = list(script)
        self.requests: list[ModelRequest] = []

    def model_for_family(self, family: str) -> str:
        return DEFAULT_PRICE_TABLE.family_models[family]

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        assert self.script, f"the model was called past its script (call {len(self.requests)})"
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return replace(answer, model=request.model)  # the API answers as the model it was asked for


@dataclass
class Router:
    """The jev router's own decision, as its actor gives it, counting the calls; ``down`` makes
    it unreachable (an actor that is gone), which the turn must survive."""

    down: bool = False
    calls: list[tuple[str, list[str]]] = field(default_factory=list)

    async def __call__(self, prompt: str, allowed: list[str]) -> dict[str, Any]:
        self.calls.append((prompt, list(allowed)))
        if self.down:
            raise ConnectionError("the router actor is gone")
        return dict(await JevRouter().route(prompt, allowed))


@dataclass
class Credits:
    """The project's credits as the control plane holds them: each reservation is taken from
    the balance, or refused (`CreditsExhausted`) when it does not fit."""

    balance: Decimal = Decimal("100")
    held: list[Decimal] = field(default_factory=list)

    async def reserve(self, amount: Decimal) -> None:
        if amount > self.balance:
            raise CreditsExhausted(amount)
        self.balance -= amount
        self.held.append(amount)


class Rig:
    """One run's storage, workspace and sandboxes; each `conversation` is a new actor's."""

    def __init__(self, root: Path):
        self.storage = Storage(str(root / "store"))
        self.workspace = root / "workspace"
        self.sandboxes: list[Sandbox] = []
        self.progress: list[list[TurnRecord]] = []

    def journal(self) -> Journal:
        journal = Journal(self.storage, PREFIX)
        journal.load()
        return journal

    def records(self) -> list[JournalRecord]:
        return self.journal().records

    def steps(self) -> list[tuple[str, str, list[str]]]:
        """Each step's id, kind and states, in the order the steps began (messages left out)."""
        states: dict[str, tuple[str, list[str]]] = {}
        for record in self.records():
            if record.kind != "message":
                states.setdefault(record.step_id, (record.kind, []))[1].append(record.state)
        return [(step_id, kind, seen) for step_id, (kind, seen) in states.items()]

    def open_sandbox(self) -> Sandbox:
        sandbox = create_sandbox(self.workspace, SandboxLimits(timeout_seconds=30))
        self.sandboxes.append(sandbox)
        return sandbox

    async def _on_progress(self, turns: list[TurnRecord]) -> None:
        self.progress.append([replace(turn) for turn in turns])

    def conversation(
        self,
        provider: ScriptedProvider,
        prompt: str = "Say hello",
        *,
        families: list[str] | None = None,
        model_name: str | None = None,
        max_tool_calls: int = 50,
        max_tokens: int = 1024,
        router: Callable[[str, list[str]], Awaitable[dict[str, Any]]] | None = None,
        cap: str | None = "1.00",
        access: str = "Nodus",
        credits: Credits | None = None,
    ) -> Conversation:
        return Conversation(
            steps=Steps(self.journal()),
            provider=provider,
            spec=ConversationSpec(
                system="Answer briefly.",
                families=families,
                model_name=model_name,
                max_tokens=max_tokens,
                max_tool_calls=max_tool_calls,
                prompt=prompt,
            ),
            spend=RunSpend(
                prices=DEFAULT_PRICE_TABLE,
                access=access,
                budget=RunBudget(cap=Decimal(cap) if cap is not None else None),
                reserve_credits=(credits or Credits()).reserve,
            ),
            router=router or Router(),
            open_sandbox=self.open_sandbox,
            on_progress=self._on_progress,
        )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    if made.sandboxes:
        made.sandboxes[-1].delete()


def run(conversation: Conversation) -> str:
    return asyncio.run(conversation.run())


def _tool_results(request: ModelRequest) -> list[dict[str, Any]]:
    last = request.messages[-1]
    assert last["role"] == "user" and isinstance(last["content"], list)
    return list(last["content"])


# -- one turn --------------------------------------------------------------------------------


def test_a_turn_routes_calls_the_model_runs_its_command_and_answers(rig: Rig) -> None:
    prompt = "What does the note say?"
    provider = ScriptedProvider(bash("echo hello > note.txt && cat note.txt"), text("It says hello."))
    router = Router()
    conversation = rig.conversation(provider, prompt, families=["haiku", "sonnet"], router=router)

    assert run(conversation) == "It says hello."

    # The router chose haiku for a simple prompt, and both calls went to haiku's model.
    assert router.calls == [(prompt, ["haiku", "sonnet"])]
    assert [request.model for request in provider.requests] == ["claude-haiku-5-5"] * 2
    assert provider.requests[0].messages == [{"role": "user", "content": prompt}]
    # The command really ran in the workspace, and its result went back to the model.
    assert (rig.workspace / "note.txt").read_text() == "hello\n"
    [result] = _tool_results(provider.requests[1])
    assert result == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "exit code 0\nhello\n",
        "is_error": False,
    }
    # What the status shows: who served the turn and what it cost, from the price table.
    expected = _router_cost(prompt) + 2 * HAIKU_CALL
    [turn] = conversation.turns
    assert (turn.family, turn.model, turn.routing) == ("haiku", "claude-haiku-5-5", "jev")
    assert (turn.toolCalls, turn.inputTokens, turn.outputTokens, turn.stopReason) == (1, 200, 40, "end_turn")
    assert Decimal(turn.costUSD) == expected == conversation.cost_usd
    assert turn.finishedAt is not None
    assert rig.progress and rig.progress[-1][0].costUSD == turn.costUSD
    # The sandbox the commands ran in is the one the journal names: bubblewrap, unless this
    # machine lacks it on purpose (the session refuses to start otherwise, `tests/conftest.py`).
    sandbox = rig.sandboxes[0]
    assert sandbox.backend == "bubblewrap" or os.environ.get(NO_BWRAP_ENV) == "1"
    assert conversation.sandbox_info == {
        "backend": sandbox.backend,
        "workspace": str(rig.workspace),
        "note": sandbox.note,
    }
    # The journal: each step Started then Completed, in program order, costs adding up;
    # routing, idempotent and internal, is one record (issue 19).
    assert rig.steps() == [
        ("sandbox", "sandbox", ["Started", "Completed"]),
        ("turn-1/route", "route", ["Completed"]),
        ("turn-1/model-1", "model", ["Started", "Completed"]),
        ("turn-1/command-1-1", "command", ["Started", "Completed"]),
        ("turn-1/model-2", "model", ["Started", "Completed"]),
    ]
    records = rig.records()
    assert sum(Decimal(r.cost_usd) for r in records) == expected
    assert [r.payload["role"] for r in records if r.kind == "message"] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    started = next(r for r in records if r.step_id == "turn-1/command-1-1")
    assert started.payload == {"command": "echo hello > note.txt && cat note.txt"}
    # Each model answer is stored once: the assistant message, written with the model step's
    # Completed (the record just after it), refers to that step's result.
    for index, record in enumerate(records):
        if record.kind == "message" and record.payload["role"] == "assistant":
            assert "content" not in record.payload
            source = records[index - 1]
            assert (source.step_id, source.state) == (record.payload["contentOf"], "Completed")
    assert Steps(rig.journal()).messages() == conversation.messages


def test_an_unreachable_router_falls_back_to_sonnet_and_charges_nothing_for_routing(rig: Rig) -> None:
    provider = ScriptedProvider(text("Hi."))
    router = Router(down=True)
    conversation = rig.conversation(provider, families=["haiku", "sonnet", "opus"], router=router)
    assert run(conversation) == "Hi."
    assert len(router.calls) == 1
    [turn] = conversation.turns
    assert (turn.family, turn.model, turn.routing) == ("sonnet", "claude-sonnet-5-5", "fallback")
    assert [request.model for request in provider.requests] == ["claude-sonnet-5-5"]
    assert conversation.cost_usd == SONNET_CALL, "no charge for a router that did not answer"


def test_one_allowed_family_or_a_pinned_model_needs_no_router(rig: Rig) -> None:
    router = Router()
    only_haiku = rig.conversation(ScriptedProvider(text("Hi.")), families=["haiku"], router=router)
    assert run(only_haiku) == "Hi."
    assert (only_haiku.turns[0].family, only_haiku.turns[0].routing) == ("haiku", "jev")
    assert only_haiku.cost_usd == HAIKU_CALL

    pinned_rig = Rig(rig.workspace.parent / "pinned")
    provider = ScriptedProvider(text("Hi."))
    pinned = pinned_rig.conversation(provider, model_name="claude-sonnet-5-5", router=router)
    try:
        assert run(pinned) == "Hi."
    finally:
        pinned_rig.sandboxes[-1].delete()
    assert (pinned.turns[0].family, pinned.turns[0].model, pinned.turns[0].routing) == (
        "sonnet",
        "claude-sonnet-5-5",
        "pinned",
    )
    assert provider.requests[0].model == "claude-sonnet-5-5"
    assert router.calls == []


def test_a_failing_command_is_reported_to_the_model_as_an_error(rig: Rig) -> None:
    provider = ScriptedProvider(bash("ls no-such-file"), bash(""), text("It is missing."))
    conversation = rig.conversation(provider, families=["haiku"])
    assert run(conversation) == "It is missing."
    [failed] = _tool_results(provider.requests[1])
    assert failed["is_error"] is True
    assert failed["content"].startswith("exit code 2\n") and "no-such-file" in failed["content"]
    [empty] = _tool_results(provider.requests[2])
    assert empty["is_error"] is True and "non-empty 'command'" in empty["content"]
    commands = [step for step in rig.steps() if step[1] == "command"]
    assert [step_id for step_id, _, _ in commands] == ["turn-1/command-1-1"], "an empty command runs nothing"


# -- stop reasons ----------------------------------------------------------------------------


def test_pause_turn_sends_the_conversation_back_and_the_turn_goes_on(rig: Rig) -> None:
    provider = ScriptedProvider(text("Thinking about it...", stop_reason="pause_turn"), text("Done."))
    conversation = rig.conversation(provider, families=["haiku"])
    assert run(conversation) == "Done."
    assert len(provider.requests) == 2
    assert provider.requests[1].messages[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Thinking about it..."}],
    }
    assert [kind for _, kind, _ in rig.steps()].count("model") == 2
    assert conversation.turns[0].stopReason == "end_turn"
    assert conversation.cost_usd == 2 * HAIKU_CALL


def test_a_refusal_fails_the_run_with_model_refused(rig: Rig) -> None:
    provider = ScriptedProvider(text("", stop_reason="refusal"))
    conversation = rig.conversation(provider, families=["haiku"])
    with pytest.raises(RunFailure) as caught:
        run(conversation)
    assert caught.value.reason == "ModelRefused"
    assert "refusal" in caught.value.message
    [turn] = conversation.turns
    assert turn.stopReason == "refusal" and turn.finishedAt is not None
    assert conversation.cost_usd == HAIKU_CALL, "the refused call was made and is paid for"


def test_max_tokens_is_the_answer_cut_short(rig: Rig) -> None:
    conversation = rig.conversation(
        ScriptedProvider(text("A partial answ", "max_tokens")), families=["haiku"]
    )
    assert run(conversation) == "A partial answ"
    assert conversation.stop_reason == "max_tokens"


def test_a_model_error_fails_the_run_with_its_reason_and_replays_the_same(rig: Rig) -> None:
    failing = ScriptedProvider(ModelError("overloaded after retries", reason="ModelUnavailable"))
    with pytest.raises(RunFailure) as caught:
        run(rig.conversation(failing, families=["haiku"]))
    assert (caught.value.reason, caught.value.message) == ("ModelUnavailable", "overloaded after retries")
    assert rig.steps()[-1] == ("turn-1/model-1", "model", ["Started", "Failed"])
    replayed = ScriptedProvider()
    with pytest.raises(RunFailure) as again:
        run(rig.conversation(replayed, families=["haiku"]))
    assert again.value.reason == "ModelUnavailable"
    assert replayed.requests == []


# -- limits ----------------------------------------------------------------------------------


def test_max_tool_calls_runs_that_many_and_tells_the_model_to_answer(rig: Rig) -> None:
    provider = ScriptedProvider(
        bash("echo one >> log", "echo two >> log", "echo three >> log"), text("Two of them ran.")
    )
    conversation = rig.conversation(provider, families=["haiku"], max_tool_calls=2)
    assert run(conversation) == "Two of them ran."
    assert (rig.workspace / "log").read_text() == "one\ntwo\n"
    results = _tool_results(provider.requests[1])
    assert [r["is_error"] for r in results] == [False, False, True]
    assert results[2]["tool_use_id"] == "toolu_3"
    assert "maxToolCalls (2) reached" in results[2]["content"]
    assert conversation.turns[0].toolCalls == 2
    commands = [step_id for step_id, kind, _ in rig.steps() if kind == "command"]
    assert commands == ["turn-1/command-1-1", "turn-1/command-1-2"]


def test_asking_for_more_commands_after_the_limit_fails_the_run(rig: Rig) -> None:
    provider = ScriptedProvider(bash("echo one", "echo two"), bash("echo three"))
    conversation = rig.conversation(provider, families=["haiku"], max_tool_calls=1)
    with pytest.raises(RunFailure) as caught:
        run(conversation)
    assert caught.value.reason == "MaxToolCallsReached"
    assert "maxToolCalls (1)" in caught.value.message and "turn 1" in caught.value.message
    assert [kind for _, kind, _ in rig.steps()].count("command") == 1


def test_the_cap_refuses_the_first_call_before_it_is_made(rig: Rig) -> None:
    provider = ScriptedProvider(text("never"))
    conversation = rig.conversation(provider, families=["opus"], cap="0.000010")
    with pytest.raises(CapExceeded) as caught:
        run(conversation)
    assert caught.value.reason == "MaxCostReached"
    assert "perRunMaxCostUSD" in str(caught.value)
    assert provider.requests == []
    assert [kind for _, kind, _ in rig.steps()] == ["sandbox"], "no routing, no model call"
    assert conversation.cost_usd == 0


def test_the_cap_refuses_a_later_call_that_could_pass_it(rig: Rig) -> None:
    """A command prints 30,000 bytes: the next call's input could be 30,000 tokens ($0.10 on
    sonnet), more than the $0.05 cap leaves, so it is not made; the first call fit and is paid."""
    provider = ScriptedProvider(bash("head -c 30000 /dev/zero | tr '\\0' a"), text("never"))
    conversation = rig.conversation(provider, families=["sonnet"], cap="0.05")
    with pytest.raises(CapExceeded) as caught:
        run(conversation)
    assert caught.value.reason == "MaxCostReached"
    assert len(provider.requests) == 1
    assert [step_id for step_id, _, _ in rig.steps()][-1] == "turn-1/command-1-1"
    assert conversation.cost_usd == SONNET_CALL <= Decimal("0.05")


def test_credits_that_cannot_hold_a_call_stop_it_before_it_is_journaled(rig: Rig) -> None:
    """One allowed family: routing costs nothing and holds nothing, the model call is refused."""
    provider = ScriptedProvider(text("never"))
    credits = Credits(balance=Decimal("0.000001"))
    with pytest.raises(CreditsExhausted):
        run(rig.conversation(provider, families=["haiku"], credits=credits))
    assert provider.requests == []
    assert [kind for _, kind, _ in rig.steps()] == ["sandbox", "route"], "no model step"
    assert credits.held == [] and credits.balance == Decimal("0.000001")


def test_the_credits_held_cover_what_was_charged(rig: Rig) -> None:
    credits = Credits()
    conversation = rig.conversation(
        ScriptedProvider(text("Hi.")), "Say hi", families=["haiku", "sonnet"], credits=credits
    )
    run(conversation)
    assert len(credits.held) == 2, "one reservation for the routing call, one for the model call"
    assert sum(credits.held) >= conversation.cost_usd == _router_cost("Say hi") + HAIKU_CALL


# -- replay ----------------------------------------------------------------------------------


def test_after_a_crash_a_new_conversation_replays_and_repeats_nothing(rig: Rig) -> None:
    counting = "echo ran >> runs && wc -l < runs"
    first = ScriptedProvider(bash(counting), Crash("the actor died mid-call"))
    router = Router()
    with pytest.raises(Crash):
        run(rig.conversation(first, "Count the runs", families=["haiku", "sonnet"], router=router))
    assert rig.steps()[-1] == ("turn-1/model-2", "model", ["Started"])
    assert (rig.workspace / "runs").read_text() == "ran\n"

    # A new actor over the same journal: only the interrupted call is made again.
    second = ScriptedProvider(text("It ran once."))
    conversation = rig.conversation(second, "Count the runs", families=["haiku", "sonnet"], router=router)
    assert run(conversation) == "It ran once."
    assert len(router.calls) == 1, "the recorded routing is not asked again"
    assert len(second.requests) == 1
    assert second.requests[0].messages == first.requests[1].messages
    assert _tool_results(second.requests[0])[0]["content"] == "exit code 0\n1\n"
    assert (rig.workspace / "runs").read_text() == "ran\n", "the command did not run again"
    [turn] = conversation.turns
    assert (turn.toolCalls, turn.inputTokens) == (1, 200), "the status is rebuilt from the journal"
    expected = _router_cost("Count the runs") + 2 * HAIKU_CALL
    assert conversation.cost_usd == expected
    attempts = [r.attempt for r in rig.records() if r.step_id == "turn-1/model-2"]
    assert attempts == [1, 2, 2]

    # Replaying the finished journal calls nothing, runs nothing and writes nothing.
    before = len(rig.records())
    idle = ScriptedProvider()
    replayed = rig.conversation(idle, "Count the runs", families=["haiku", "sonnet"], router=router)
    assert run(replayed) == "It ran once."
    assert idle.requests == [] and len(router.calls) == 1
    assert replayed.cost_usd == expected and replayed.turns[0].toolCalls == 1
    assert len(rig.records()) == before
    assert (rig.workspace / "runs").read_text() == "ran\n"


def test_a_command_interrupted_before_its_record_waits_for_a_person(rig: Rig) -> None:
    conversation = rig.conversation(ScriptedProvider(bash("echo ran >> runs")), families=["haiku"])

    def die(_seq: int) -> None:  # the command ran; the actor dies before journaling its end
        raise Crash("the actor died after the command")

    conversation.after_command = die
    with pytest.raises(Crash):
        run(conversation)
    replayed = ScriptedProvider()
    with pytest.raises(NeedsResolution) as caught:
        run(rig.conversation(replayed, families=["haiku"]))
    assert caught.value.step_id == "turn-1/command-1-1"
    assert replayed.requests == []
    assert (rig.workspace / "runs").read_text() == "ran\n", "not repeated blindly"
    assert rig.steps()[-1] == ("turn-1/command-1-1", "command", ["Started", "NeedsResolution"])


def test_an_interrupted_call_on_the_users_key_waits_for_a_person(rig: Rig) -> None:
    with pytest.raises(Crash):
        run(rig.conversation(ScriptedProvider(Crash("died")), families=["haiku"], access="BYOK", cap=None))
    replayed = ScriptedProvider()
    with pytest.raises(NeedsResolution) as caught:
        run(rig.conversation(replayed, families=["haiku"], access="BYOK", cap=None))
    assert (caught.value.step_id, caught.value.kind) == ("turn-1/model-1", "model")
    assert replayed.requests == []


def test_a_replay_that_takes_another_path_fails_non_deterministic(rig: Rig) -> None:
    """Recorded with maxToolCalls 2, the model's two commands both ran; replayed with 1, the
    program would send the second back unrun and call the model where the journal has a command."""
    provider = ScriptedProvider(bash("echo a", "echo b"), text("Both ran."))
    assert run(rig.conversation(provider, families=["haiku"], max_tool_calls=2)) == "Both ran."
    before = len(rig.records())
    replayed = ScriptedProvider()
    with pytest.raises(RunFailure) as caught:
        run(rig.conversation(replayed, families=["haiku"], max_tool_calls=1))
    assert caught.value.reason == "NonDeterministic"
    assert "turn-1/command-1-2 (command)" in caught.value.message
    assert "turn-1/model-2 (model)" in caught.value.message
    assert replayed.requests == []
    assert len(rig.records()) == before
