"""A program's Messages API call as a journaled, routed, priced, capped model step.

The program's Anthropic SDK talks to the bootstrap's relay, which forwards each request body
here (`ModelCall`). The run's real key never enters the sandbox: the call is made by the run
actor's provider, under the same rules as the Claude conversation's calls
(`runtime.conversation`): the model is the one the program named when it is one of the
Agent's families, else the router chooses among them; the worst case is checked against the
run's cap and held from the project's credits before the call (`money.spend.RunSpend`); the
charge is journaled with the response, so a replay returns the response and charges it again
without calling. Each call is one of the run's ``status.turns``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from nodus._runtime import protocol as wire
from nodus.contract import FAMILIES
from nodus_ray import metrics, tracing
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.steps import Effect, StepFailed, Steps
from nodus_ray.faults import crash_point
from nodus_ray.models.base import ModelError, ModelProvider, ModelRequest, ModelResponse, Usage
from nodus_ray.money.billing import max_input_tokens
from nodus_ray.money.prices import ROUTER_MODEL
from nodus_ray.money.spend import RunSpend
from nodus_ray.runtime.conversation import Router
from nodus_ray.runtime.list_costs import add_list_cost
from nodus_ray.runtime.rate_limited import call_model
from nodus_ray.runtime.router import ROUTER_MAX_OUTPUT_TOKENS, fallback_family, router_input_tokens
from nodus_ray.runtime.turn_record import TurnRecord
from nodus_ray.store.timestamps import utc_now

__all__ = ["ModelCalls", "anthropic_error"]

_PROMPT_PREVIEW = 200
_DEFAULT_MAX_TOKENS = 1024
# The Messages API's error types by the provider's reasons (`models.base.ModelError`).
_ERROR_TYPES = {
    "ModelAuthenticationFailed": "authentication_error",
    "ModelRequestInvalid": "invalid_request_error",
    "ModelUnavailable": "overloaded_error",
}
_MESSAGE_KEYS = ("id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage")


def anthropic_error(reason: str, message: str) -> dict[str, Any]:
    """A failed call as the journal keeps it and the program gets it: ``type`` is the Messages
    API's error type (``overloaded_error``...), which the bootstrap's relay answers with its status."""
    kind = _ERROR_TYPES.get(reason, "api_error")
    return {"type": kind, "message": message, "traceback": "", "reason": reason}


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return ""


def _prompt_of(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [
                str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
            ]
            if texts:
                return "\n".join(texts)
    return ""


@dataclass
class ModelCalls:
    """The model steps of one run's program; ``turns`` is what ``status.turns`` shows."""

    steps: Steps
    provider: ModelProvider
    spend: RunSpend
    router: Router
    families: list[str] | None
    model_name: str | None = None  # the Agent's pinned model (spec.model.name)
    redact: Redactor = field(default_factory=lambda: Redactor({}))
    on_progress: Callable[[list[TurnRecord]], Awaitable[None]] | None = None
    turns: list[TurnRecord] = field(default_factory=list)

    def _allowed(self) -> list[str]:
        allowed = self.families or list(FAMILIES)
        return [family for family in FAMILIES if family in allowed]

    def _model_for(self, family: str, asked: str | None) -> str:
        if self.provider.name != "offline":
            if asked and family in asked:
                return asked
            if self.model_name:
                return self.model_name
        return self.provider.model_for_family(family)

    def _named_family(self, asked: str | None) -> str | None:
        allowed = self._allowed()
        if asked:
            for family in allowed:
                if family in asked:
                    return family
        return None

    async def model(self, step_id: str, request: wire.ModelCall) -> Any:
        body = request.body
        effect: Effect = "external" if self.spend.access == "BYOK" else "idempotent"
        begun = await self.steps.begin(step_id, "model", effect=effect, write_started=effect == "external")
        if begun.recorded:
            if begun.error is not None:
                raise StepFailed(step_id, begun.error)
            recorded = begun.value if isinstance(begun.value, dict) else {}
            self._count(recorded, live=False)
            return _message(recorded)
        messages = list(body.get("messages") or [])
        system = _system_text(body.get("system"))
        tools = list(body.get("tools") or [])
        max_tokens = int(body.get("max_tokens") or _DEFAULT_MAX_TOKENS)
        asked = body.get("model") if isinstance(body.get("model"), str) else None
        prompt = _prompt_of(messages)
        allowed = self._allowed()
        family = self._named_family(asked)
        route_bound = Decimal(0)
        calls_router = family is None and len(allowed) > 1
        if calls_router:
            route_bound = self.spend.worst(
                ROUTER_MODEL, router_input_tokens(prompt), ROUTER_MAX_OUTPUT_TOKENS
            )
        tokens = max_input_tokens(system, messages, tools)
        candidates = [family] if family is not None else allowed
        call_bound = max(self.spend.worst(self._model_for(f, asked), tokens, max_tokens) for f in candidates)
        await self.spend.before_call(route_bound + call_bound, route_bound + call_bound)

        routing, route_charge = "pinned", Decimal(0)
        if family is None and not calls_router:
            family, routing = allowed[0], "jev"
        elif family is None:
            try:
                decision = await self.router(prompt, allowed)
                family, routing = str(decision["family"]), "jev"
                if family not in allowed:
                    raise ValueError(f"the router chose {family!r}, which is not allowed")
                usage = Usage(input_tokens=int(decision.get("inputTokens") or 0))
                route_charge = self.spend.price(ROUTER_MODEL, usage, route_bound)
            except Exception:  # noqa: BLE001 - an unavailable router must not stop the call
                family, routing = fallback_family(allowed), "fallback"
        model = self._model_for(family, asked)
        call = ModelRequest(model=model, system=system, messages=messages, max_tokens=max_tokens, tools=tools)
        began = time.monotonic()
        try:
            with tracing.model_call(self.provider.name, model, max_tokens, step_id) as traced:
                response = await call_model(self.provider, call)  # rate-limited if configured
                traced.reply(response)
        except ModelError as error:
            failure = anthropic_error(error.reason, str(error))
            await self.steps.fail(step_id, "model", failure, attempt=begun.attempt)
            raise StepFailed(step_id, failure) from error
        crash_point("step-effect-done", f"{self.steps.journal.prefix}/{step_id}")  # made, not recorded
        charged = route_charge + self.spend.price(model, response.usage, call_bound)
        metrics.model_call(
            model,
            family,
            self.spend.access,
            time.monotonic() - began,
            {
                "input": response.usage.input_tokens,
                "output": response.usage.output_tokens,
                "cache_read": response.usage.cache_read_input_tokens,
                "cache_creation": response.usage.cache_creation_input_tokens,
            },
            float(charged),
        )
        recorded = {
            **self.redact.tree(response.to_dict()),
            "id": f"msg_{step_id.replace('-', '_')}",
            "type": "message",
            "role": "assistant",
            "stop_sequence": None,
            "family": family,
            "routing": routing,
            "prompt": self.redact(prompt[:_PROMPT_PREVIEW]),
            "billedUSD": str(charged),
            "at": utc_now(),
        }
        await self.steps.end(
            step_id,
            "model",
            recorded,
            attempt=begun.attempt,
            summary=(
                f"{model}: {response.stop_reason}, {response.usage.input_tokens} in / "
                f"{response.usage.output_tokens} out, ${charged}"
            ),
            cost_usd=str(charged),
        )
        self._count(recorded, live=True)
        if self.on_progress is not None:
            await self.on_progress(self.turns)
        return _message(recorded)

    def replayed(self, step_id: str) -> None:
        """A call inside a step that replayed whole: its charge and turn, from the journal."""
        record = self.steps.recorded(step_id)
        if record is not None and record.kind == "model" and record.state in ("Completed", "Resolved"):
            result = record.payload.get("result") if isinstance(record.payload, dict) else None
            if isinstance(result, dict):
                self._count(result, live=False)

    def _count(self, recorded: dict[str, Any], *, live: bool) -> None:
        """The call's charge and its turn, the same whether it ran now or was replayed."""
        charged = Decimal(str(recorded.get("billedUSD") or "0"))
        self.spend.record(charged)
        usage = Usage.from_dict(recorded.get("usage") or {})
        routing = recorded.get("routing")
        turn = TurnRecord(
            index=len(self.turns) + 1,
            prompt=str(recorded.get("prompt") or ""),
            family=recorded.get("family"),
            model=recorded.get("model"),
            routing=routing if routing in ("jev", "fallback", "pinned") else None,
            inputTokens=usage.input_tokens,
            outputTokens=usage.output_tokens,
            cacheCreationTokens=usage.cache_creation_input_tokens,
            cacheReadTokens=usage.cache_read_input_tokens,
            costUSD=str(charged),
            stopReason=recorded.get("stop_reason"),
            startedAt=recorded.get("at"),
            finishedAt=recorded.get("at"),
        )
        # BYOK: what the call cost at list price (the model as the reply names it); not billed.
        add_list_cost(turn, self.spend.prices, self.spend.access, str(recorded.get("model") or ""), usage)
        self.turns.append(turn)


def _message(recorded: dict[str, Any]) -> dict[str, Any]:
    """The Messages API response the program's SDK reads (the journal's extra keys dropped)."""
    response = ModelResponse.from_dict(recorded)
    message = {key: recorded[key] for key in _MESSAGE_KEYS if key in recorded}
    message["usage"] = response.usage.to_dict()
    return message
