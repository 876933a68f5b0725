"""The Claude conversation as a journaled program.

One turn: route the prompt to a family, then call the model, run the commands it asks for
in the sandbox, hand the results back, and repeat until the model ends its turn. Every
action is a step of `durable.Steps`, so running this program again over the same journal
replays it: recorded routing, model answers and command results come back from the journal
and nothing with an effect happens twice.

The program is deterministic given its journal; all state the status shows (turns, tokens,
cost) is recomputed from step results, so a replayed run reports exactly what it reported
before its actor died.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from nodus.resources import Turn

from .durable import Steps, StepFailed
from .models.base import ModelError, ModelProvider, ModelRequest, ModelResponse
from .router import route
from .sandbox import CommandResult, Sandbox

__all__ = ["ConversationSpec", "Conversation", "RunFailure"]

_PROMPT_PREVIEW = 200


class RunFailure(Exception):
    """The program cannot go on; ``reason`` is the run's ``status.reason``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ConversationSpec:
    system: str
    families: list[str] | None
    model_name: str | None
    max_tokens: int
    max_tool_calls: int
    prompt: str


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Conversation:
    """Runs turns over `Steps`; reports progress through ``on_progress`` after each step."""

    steps: Steps
    provider: ModelProvider
    spec: ConversationSpec
    open_sandbox: Callable[[], Sandbox]
    on_progress: Callable[[list[Turn]], Awaitable[None]]
    sandbox: Sandbox | None = None
    sandbox_info: dict[str, Any] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cost_usd(self) -> Decimal:
        return sum((Decimal(turn.costUSD) for turn in self.turns), Decimal(0))

    async def run(self) -> str:
        """Open the sandbox, run the first turn and return its answer."""
        self.messages = []
        await self._open_sandbox()
        return await self._turn(1, self.spec.prompt)

    async def _open_sandbox(self) -> None:
        async def create() -> dict[str, Any]:
            sandbox = await asyncio.to_thread(self.open_sandbox)
            self.sandbox = sandbox
            return {"backend": sandbox.backend, "workspace": str(sandbox.workspace), "note": sandbox.note}

        self.sandbox_info = await self.steps.run(
            "sandbox", "sandbox", create,
            summary_of=lambda r: f"{r['backend']} sandbox at {r['workspace']}",
        )
        if self.sandbox is None:  # replayed: the workspace exists; reattach to it
            self.sandbox = await asyncio.to_thread(self.open_sandbox)

    async def _add_message(self, message: dict[str, Any]) -> None:
        # Replay rebuilds the conversation in the same order; a message already journaled at
        # this position is not written again.
        await self.steps.record_message(len(self.messages), message)
        self.messages.append(message)

    async def _turn(self, index: int, prompt: str) -> str:
        prefix = f"turn-{index}"
        await self._add_message({"role": "user", "content": prompt})

        async def choose() -> dict[str, Any]:
            decision = route(prompt, self.spec.families)
            family = decision.family
            # A pinned Claude model applies only where Claude serves; the offline provider
            # always names its own model, so status never claims a model that did not answer.
            pinned = self.spec.model_name if self.provider.name != "offline" else None
            model = pinned or self.provider.model_for_family(family)
            return {"family": family, "model": model, "routing": decision.routing, "score": decision.score}

        routed = await self.steps.run(
            f"{prefix}/route", "route", choose,
            summary_of=lambda r: f"{r['family']} ({r['routing']}) -> {r['model']}",
        )
        turn = Turn(index=index, prompt=prompt[:_PROMPT_PREVIEW], family=routed["family"],
                    model=routed["model"], routing=routed["routing"], startedAt=_now())
        self.turns.append(turn)
        await self.on_progress(self.turns)

        tool_calls = 0
        limit_warned = False
        call = 0
        while True:
            call += 1
            response = await self._model_call(f"{prefix}/model-{call}", routed["model"])
            turn.inputTokens += response.usage.input_tokens
            turn.outputTokens += response.usage.output_tokens
            turn.cacheCreationTokens += response.usage.cache_creation_input_tokens
            turn.cacheReadTokens += response.usage.cache_read_input_tokens
            turn.stopReason = response.stop_reason
            await self._add_message({"role": "assistant", "content": response.content})
            uses = response.tool_uses()
            if response.stop_reason != "tool_use" or not uses:
                turn.finishedAt = _now()
                await self.on_progress(self.turns)
                return response.text()
            if limit_warned:
                raise RunFailure(
                    "MaxToolCallsReached",
                    f"the model asked for more commands after reaching maxToolCalls "
                    f"({self.spec.max_tool_calls}) in turn {index}",
                )
            results = []
            for position, use in enumerate(uses, start=1):
                if tool_calls >= self.spec.max_tool_calls:
                    limit_warned = True
                    results.append(_tool_error(use, f"maxToolCalls ({self.spec.max_tool_calls}) reached "
                                                    "for this turn: answer now with what you have."))
                    continue
                tool_calls += 1
                turn.toolCalls = tool_calls
                results.append(await self._command(f"{prefix}/command-{call}-{position}", use))
            await self._add_message({"role": "user", "content": results})
            await self.on_progress(self.turns)

    async def _model_call(self, step_id: str, model: str) -> ModelResponse:
        request = ModelRequest(model=model, system=self.spec.system, messages=list(self.messages),
                               max_tokens=self.spec.max_tokens)

        async def call() -> dict[str, Any]:
            try:
                response = await asyncio.to_thread(self.provider.complete, request)
            except ModelError as error:
                raise StepFailed(step_id, {"reason": "ModelError", "message": str(error)}) from error
            return response.to_dict()

        try:
            recorded = await self.steps.run(
                step_id, "model", call,
                started={"model": model, "messages": len(request.messages)},
                summary_of=lambda r: f"{r['model']}: {r['stop_reason']}, "
                                     f"{r['usage']['input_tokens']} in / {r['usage']['output_tokens']} out",
            )
        except StepFailed as failure:
            raise RunFailure("ModelError", failure.error.get("message", "the model call failed")) from None
        return ModelResponse.from_dict(recorded)

    async def _command(self, step_id: str, use: dict[str, Any]) -> dict[str, Any]:
        command = use.get("input", {}).get("command") if isinstance(use.get("input"), dict) else None
        if use.get("name") != "bash" or not isinstance(command, str) or not command.strip():
            return _tool_error(use, "only the bash tool exists, and it needs a non-empty 'command' string")
        sandbox = self.sandbox
        assert sandbox is not None

        async def execute() -> dict[str, Any]:
            result = await asyncio.to_thread(sandbox.run, command)
            return result.to_dict()

        recorded = await self.steps.run(
            step_id, "command", execute, effect="external",
            started={"command": command},
            summary_of=lambda r: _command_summary(command, CommandResult.from_dict(r)),
        )
        result = CommandResult.from_dict(recorded)
        return {
            "type": "tool_result",
            "tool_use_id": use.get("id", ""),
            "content": result.for_model(),
            "is_error": result.exit_code != 0,
        }


def _tool_error(use: dict[str, Any], message: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": use.get("id", ""), "content": message, "is_error": True}


def _command_summary(command: str, result: CommandResult) -> str:
    shown = command if len(command) <= 80 else command[:77] + "..."
    if result.exit_code is None:
        return f"{shown} -> stopped ({result.limit or 'killed'})"
    return f"{shown} -> exit {result.exit_code}"
