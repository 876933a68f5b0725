"""A program's model calls: journaled once, replayed without a call, capped before they are
sent, routed among the Agent's families, and a provider error recorded as an API error."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from nodus._runtime import protocol as wire
from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import StepFailed, Steps
from nodus_ray.models.base import ModelError, ModelRequest, ModelResponse, Usage
from nodus_ray.money.billing import CapExceeded, RunBudget
from nodus_ray.money.prices import PriceTable
from nodus_ray.money.spend import RunSpend
from nodus_ray.runtime.program.model_calls import ModelCalls
from nodus_ray.store.storage import Storage

BODY = {"model": "claude-haiku-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]}


class Provider:
    name = "offline"

    def __init__(self, fail: bool = False) -> None:
        self.requests: list[ModelRequest] = []
        self.fail = fail

    def model_for_family(self, family: str) -> str:
        return f"offline-{family}"

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if self.fail:
            raise ModelError("overloaded", reason="ModelUnavailable")
        return ModelResponse(
            model=request.model,
            content=[{"type": "text", "text": "hello"}],
            stop_reason="end_turn",
            usage=Usage(input_tokens=10, output_tokens=5),
        )


async def _reserve(amount: Decimal) -> None:
    return None


def calls(
    tmp_path: Path, provider: Provider, cap: str | None = None, families: list[str] | None = None
) -> ModelCalls:
    journal = Journal(Storage(str(tmp_path / "store")), "projects/p/agentruns/r/journal")
    journal.load()
    routed: list[str] = []

    async def route(prompt: str, allowed: list[str]) -> dict[str, Any]:
        routed.append(prompt)
        return {"family": allowed[-1], "inputTokens": 20}

    spend = RunSpend(
        prices=PriceTable.load(),
        access="Nodus",
        budget=RunBudget(cap=None if cap is None else Decimal(cap)),
        reserve_credits=_reserve,
    )
    return ModelCalls(steps=Steps(journal), provider=provider, spend=spend, router=route, families=families)


def test_a_call_is_journaled_once_and_replayed_without_calling(tmp_path: Path) -> None:
    provider = Provider()
    first = calls(tmp_path, provider)
    message = asyncio.run(first.model("model-1", wire.ModelCall(BODY)))
    assert message["content"] == [{"type": "text", "text": "hello"}] and message["type"] == "message"
    assert "billedUSD" not in message
    assert [t.family for t in first.turns] == ["haiku"] and first.turns[0].routing == "pinned"
    charged = first.spend.budget.spent
    assert charged > 0
    again = calls(tmp_path, provider)
    assert asyncio.run(again.model("model-1", wire.ModelCall(BODY))) == message
    assert len(provider.requests) == 1, "replayed from the journal"
    assert again.spend.budget.spent == charged and len(again.turns) == 1


def test_a_call_over_the_cap_is_not_sent(tmp_path: Path) -> None:
    provider = Provider()
    with pytest.raises(CapExceeded):
        asyncio.run(calls(tmp_path, provider, cap="0.000001").model("model-1", wire.ModelCall(BODY)))
    assert provider.requests == []


def test_an_unnamed_model_is_routed_among_the_agents_families(tmp_path: Path) -> None:
    provider = Provider()
    body = {**BODY, "model": "whatever"}
    model = calls(tmp_path, provider, families=["haiku", "sonnet"])
    asyncio.run(model.model("model-1", wire.ModelCall(body)))
    assert model.turns[0].family == "sonnet" and model.turns[0].routing == "jev"
    assert provider.requests[0].model == "offline-sonnet"


def test_a_provider_error_is_recorded_as_an_api_error_and_raised_again(tmp_path: Path) -> None:
    with pytest.raises(StepFailed) as failed:
        asyncio.run(calls(tmp_path, Provider(fail=True)).model("model-1", wire.ModelCall(BODY)))
    assert failed.value.error["type"] == "overloaded_error"
    provider = Provider()
    with pytest.raises(StepFailed) as again:
        asyncio.run(calls(tmp_path, provider).model("model-1", wire.ModelCall(BODY)))
    assert again.value.error == failed.value.error and provider.requests == []


def test_a_call_inside_a_replayed_step_counts_its_charge_and_turn_again(tmp_path: Path) -> None:
    first = calls(tmp_path, Provider())
    asyncio.run(first.model("ask-1/model-1", wire.ModelCall(BODY)))
    again = calls(tmp_path, Provider())
    again.replayed("ask-1/model-1")
    assert again.spend.budget.spent == first.spend.budget.spent > 0 and len(again.turns) == 1
