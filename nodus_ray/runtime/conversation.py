"""The Claude conversation as a journaled program.

One turn: route the prompt to a family, then call the model, run the commands it asks for
in the sandbox, hand the results back, and repeat until the model ends its turn. Every
action is a step of `durable.Steps`, so running this program again over the same journal
replays it: recorded routing, model answers and command results come back from the journal
and nothing with an effect happens twice.

The program is deterministic given its journal; all state the status shows (turns, tokens,
cost) is recomputed from step results, so a replayed run reports exactly what it reported
before its actor died.

Routing and reading the inbox (idempotent, internal) are one ``Completed`` record each; a model
answer or an inbox message is stored once, in its step's result, and the conversation message
refers to it (``contentOf``), in the same write as that ``Completed`` (so are a round's command
results, with its last command's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from nodus.contract import FAMILIES
from nodus.lifecycle import RunReason
from nodus_ray import metrics, tracing
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.steps import Effect, NonDeterministic, StepFailed, Steps
from nodus_ray.models.base import ModelError, ModelProvider, ModelRequest, ModelResponse, Usage
from nodus_ray.models.catalog import family_of_model
from nodus_ray.money.billing import max_input_tokens
from nodus_ray.money.prices import ROUTER_MODEL
from nodus_ray.money.sandbox_billing import SandboxMeter
from nodus_ray.money.spend import RunSpend
from nodus_ray.runtime.list_costs import add_list_cost
from nodus_ray.runtime.rate_limited import call_model
from nodus_ray.runtime.router import ROUTER_MAX_OUTPUT_TOKENS, fallback_family, router_input_tokens
from nodus_ray.runtime.sandbox_charges import command_charge, hold, limits_of, open_meter
from nodus_ray.runtime.tool_results import command_summary, tool_error, tool_result
from nodus_ray.runtime.turn_record import TurnRecord
from nodus_ray.sandbox import CommandResult, Sandbox
from nodus_ray.store.timestamps import utc_now

__all__ = ["ConversationSpec", "Conversation", "RunFailure", "AwaitingMessage", "Router", "Inbox"]

_PROMPT_PREVIEW = 200


class RunFailure(Exception):
    """The program cannot go on; ``reason`` is the run's ``status.reason``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class AwaitingMessage(Exception):  # noqa: N818 - a state the program pauses in, not an error
    """A keep-alive run answered its turn and has no message to read: it waits for one.

    Nothing is journaled for the wait itself, so the actor can go away; the next actor replays
    the journal up to here and asks again.
    """

    def __init__(self, turn: int):
        super().__init__(f"turn {turn} is answered; waiting for a message")
        self.turn = turn


@dataclass(frozen=True)
class ConversationSpec:
    system: str
    families: list[str] | None
    model_name: str | None
    max_tokens: int
    max_tool_calls: int
    prompt: str
    keep_alive: bool = False


Inbox = Callable[[int], Awaitable[dict[str, Any] | None]]
"""The first message after a sequence number (``{seq, name, payload, messageKey}``), or None."""


Router = Callable[[str, list[str]], Awaitable[dict[str, Any]]]
"""Asks the router service for a family: ``(prompt, allowed) -> {"family", "inputTokens", ...}``."""


@dataclass
class Conversation:
    """Runs turns over `Steps`; reports progress through ``on_progress`` after each step."""

    steps: Steps
    provider: ModelProvider
    spec: ConversationSpec
    spend: RunSpend
    router: Router
    open_sandbox: Callable[[], Sandbox]
    on_progress: Callable[[list[TurnRecord]], Awaitable[None]]
    sandbox: Sandbox | None = None
    sandbox_info: dict[str, Any] = field(default_factory=dict)
    turns: list[TurnRecord] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    next_message: Inbox | None = None
    on_answer: Callable[[str], Awaitable[None]] | None = None
    answer: str | None = None
    read_seq: int = 0
    # Called (in a thread) with a command's journal seq after it ran, before its Completed:
    # the run actor snapshots the workspace there (`workspace_snapshots`).
    after_command: Callable[[int], None] | None = None
    # Masks secret values (`redaction.Redactor`) in model replies and command output before
    # they are journaled, so neither the journal, the answer nor the model ever holds one.
    redact: Redactor = field(default_factory=lambda: Redactor({}))
    # Called (in a thread) after a command: the connections it made through the egress proxy,
    # journaled with its result (`egress`).
    take_egress: Callable[[], list[dict[str, Any]]] | None = None
    # Whether the run actor put the workspace back to before the interrupted command whose
    # Started has this seq (a run that reaches nothing outside, `snapshots.restore_state`):
    # then that command runs again by itself instead of waiting for a person.
    restored_before: Callable[[int], bool] | None = None
    # Called (in a thread) with a command's Started seq just before it runs: the egress proxy
    # writes that command's connections to storage as they happen (`run_egress.RunEgress.begin`).
    begin_egress: Callable[[int], None] | None = None
    # Called (in a thread) with the Started seq of a command found interrupted: what its
    # NeedsResolution record keeps as evidence (``{"egress": {...}}``, its connections).
    egress_evidence: Callable[[int], dict[str, Any]] | None = None
    # The sandbox's account (`money.sandbox_billing`): opened with the sandbox step, fed by every
    # command's recorded charge (live or replayed).
    meter: SandboxMeter | None = None

    @property
    def cost_usd(self) -> Decimal:
        """The model spend (routing and model calls): what ``totalUSD`` and the caps count."""
        return self.spend.budget.spent

    @property
    def sandbox_usd(self) -> Decimal:
        """The sandbox compute charged so far (commands' CPU and the workspace's storage)."""
        return self.meter.spent if self.meter is not None else Decimal(0)

    async def run(self) -> str:
        """Open the sandbox, run the first turn and return its answer.

        A keep-alive run goes on: after each answer it reads the next message as a journaled
        step (``turn-N/message``) and answers it in turn N, and raises `AwaitingMessage` when
        there is none yet. Replayed, a message already read comes from the journal, so the
        conversation is rebuilt in the order the messages were first read.

        A replay that asks for a different step than the journal recorded fails the run
        (`RunFailure` with reason ``NonDeterministic``, naming the step).
        """
        try:
            return await self._run()
        except NonDeterministic as diverged:
            raise RunFailure(diverged.reason, str(diverged)) from None

    async def _run(self) -> str:
        self.messages = []
        await self._open_sandbox()
        answer = await self._turn(1, self.spec.prompt)
        turn = 1
        while self.spec.keep_alive:
            self.answer = answer
            if self.on_answer is not None:
                await self.on_answer(answer)
            turn += 1
            message = await self._read_message(f"turn-{turn}/message", turn - 1)
            self.read_seq = int(message["seq"])
            answer = await self._turn(turn, str(message["payload"]))
        self.answer = answer
        return answer

    async def _read_message(self, step_id: str, answered: int) -> dict[str, Any]:
        arrived: dict[str, Any] | None = None
        if not self.steps.is_done(step_id):
            assert self.next_message is not None, "a keep-alive conversation needs an inbox"
            arrived = await self.next_message(self.read_seq)
            if arrived is None:
                raise AwaitingMessage(answered)

        async def read() -> dict[str, Any]:
            assert arrived is not None
            return arrived

        def as_message(read: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:  # the turn's prompt
            if not isinstance(read.get("payload"), str):
                return None
            return len(self.messages), {"role": "user", "contentOf": step_id, "key": "payload"}

        return await self.steps.run(
            step_id,
            "inbox",
            read,
            write_started=False,
            message=as_message,
            summary_of=lambda m: (
                f"message {m['seq']}" + (f" ({m['messageKey']})" if m.get("messageKey") else "")
            ),
        )

    async def _open_sandbox(self) -> None:
        async def create() -> dict[str, Any]:
            sandbox = await asyncio.to_thread(self.open_sandbox)
            self.sandbox = sandbox
            return {"backend": sandbox.backend, "workspace": str(sandbox.workspace), "note": sandbox.note}

        self.sandbox_info = await self.steps.run(
            "sandbox",
            "sandbox",
            create,
            summary_of=lambda r: f"{r['backend']} sandbox at {r['workspace']}",
        )
        if self.sandbox is None:  # replayed: the workspace exists; reattach to it
            self.sandbox = await asyncio.to_thread(self.open_sandbox)
        self.meter = open_meter(self.spend, self.steps)

    async def _add_message(self, message: dict[str, Any]) -> None:
        # Replay rebuilds the conversation in the same order; a message already journaled at
        # this position is not written again.
        await self.steps.record_message(len(self.messages), message)
        self.messages.append(message)

    def _request(self, model: str) -> ModelRequest:
        return ModelRequest(
            model=model,
            system=self.spec.system,
            messages=list(self.messages),
            max_tokens=self.spec.max_tokens,
        )

    def _input_bound(self) -> int:
        """An upper bound of the next call's input tokens: the whole conversation, by its bytes."""
        request = self._request("")
        return max_input_tokens(request.system, request.messages, request.tools)

    def _allowed(self) -> list[str]:
        allowed = self.spec.families or list(FAMILIES)
        return [family for family in FAMILIES if family in allowed]

    def _model_for(self, family: str) -> str:
        # A pinned Claude model applies only where Claude serves; the offline provider always
        # names its own model, so status never claims a model that did not answer.
        if self.spec.model_name and self.provider.name != "offline":
            return self.spec.model_name
        return self.provider.model_for_family(family)

    async def _route(self, step_id: str, prompt: str) -> dict[str, Any]:
        """The routing step: one priced router call per turn, or none when there is no choice."""
        allowed = self._allowed()
        pinned = self.spec.model_name is not None
        calls_router = len(allowed) > 1 and not pinned
        route_bound = Decimal(0)
        if not self.steps.is_done(step_id):
            if calls_router:
                route_bound = self.spend.worst(
                    ROUTER_MODEL, router_input_tokens(prompt), ROUTER_MAX_OUTPUT_TOKENS
                )
            tokens = self._input_bound()
            first_call = max(
                self.spend.worst(self._model_for(family), tokens, self.spec.max_tokens) for family in allowed
            )
            await self.spend.before_call(route_bound + first_call, route_bound)

        async def choose() -> dict[str, Any]:
            usage, charged = Usage(), Decimal(0)
            if pinned:
                known = family_of_model(self.spec.model_name or "", self.spend.prices.family_models)
                family, routing = known or "sonnet", "pinned"  # any name: a BYOK agent's may be unpriced
            elif not calls_router:
                family, routing = allowed[0], "jev"
            else:
                try:
                    decision = await self.router(prompt, allowed)
                    family, routing = str(decision["family"]), "jev"
                    if family not in allowed:
                        raise ValueError(f"the router chose {family!r}, which is not allowed")
                    usage = Usage(input_tokens=int(decision.get("inputTokens") or 0))
                    charged = self.spend.price(ROUTER_MODEL, usage, route_bound)
                except Exception:  # noqa: BLE001 - an unavailable router must not stop the turn
                    family, routing = fallback_family(allowed), "fallback"
            return {
                "family": family,
                "model": self._model_for(family),
                "routing": routing,
                "routerInputTokens": usage.input_tokens,
                "billedUSD": str(charged),
            }

        routed = await self.steps.run(
            step_id,
            "route",
            choose,
            write_started=False,
            cost_of=lambda r: r["billedUSD"],
            summary_of=lambda r: f"{r['family']} ({r['routing']}) -> {r['model']}, ${r['billedUSD']}",
        )
        self.spend.record(Decimal(routed.get("billedUSD", "0")))
        return routed

    @tracing.traced_turn
    async def _turn(self, index: int, prompt: str) -> str:
        prefix = f"turn-{index}"
        await self._add_message({"role": "user", "content": prompt})
        routed = await self._route(f"{prefix}/route", prompt)
        turn = TurnRecord(
            index=index,
            prompt=prompt[:_PROMPT_PREVIEW],
            family=routed["family"],
            model=routed["model"],
            routing=routed["routing"],
            costUSD=routed.get("billedUSD", "0"),
            startedAt=utc_now(),
        )
        self.turns.append(turn)
        await self.on_progress(self.turns)

        tool_calls = 0
        limit_warned = False
        call = 0
        while True:
            call += 1
            response, charged = await self._model_call(
                f"{prefix}/model-{call}", routed["model"], routed["family"]
            )
            turn.inputTokens += response.usage.input_tokens
            turn.outputTokens += response.usage.output_tokens
            turn.cacheCreationTokens += response.usage.cache_creation_input_tokens
            turn.cacheReadTokens += response.usage.cache_read_input_tokens
            turn.costUSD = str(Decimal(turn.costUSD) + charged)
            add_list_cost(turn, self.spend.prices, self.spend.access, routed["model"], response.usage)
            turn.stopReason = response.stop_reason
            await self._add_message({"role": "assistant", "content": response.content})
            if response.stop_reason == "pause_turn":
                # The API paused a long turn; sending the conversation back lets it continue.
                await self.on_progress(self.turns)
                continue
            if response.stop_reason == "refusal":
                turn.finishedAt = utc_now()
                await self.on_progress(self.turns)
                raise RunFailure(
                    RunReason.MODEL_REFUSED, "the model declined to answer (stop_reason: refusal)"
                )
            uses = response.tool_uses()
            if response.stop_reason != "tool_use" or not uses:
                turn.finishedAt = utc_now()
                self.stop_reason = response.stop_reason
                await self.on_progress(self.turns)
                return response.text()
            if limit_warned:
                raise RunFailure(
                    RunReason.MAX_TOOL_CALLS_REACHED,
                    f"the model asked for more commands after reaching maxToolCalls "
                    f"({self.spec.max_tool_calls}) in turn {index}",
                )
            results = []
            for position, use in enumerate(uses, start=1):
                if tool_calls >= self.spec.max_tool_calls:
                    limit_warned = True
                    results.append(
                        tool_error(
                            use,
                            f"maxToolCalls ({self.spec.max_tool_calls}) reached "
                            "for this turn: answer now with what you have.",
                        )
                    )
                    continue
                tool_calls += 1
                turn.toolCalls = tool_calls
                # The round's last command writes the tool results message with its Completed.
                then = results if position == len(uses) else None
                results.append(await self._command(f"{prefix}/command-{call}-{position}", use, then))
            await self._add_message({"role": "user", "content": results})
            await self.on_progress(self.turns)

    async def _model_call(self, step_id: str, model: str, family: str) -> tuple[ModelResponse, Decimal]:
        request = self._request(model)
        bound = Decimal(0)
        if not self.steps.is_done(step_id):
            bound = self.spend.worst(model, self._input_bound(), request.max_tokens)
            await self.spend.before_call(bound, bound)

        async def call() -> dict[str, Any]:
            began = time.monotonic()
            try:
                with tracing.model_call(self.provider.name, model, request.max_tokens, step_id) as traced:
                    response = await call_model(self.provider, request)  # rate-limited if configured
                    traced.reply(response)
            except ModelError as error:
                raise StepFailed(step_id, {"reason": error.reason, "message": str(error)}) from error
            charged = self.spend.price(model, response.usage, bound)
            usage = response.usage
            metrics.model_call(
                model,
                family,
                self.spend.access,
                time.monotonic() - began,
                {
                    "input": usage.input_tokens,
                    "output": usage.output_tokens,
                    "cache_read": usage.cache_read_input_tokens,
                    "cache_creation": usage.cache_creation_input_tokens,
                },
                float(charged),
            )
            return {**self.redact.tree(response.to_dict()), "billedUSD": str(charged)}

        # On the server's key a lost call is ours to pay for and safe to make again; on the user's
        # own key it may have cost them, so an interrupted call waits for their decision.
        effect: Effect = "external" if self.spend.access == "BYOK" else "idempotent"
        try:
            recorded = await self.steps.run(
                step_id,
                "model",
                call,
                effect=effect,
                started={
                    "model": model,
                    "family": family,
                    "messages": len(request.messages),
                    "boundUSD": str(bound),
                },
                cost_of=lambda r: r["billedUSD"],
                # The assistant message `_turn` adds next, stored once: in this step's result.
                message=lambda r: (len(self.messages), {"role": "assistant", "contentOf": step_id}),
                summary_of=lambda r: (
                    f"{r['model']}: {r['stop_reason']}, "
                    f"{r['usage']['input_tokens']} in / {r['usage']['output_tokens']} out, "
                    f"${r['billedUSD']}"
                ),
            )
        except StepFailed as failure:
            raise RunFailure(
                failure.error.get("reason", RunReason.MODEL_ERROR),
                failure.error.get("message", "the model call failed"),
            ) from None
        charged = Decimal(recorded.get("billedUSD", "0"))
        self.spend.record(charged)
        return ModelResponse.from_dict(recorded), charged

    async def _command(
        self, step_id: str, use: dict[str, Any], then: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        command = use.get("input", {}).get("command") if isinstance(use.get("input"), dict) else None
        if use.get("name") != "bash" or not isinstance(command, str) or not command.strip():
            return tool_error(use, "only the bash tool exists, and it needs a non-empty 'command' string")
        sandbox = self.sandbox
        assert sandbox is not None
        meter = self.meter or open_meter(self.spend, self.steps)
        self.meter = meter
        reserved = Decimal(0)
        if not self.steps.is_done(step_id):  # held before it can accrue (the project's Budget)
            reserved = await hold(self.spend, meter, limits_of(sandbox))

        async def execute() -> dict[str, Any]:
            started = self.steps.recorded(step_id)
            if self.begin_egress is not None and started is not None:
                await asyncio.to_thread(self.begin_egress, started.seq)
            with tracing.command(shown, step_id) as traced:
                result = await asyncio.to_thread(sandbox.run, command)
                traced.result(result)
            metrics.command_ran(result.duration_seconds, result.exit_code)
            if self.after_command is not None and started is not None:
                await asyncio.to_thread(self.after_command, started.seq)
            done = {**result.to_dict(), "output": self.redact(result.output)}
            done.update(command_charge(meter, result, reserved))
            if self.take_egress is not None and (connections := await asyncio.to_thread(self.take_egress)):
                done["egress"] = connections
            return done

        shown = self.redact(command)
        restored_before = self.restored_before
        recorded = await self.steps.run(
            step_id,
            "command",
            execute,
            effect="external",
            retry_interrupted=(lambda record: restored_before(record.seq)) if restored_before else None,
            evidence_of=(lambda record: evidence(record.seq)) if (evidence := self.egress_evidence) else None,
            started={"command": shown},
            summary_of=lambda r: command_summary(shown, CommandResult.from_dict(r), r.get("egress") or []),
            message=None
            if then is None
            else lambda r: (
                len(self.messages),
                {"role": "user", "content": [*then, tool_result(use, CommandResult.from_dict(r))]},
            ),
        )
        if (last := self.steps.recorded(step_id)) is not None and last.state == "Completed":
            meter.record(recorded)  # a value a person resolved it with carries no charge
        return tool_result(use, CommandResult.from_dict(recorded))
