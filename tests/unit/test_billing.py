"""Prices, the margin and the per-run cap: exact decimals, and a spend that never passes the cap.

The plain tests pin the numbers a user sees (one call of each family, the margin, rounding, the
override file). The property tests check the arithmetic (bounds, rounding, the budget's clamp),
and the invariant the product promises through the real run loop (`Conversation` and
`RunSpend` over a real journal, with a scripted model, router and sandbox): a run's spend never
exceeds its cap, each charge is the price of its usage, and a run that stops for the cap stops
with ``MaxCostReached`` because its next call, at its largest, really did not fit.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import tempfile
from dataclasses import dataclass, field, replace
from datetime import date
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nodus.lifecycle import PARKED_REASONS, RunReason
from nodus.resources import FAMILIES
from nodus_ray.durable.journal import JournalRecord
from nodus_ray.durable.steps import NeedsResolution, Steps, message_content
from nodus_ray.models.base import BASH_TOOL, ModelError, ModelProvider, ModelRequest, ModelResponse, Usage
from nodus_ray.models.offline import OFFLINE_MODELS, OfflineProvider
from nodus_ray.money.billing import (
    NODUS_MARGIN,
    PER_REQUEST_OVERHEAD_TOKENS,
    CapExceeded,
    RunBudget,
    billed,
    max_input_tokens,
    worst_case_cost,
)
from nodus_ray.money.prices import (
    DEFAULT_PRICE_TABLE,
    MILLION,
    ROUTER_MAX_OUTPUT_TOKENS,
    ROUTER_MODEL,
    ModelPrice,
    PriceTable,
    UnpricedModel,
)
from nodus_ray.money.spend import CreditsExhausted, RunSpend
from nodus_ray.runtime.conversation import AwaitingMessage, Conversation, ConversationSpec, Router, RunFailure
from nodus_ray.runtime.router import router_input_tokens
from nodus_ray.runtime.turn_record import TurnRecord
from nodus_ray.sandbox import CommandResult, Sandbox
from nodus_ray.settings import ServerSettings
from tests.unit.test_conversation import Crash, Rig

D = Decimal
CLAUDE = ["claude-haiku-5-5", "claude-sonnet-5-5", "claude-opus-5-5", "claude-fable-5-5"]

# --------------------------------------------------------------------------------------------
# Prices


# input 1234, output 567, cache write 89, cache read 10; worked by hand from the list prices:
#   haiku  1234*1  + 567*5   + 89*1.25  + 10*0.10 =   4181.25 -> 0.00418125 -> 0.004182
#   sonnet 1234*3  + 567*15  + 89*3.75  + 10*0.30 =  12543.75 -> 0.01254375 -> 0.012544
#   opus   1234*15 + 567*75  + 89*18.75 + 10*1.50 =  62718.75 -> 0.06271875 -> 0.062719
#   fable  1234*30 + 567*150 + 89*37.50 + 10*3.00 = 125437.5  -> 0.1254375  -> 0.125438
@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("claude-haiku-5-5", "0.004182"),
        ("claude-sonnet-5-5", "0.012544"),
        ("claude-opus-5-5", "0.062719"),
        ("claude-fable-5-5", "0.125438"),
    ],
)
def test_known_usage_costs_exactly_for_each_family(model: str, expected: str) -> None:
    usage = Usage(
        input_tokens=1234, output_tokens=567, cache_creation_input_tokens=89, cache_read_input_tokens=10
    )
    cost = DEFAULT_PRICE_TABLE.cost(model, usage)
    assert isinstance(cost, Decimal)
    assert cost == D(expected)
    assert str(cost) == expected  # six places, as shown to users


def test_cache_tokens_are_priced_at_their_own_rates() -> None:
    table = DEFAULT_PRICE_TABLE
    assert table.cost("claude-sonnet-5-5", Usage(cache_creation_input_tokens=1_000_000)) == D("3.75")
    assert table.cost("claude-sonnet-5-5", Usage(cache_read_input_tokens=1_000_000)) == D("0.30")
    assert table.cost("claude-sonnet-5-5", Usage(input_tokens=1_000_000)) == D("3")
    assert table.cost("claude-sonnet-5-5", Usage(output_tokens=1_000_000)) == D("15")


def test_cost_rounds_up_to_a_microdollar() -> None:
    table = DEFAULT_PRICE_TABLE
    assert table.cost(ROUTER_MODEL, Usage(input_tokens=1)) == D("0.000001")  # 0.0000001 rounds up
    assert table.cost("claude-haiku-5-5", Usage(cache_read_input_tokens=1)) == D("0.000001")
    assert table.cost("claude-haiku-5-5", Usage(input_tokens=3, cache_read_input_tokens=1)) == D("0.000004")
    assert table.cost("claude-haiku-5-5", Usage()) == D("0")


def test_defaults_are_dated_and_complete() -> None:
    table = DEFAULT_PRICE_TABLE
    assert table.effective == date(2026, 11, 1)
    assert table.family_models == {
        "haiku": "claude-haiku-5-5",
        "sonnet": "claude-sonnet-5-5",
        "opus": "claude-opus-5-5",
        "fable": "claude-fable-5-5",
    }
    assert table.price("claude-opus-5-5") == ModelPrice(D("15"), D("75"), D("18.75"), D("1.50"))
    assert table.price(ROUTER_MODEL) == ModelPrice(D("0.10"), D("0"), D("0"), D("0"))
    assert 0 < ROUTER_MAX_OUTPUT_TOKENS <= 8


@pytest.mark.parametrize("family", sorted(OFFLINE_MODELS))
def test_offline_models_are_priced_at_a_tenth_of_claude(family: str) -> None:
    table = DEFAULT_PRICE_TABLE
    offline, claude = table.price(OFFLINE_MODELS[family]), table.price(table.family_models[family])
    for name in ("input", "output", "cache_write", "cache_read"):
        assert getattr(offline, name) == getattr(claude, name) / 10
        assert getattr(offline, name) > 0  # small but never free
    usage = Usage(
        input_tokens=5000, output_tokens=700, cache_creation_input_tokens=300, cache_read_input_tokens=40
    )
    assert D(0) < table.cost(OFFLINE_MODELS[family], usage) < table.cost(table.family_models[family], usage)


def test_unknown_model_is_refused_not_free() -> None:
    with pytest.raises(UnpricedModel) as caught:
        DEFAULT_PRICE_TABLE.cost("claude-mystery-9", Usage(input_tokens=10))
    assert caught.value.model == "claude-mystery-9"
    assert str(caught.value) == (
        "model 'claude-mystery-9' has no price in the price table (effective 2026-11-01); "
        "add it with NODUS_PRICES"
    )
    assert not DEFAULT_PRICE_TABLE.has("claude-mystery-9")
    with pytest.raises(UnpricedModel):
        worst_case_cost(DEFAULT_PRICE_TABLE, "claude-mystery-9", 10, 10)
    again = pickle.loads(pickle.dumps(caught.value))
    assert again.model == "claude-mystery-9" and str(again) == str(caught.value)


def test_negative_usage_is_refused() -> None:
    with pytest.raises(ValueError):
        DEFAULT_PRICE_TABLE.cost("claude-haiku-5-5", Usage(input_tokens=-1))


def test_price_table_to_dict_is_json_and_round_trips(tmp_path: Path) -> None:
    data = DEFAULT_PRICE_TABLE.to_dict()
    text = json.dumps(data)
    assert data["effective"] == "2026-11-01"
    assert data["prices"]["claude-sonnet-5-5"] == {
        "input": "3",
        "output": "15",
        "cacheWrite": "3.75",
        "cacheRead": "0.30",
    }
    assert data["prices"]["offline-haiku"]["cacheRead"] == "0.01"
    path = tmp_path / "prices.json"
    path.write_text(text)
    assert PriceTable.load(str(path)) == DEFAULT_PRICE_TABLE
    assert pickle.loads(pickle.dumps(DEFAULT_PRICE_TABLE)) == DEFAULT_PRICE_TABLE


# --------------------------------------------------------------------------------------------
# The operator's override file


def test_override_json_is_merged_over_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(
        json.dumps(
            {
                "effective": "2026-12-01",
                "prices": {
                    "claude-sonnet-5-5": {"input": "2.5"},  # partial: the rest stays
                    "claude-sonnet-6": {"input": "4", "output": "20", "cacheWrite": "5", "cacheRead": 0.4},
                    "claude-fable-5-5": None,  # removed: its calls are refused
                },
                "familyModels": {"sonnet": "claude-sonnet-6", "fable": "claude-opus-5-5"},
            }
        )
    )
    table = PriceTable.load(str(path))
    assert table.effective == date(2026, 12, 1)
    assert table.price("claude-sonnet-5-5") == ModelPrice(D("2.5"), D("15"), D("3.75"), D("0.30"))
    assert table.price("claude-sonnet-6").cache_read == D("0.4")  # a JSON number read from its digits
    assert table.price("claude-haiku-5-5") == DEFAULT_PRICE_TABLE.price("claude-haiku-5-5")
    assert table.family_models["sonnet"] == "claude-sonnet-6"
    assert table.family_models["haiku"] == "claude-haiku-5-5"
    assert not table.has("claude-fable-5-5")
    with pytest.raises(UnpricedModel):
        table.price("claude-fable-5-5")
    assert DEFAULT_PRICE_TABLE.price("claude-sonnet-5-5").input == D("3")  # defaults untouched


def test_override_yaml_reads_decimals_exactly(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(
        "effective: 2027-01-15\n"
        "prices:\n"
        "  claude-haiku-5-5:\n"
        "    input: 0.80\n"
        "    output: 4\n"
        "    cacheWrite: '1.00'\n"
        "    cacheRead: 0.08\n"
        "  my-local-model: {input: 0.1, output: 0.2, cacheWrite: 0.1, cacheRead: 0.01}\n"
    )
    table = PriceTable.load(str(path))
    assert table.effective == date(2027, 1, 15)
    assert table.price("claude-haiku-5-5") == ModelPrice(D("0.80"), D("4"), D("1.00"), D("0.08"))
    assert table.price("my-local-model").input == D("0.1")  # not 0.1000000000000000055511151231257827
    assert table.price("my-local-model").input.as_tuple() == D("0.1").as_tuple()
    assert table.to_dict()["prices"]["claude-haiku-5-5"]["input"] == "0.80"


def test_override_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "prices.yml"
    path.write_text("prices:\n  claude-opus-5-5: {output: '70'}\n")

    def from_env() -> PriceTable:
        """The server reads NODUS_PRICES once, in its settings; the table loads what they name."""
        return PriceTable.load(ServerSettings.from_env().prices_file)

    monkeypatch.setenv("NODUS_PRICES", str(path))
    table = from_env()
    assert table.price("claude-opus-5-5").output == D("70")
    assert table.effective == DEFAULT_PRICE_TABLE.effective  # no date given: the default's stays
    monkeypatch.setenv("NODUS_PRICES", "")
    assert from_env() == DEFAULT_PRICE_TABLE
    monkeypatch.delenv("NODUS_PRICES")
    assert from_env() == DEFAULT_PRICE_TABLE
    assert PriceTable.load() == DEFAULT_PRICE_TABLE


@pytest.mark.parametrize(
    ("name", "content", "field"),
    [
        (
            "bad.json",
            '{"prices": {"claude-x": {"input": "1", "output": "2", "cacheWrite": "abc", "cacheRead": "0"}}}',
            "prices.claude-x.cacheWrite",
        ),
        ("neg.json", '{"prices": {"claude-haiku-5-5": {"input": "-1"}}}', "prices.claude-haiku-5-5.input"),
        ("nan.yaml", "prices:\n  claude-haiku-5-5: {input: .nan}\n", "prices.claude-haiku-5-5.input"),
        ("bool.yaml", "prices:\n  claude-haiku-5-5: {output: true}\n", "prices.claude-haiku-5-5.output"),
        (
            "missing.json",
            '{"prices": {"claude-new": {"input": "1", "output": "2"}}}',
            "prices.claude-new.cacheWrite",
        ),
        ("extra.json", '{"prices": {"claude-haiku-5-5": {"inputs": "1"}}}', "prices.claude-haiku-5-5.inputs"),
        ("top.json", '{"price": {}}', "price"),
        ("date.json", '{"effective": "next tuesday"}', "effective"),
        ("family.json", '{"familyModels": {"sonnet": "claude-unpriced"}}', "familyModels.sonnet"),
        ("removed.json", '{"prices": {"claude-haiku-5-5": null}}', "familyModels.haiku"),
        ("kind.json", '{"familyModels": {"gpt": "claude-haiku-5-5"}}', "familyModels.gpt"),
        ("list.json", '{"prices": ["claude-haiku-5-5"]}', "prices"),
    ],
)
def test_bad_override_names_the_file_and_the_field(
    tmp_path: Path, name: str, content: str, field: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError) as caught:
        PriceTable.load(str(path))
    message = str(caught.value)
    assert str(path) in message
    assert field in message


def test_unreadable_or_malformed_override_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ValueError, match="nope.json"):
        PriceTable.load(str(missing))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):
        PriceTable.load(str(broken))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert PriceTable.load(str(empty)) == DEFAULT_PRICE_TABLE


# --------------------------------------------------------------------------------------------
# The margin, the worst case and the budget


def test_nodus_margin_is_exact_and_rounds_up() -> None:
    assert NODUS_MARGIN == D("0.875")
    assert billed(D("0.000875"), "Nodus") == D("0.001000")
    assert str(billed(D("0.000875"), "Nodus")) == "0.001000"
    assert billed(D("0.007"), "Nodus") == D("0.008")
    assert billed(D("0.000001"), "Nodus") == D("0.000002")  # 0.00000114... rounds up
    assert billed(D("0.000007"), "Nodus") == D("0.000008")  # exactly 0.000008: no extra microdollar
    assert billed(D("0"), "Nodus") == D("0")
    assert billed(D("1.75"), "Nodus") == D("2")


def test_byok_is_never_charged() -> None:
    assert billed(D("12.345678"), "BYOK") == D("0")
    budget = RunBudget(cap=None)
    assert budget.remaining() is None
    assert budget.fits(D("1000000"))
    assert budget.charge(D("0"), D("0")) == D("0")
    assert budget.spent == D("0")


def test_billed_refuses_unknown_access_and_negative_costs() -> None:
    with pytest.raises(ValueError):
        billed(D("1"), "nodus")
    with pytest.raises(ValueError):
        billed(D("-0.000001"), "Nodus")


def test_worst_case_prices_every_input_token_at_the_dearest_input_rate() -> None:
    table = DEFAULT_PRICE_TABLE
    # sonnet: cache write (3.75) is dearer than input (3): 1000 * 3.75 + 100 * 15 = 5250 -> 0.00525
    assert worst_case_cost(table, "claude-sonnet-5-5", 1000, 100) == D("0.005250")
    assert worst_case_cost(table, ROUTER_MODEL, 3, ROUTER_MAX_OUTPUT_TOKENS) == D("0.000001")
    assert worst_case_cost(table, "claude-haiku-5-5", 0, 0) == D("0")


def test_max_input_tokens_bounds_bytes_and_adds_overheads() -> None:
    empty = max_input_tokens("", [], [])
    assert empty >= PER_REQUEST_OVERHEAD_TOKENS
    text = "héllo 中文 😀" * 50
    bound = max_input_tokens("", [{"role": "user", "content": text}], [])
    assert bound >= len(text.encode("utf-8")) + PER_REQUEST_OVERHEAD_TOKENS
    # A character that NFKC expands (U+FDFA becomes 18 characters) is counted at its expanded size.
    expanding = "\ufdfa" * 100
    assert max_input_tokens("", [{"role": "user", "content": expanding}], []) > 100 * 33
    assert max_input_tokens("s", [], [BASH_TOOL]) > len(json.dumps(BASH_TOOL)) + PER_REQUEST_OVERHEAD_TOKENS


def test_budget_admits_only_what_fits_and_clamps_overreports() -> None:
    budget = RunBudget(cap=D("0.010000"))
    assert budget.remaining() == D("0.01")
    assert budget.fits(D("0.01"))
    assert not budget.fits(D("0.010001"))
    assert budget.charge(D("0.004"), reserved=D("0.006")) == D("0.004")
    assert budget.spent == D("0.004")
    # A provider reporting more than the bound: charged only the reservation.
    assert budget.charge(D("0.009"), reserved=D("0.005")) == D("0.005")
    assert budget.spent == D("0.009")
    # A caller that skipped the check still cannot push spend over the cap.
    assert budget.charge(D("0.5"), reserved=D("0.5")) == D("0.001")
    assert budget.spent == budget.cap
    with pytest.raises(CapExceeded) as caught:
        budget.require(D("0.000001"))
    assert caught.value.reason == "MaxCostReached"
    assert pickle.loads(pickle.dumps(caught.value)).needed == D("0.000001")
    with pytest.raises(ValueError):
        RunBudget(cap=D("-1"))
    with pytest.raises(ValueError):
        RunBudget(cap=D("1"), spent=D("2"))


# --------------------------------------------------------------------------------------------
# Property tests

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any unicode (no lone surrogates: they are not text), with multi-byte, escaped and NFKC-expanding
# characters mixed in on purpose.
_chars = st.one_of(
    st.characters(exclude_categories=["Cs"]),
    st.sampled_from(list('é中😀\ufdfa\u0301"\\\n\t\x00')),
)
texts = st.text(_chars, max_size=120)


@st.composite
def tool_use_blocks(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_{draw(st.integers(0, 10**6))}",
        "name": "bash",
        "input": {"command": draw(texts)},
    }


@st.composite
def tool_result_blocks(draw: st.DrawFn) -> dict[str, Any]:
    content: Any = draw(
        st.one_of(texts, st.lists(texts.map(lambda t: {"type": "text", "text": t}), max_size=3))
    )
    return {"type": "tool_result", "tool_use_id": f"toolu_{draw(st.integers(0, 10**6))}", "content": content}


text_blocks = texts.map(lambda t: {"type": "text", "text": t})


@st.composite
def conversations(draw: st.DrawFn, max_messages: int = 6) -> list[dict[str, Any]]:
    """User and assistant messages in turn: prompts, tool calls and their results."""
    messages: list[dict[str, Any]] = []
    for index in range(draw(st.integers(1, max_messages))):
        if index % 2 == 0:
            content: Any = draw(
                st.one_of(
                    texts,
                    st.lists(text_blocks, min_size=1, max_size=3),
                    st.lists(tool_result_blocks(), min_size=1, max_size=3),
                )
            )
            messages.append({"role": "user", "content": content})
        else:
            blocks = draw(st.lists(st.one_of(text_blocks, tool_use_blocks()), min_size=1, max_size=3))
            messages.append({"role": "assistant", "content": blocks})
    return messages


tool_lists: st.SearchStrategy[list[dict[str, Any]]] = st.one_of(
    st.just([BASH_TOOL]),
    st.just([]),
    st.lists(
        st.builds(
            lambda name, description: {
                "name": name,
                "description": description,
                "input_schema": {
                    "type": "object",
                    "properties": {"x": {"type": "string", "description": description}},
                },
            },
            st.text(st.characters(categories=["Ll"]), min_size=1, max_size=10),
            texts,
        ),
        max_size=3,
    ),
)

_rates = st.decimals(min_value=0, max_value=50, places=4, allow_nan=False, allow_infinity=False)
model_prices = st.builds(ModelPrice, _rates, _rates, _rates, _rates)
MODELS = ["m-haiku", "m-sonnet", "m-opus", "m-fable"]


@st.composite
def price_tables(draw: st.DrawFn) -> PriceTable:
    prices = {model: draw(model_prices) for model in MODELS}
    prices[ROUTER_MODEL] = draw(model_prices)
    return PriceTable(
        effective=date(2026, 11, 1),
        prices=prices,
        family_models=dict(zip(("haiku", "sonnet", "opus", "fable"), MODELS, strict=True)),
    )


@PROPERTY
@given(
    prices=price_tables(),
    cap=st.decimals(min_value=0, max_value=1, places=6, allow_nan=False, allow_infinity=False),
    calls=st.lists(
        st.tuples(st.integers(0, 10**7), st.integers(0, 10**5), st.integers(0, 10**8), st.integers(0, 10**5)),
        max_size=20,
    ),
)
def test_overreporting_provider_still_cannot_pass_the_cap(
    prices: PriceTable, cap: Decimal, calls: list[tuple[int, int, int, int]]
) -> None:
    """Reported usage is unbounded here (a buggy provider or a wrong bound): spend stays capped."""
    budget = RunBudget(cap=cap)
    for reserved_input, reserved_output, reported_input, reported_output in calls:
        reserved = billed(worst_case_cost(prices, "m-sonnet", reserved_input, reserved_output), "Nodus")
        if not budget.fits(reserved):
            continue
        actual = billed(
            prices.cost("m-sonnet", Usage(input_tokens=reported_input, output_tokens=reported_output)),
            "Nodus",
        )
        charged = budget.charge(actual, reserved)
        assert charged == min(actual, reserved)
        assert budget.spent <= cap


@PROPERTY
@given(
    prices=price_tables(),
    model=st.sampled_from(MODELS),
    input_tokens=st.integers(0, 10**6),
    max_output=st.integers(0, 10**5),
)
def test_the_worst_case_is_attainable(
    prices: PriceTable, model: str, input_tokens: int, max_output: int
) -> None:
    """The reservation is the cost of a real usage within the bound, so a stop is never for a call that
    could not have cost that much."""
    price = prices.price(model)
    dearest = max(
        (price.input, "input_tokens"),
        (price.cache_write, "cache_creation_input_tokens"),
        (price.cache_read, "cache_read_input_tokens"),
    )[1]
    usage = Usage(**{dearest: input_tokens, "output_tokens": max_output})
    assert prices.cost(model, usage) == worst_case_cost(prices, model, input_tokens, max_output)


@PROPERTY
@given(raw=st.decimals(min_value=0, max_value=1000, places=9, allow_nan=False, allow_infinity=False))
def test_billed_is_the_least_microdollar_at_or_above_cost_over_margin(raw: Decimal) -> None:
    amount = billed(raw, "Nodus")
    assert amount == amount.quantize(D("0.000001"))
    assert amount * NODUS_MARGIN >= raw
    assert (amount - D("0.000001")) * NODUS_MARGIN < raw
    assert billed(raw, "BYOK") == 0


@PROPERTY
@given(
    prices=price_tables(),
    model=st.sampled_from(MODELS),
    counts=st.tuples(*(st.integers(0, 10**7) for _ in range(4))),
    extra=st.tuples(*(st.integers(0, 10**5) for _ in range(4))),
)
def test_cost_is_exact_rounded_up_and_monotone(
    prices: PriceTable, model: str, counts: tuple[int, int, int, int], extra: tuple[int, int, int, int]
) -> None:
    price = prices.price(model)
    usage = Usage(*counts)
    exact = (
        counts[0] * price.input
        + counts[1] * price.output
        + counts[2] * price.cache_write
        + counts[3] * price.cache_read
    ) / MILLION
    cost = prices.cost(model, usage)
    assert cost >= exact > cost - D("0.000001")
    bigger = Usage(*(a + b for a, b in zip(counts, extra, strict=True)))
    assert prices.cost(model, bigger) >= cost


@PROPERTY
@given(
    system=texts,
    messages=conversations(),
    tools=tool_lists,
    max_tokens=st.integers(1, 4096),
    family=st.sampled_from(sorted(OFFLINE_MODELS)),
)
def test_offline_usage_never_exceeds_the_bound(
    system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int, family: str
) -> None:
    """The offline model reports ceil(chars / 4) of the same text the bound counts bytes of."""
    model = OFFLINE_MODELS[family]
    request = ModelRequest(model=model, system=system, messages=messages, max_tokens=max_tokens, tools=tools)
    response = OfflineProvider().complete(request)
    bound = max_input_tokens(system, messages, tools)
    usage = response.usage
    assert usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens <= bound
    assert usage.output_tokens <= max_tokens
    reserved = billed(worst_case_cost(DEFAULT_PRICE_TABLE, model, bound, max_tokens), "Nodus")
    charged = billed(DEFAULT_PRICE_TABLE.cost(model, usage), "Nodus")
    assert D(0) < charged <= reserved  # priced (never free) and inside its reservation


# --------------------------------------------------------------------------------------------
# The cap through the real run loop
#
# `Conversation` and `RunSpend` exactly as a run actor runs them, over a real `Steps` and
# `Journal` on a temporary local `Storage` (`Rig`, the conversation tests' rig). Only the model,
# the router and the sandbox are scripted, and their scripts are drawn before the run starts,
# so nothing is drawn from the worker threads the model is called in. A change to the run loop
# (where it checks, what it charges, what it journals) is what this checks.


_MICRO = D("0.000001")


def _ceil_micro(amount: Decimal) -> Decimal:
    return amount.quantize(_MICRO, rounding=ROUND_CEILING)


def _priced(price: ModelPrice, usage: Usage, access: str) -> Decimal:
    """A call's charge worked out from the documents: each kind of token at its rate per million,
    rounded up to a microdollar, divided by the 0.875 margin and rounded up again; BYOK is free."""
    if access == "BYOK":
        return D(0)
    raw = (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_creation_input_tokens * price.cache_write
        + usage.cache_read_input_tokens * price.cache_read
    ) / MILLION
    return _ceil_micro(_ceil_micro(raw) / D("0.875"))


class ScriptedSandbox:
    """A sandbox whose command ``emit N`` prints N bytes: large outputs grow the next call's bound."""

    backend = "scripted"
    note: str | None = None

    def __init__(self, workspace: Path):
        self.workspace = workspace

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        size = int(command.split()[1])
        return CommandResult(
            exit_code=0,
            output="a" * size,
            truncated=False,
            timed_out=False,
            cancelled=False,
            duration_seconds=0.0,
            limit=None,
        )

    def cancel(self) -> None:
        return None

    def delete(self) -> None:
        return None


class CapRig(Rig):
    def open_sandbox(self) -> Sandbox:
        sandbox = ScriptedSandbox(self.workspace)
        self.sandboxes.append(sandbox)
        return sandbox


@dataclass(frozen=True)
class Answer:
    """One scripted model answer. Its usage is drawn as shares (per mille) of what the call may
    use, its input bound (`max_input_tokens` of the request) and ``maxTokens``, so an honest answer
    can use all of it; ``overreport`` > 1 reports that many times more (a provider past the bound).
    """

    kind: str  # text, tool_use, pause_turn, max_tokens, refusal, error (ModelError), crash (the actor dies)
    outputs: tuple[int, ...] = ()  # tool_use: the bytes each command prints
    shares: tuple[int, int, int] = (0, 0, 0)  # of the input bound: plain, cache write, cache read
    output_share: int = 0  # of maxTokens
    overreport: int = 1


@dataclass(frozen=True)
class Served:
    """A call that reached the model: what it was sent and what it reported (None: no answer)."""

    request: ModelRequest
    usage: Usage | None
    honest: bool


_STOPS = {"text": "end_turn", "tool_use": "tool_use", "pause_turn": "pause_turn"}
_STOPS |= {"max_tokens": "max_tokens", "refusal": "refusal"}


class ScriptedModel:
    """A `ModelProvider` answering with its script, in order, shared by every actor of the run."""

    name = "scripted"

    def __init__(self, prices: PriceTable, script: list[Answer]):
        self.prices = prices
        self.script = list(script)
        self.served: list[Served] = []

    def model_for_family(self, family: str) -> str:
        return self.prices.family_models[family]

    def complete(self, request: ModelRequest) -> ModelResponse:
        answer = self.script.pop(0) if self.script else Answer("text", shares=(0, 0, 500), output_share=500)
        if answer.kind in ("crash", "error"):
            self.served.append(Served(request, None, True))
            if answer.kind == "crash":
                raise Crash("the actor died mid-call")
            raise ModelError("overloaded after retries", reason="ModelUnavailable")
        bound = max_input_tokens(request.system, request.messages, request.tools)
        plain, write, read = (bound * share // 1000 * answer.overreport for share in answer.shares)
        usage = Usage(
            input_tokens=plain,
            output_tokens=request.max_tokens * answer.output_share // 1000 * answer.overreport,
            cache_creation_input_tokens=write,
            cache_read_input_tokens=read,
        )
        self.served.append(Served(request, usage, answer.overreport == 1))
        call = len(self.served)
        content: list[dict[str, Any]] = [{"type": "text", "text": f"answer {call}"}]
        if answer.kind == "tool_use":
            content += [
                {
                    "type": "tool_use",
                    "id": f"toolu_{call}_{i}",
                    "name": "bash",
                    "input": {"command": f"emit {n}"},
                }
                for i, n in enumerate(answer.outputs)
            ]
        return ModelResponse(
            model=request.model, content=content, stop_reason=_STOPS[answer.kind], usage=usage
        )


class NoModel:
    """The model of a replay over a settled journal: it must not be called."""

    name = "scripted"

    def __init__(self, prices: PriceTable):
        self.prices = prices

    def model_for_family(self, family: str) -> str:
        return self.prices.family_models[family]

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("a replay called the model")


@dataclass
class ScriptedRouter:
    """The router: per turn, the allowed family it picks (None: it is unreachable) and the share
    (per mille, times ``overreport``) of its input bound it reports using."""

    picks: list[int | None]
    shares: list[int]
    overreport: int = 1
    calls: list[str] = field(default_factory=list)

    async def __call__(self, prompt: str, allowed: list[str]) -> dict[str, Any]:
        turn = len(self.calls)
        self.calls.append(prompt)
        pick = self.picks[turn % len(self.picks)]
        if pick is None:
            raise ConnectionError("the router actor is gone")
        share = self.shares[turn % len(self.shares)]
        tokens = router_input_tokens(prompt) * share // 1000 * self.overreport
        return {"family": allowed[pick % len(allowed)], "inputTokens": tokens}


async def _no_progress(turns: list[TurnRecord]) -> None:
    return None


async def _no_router(prompt: str, allowed: list[str]) -> dict[str, Any]:
    raise AssertionError("a replay asked the router again")


@dataclass
class Holds:
    """The project's credits: each reservation is granted and kept, except the ones numbered in
    ``short`` (counting every request), refused once as if the credits had run out until a grant."""

    short: frozenset[int] = frozenset()
    held: list[Decimal] = field(default_factory=list)
    asked: int = 0

    async def reserve(self, amount: Decimal) -> None:
        self.asked += 1
        if self.asked in self.short:
            raise CreditsExhausted(amount)
        self.held.append(amount)


@dataclass(frozen=True)
class Plan:
    """One run: the agent's spec, its access and cap, the prices, and its later messages."""

    prices: PriceTable
    access: str
    cap: Decimal | None
    system: str
    families: list[str] | None
    model_name: str | None
    max_tokens: int
    max_tool_calls: int
    prompts: list[str]  # the first is the run's input; the rest arrive as messages (keep-alive)
    keep_alive: bool

    def allowed(self) -> list[str]:
        return [family for family in FAMILIES if family in (self.families or FAMILIES)]

    def model_for(self, family: str) -> str:
        return self.model_name or self.prices.family_models[family]

    def calls_router(self) -> bool:
        return len(self.allowed()) > 1 and self.model_name is None

    def worst(self, model: str, input_tokens: int, max_output: int) -> Decimal:
        return billed(worst_case_cost(self.prices, model, input_tokens, max_output), self.access)

    def turn_check(self, prompt: str, messages: list[dict[str, Any]]) -> Decimal:
        """What a turn's start must fit: the router call and the dearest allowed model's first call."""
        tokens = max_input_tokens(self.system, messages, [BASH_TOOL])
        first = max(self.worst(self.model_for(f), tokens, self.max_tokens) for f in self.allowed())
        if not self.calls_router():
            return first
        return self.worst(ROUTER_MODEL, router_input_tokens(prompt), ROUTER_MAX_OUTPUT_TOKENS) + first

    async def inbox(self, after: int) -> dict[str, Any] | None:
        if after + 1 >= len(self.prompts):
            return None
        return {
            "seq": after + 1,
            "name": f"m{after + 1}",
            "payload": self.prompts[after + 1],
            "messageKey": None,
        }


# Mostly commands and answers; now and then a paused turn, a cut answer or a dead actor; rarely a
# refusal or a model error (runs that fail).
_KINDS = ["tool_use"] * 18 + ["text"] * 9 + ["pause_turn", "max_tokens", "crash"] * 3 + ["refusal", "error"]


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    kind = draw(st.sampled_from(_KINDS))
    cuts = sorted(draw(st.lists(st.integers(0, 1000), min_size=3, max_size=3)))
    outputs = draw(st.lists(st.one_of(st.integers(0, 200), st.integers(0, 40_000)), max_size=3))
    return Answer(
        kind=kind,
        outputs=tuple(outputs),
        shares=(cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1]),
        output_share=draw(st.integers(0, 1000)),
        overreport=draw(st.sampled_from([1] * 12 + [2, 40])),
    )


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    access = draw(st.sampled_from(["Nodus", "Nodus", "Nodus", "BYOK"]), label="access")
    plan = Plan(
        prices=draw(price_tables(), label="prices"),
        access=access,
        cap=None,
        system=draw(texts, label="system"),
        families=draw(
            st.one_of(
                st.none(), st.lists(st.sampled_from(list(FAMILIES)), min_size=1, max_size=4, unique=True)
            ),
            label="families",
        ),
        model_name=draw(st.one_of(st.none(), st.none(), st.none(), st.sampled_from(MODELS)), label="pinned"),
        max_tokens=draw(st.one_of(st.integers(1, 8192), st.integers(1, 64)), label="maxTokens"),
        max_tool_calls=draw(st.integers(1, 6), label="maxToolCalls"),
        prompts=draw(st.lists(texts, min_size=1, max_size=3), label="prompts"),
        keep_alive=draw(st.booleans(), label="keepAlive"),
    )
    if access == "BYOK":
        return plan
    # Caps in units of the first turn's check, so runs stop at every point (before the first call,
    # mid-turn, at a later turn, or never), plus any small cap and a few that are never reached.
    first = plan.turn_check(plan.prompts[0], [{"role": "user", "content": plan.prompts[0]}])
    whole = draw(st.sampled_from([0, 1, 1, 2, 2, 3, 4, 6, 9, 12]), label="cap in first checks")
    scaled = (first * (whole + D(draw(st.integers(0, 999), label="and thousandths")) / 1000)).quantize(_MICRO)
    cap = draw(
        st.one_of(
            st.just(scaled),
            st.decimals(min_value=0, max_value=D("0.01"), places=6),
            st.decimals(min_value=0, max_value=D("100"), places=6),
        )
        if draw(st.integers(0, 3), label="cap kind") == 0
        else st.just(scaled),
        label="cap",
    )
    return replace(plan, cap=cap)


def _conversation(
    rig: Rig, plan: Plan, provider: ModelProvider, router: Router, credits: Holds
) -> Conversation:
    """A new actor's conversation over the run's journal, built as the run actor builds it."""
    return Conversation(
        steps=Steps(rig.journal()),
        provider=provider,
        spec=ConversationSpec(
            system=plan.system,
            families=plan.families,
            model_name=plan.model_name,
            max_tokens=plan.max_tokens,
            max_tool_calls=plan.max_tool_calls,
            prompt=plan.prompts[0],
            keep_alive=plan.keep_alive,
        ),
        spend=RunSpend(
            prices=plan.prices,
            access=plan.access,
            budget=RunBudget(cap=plan.cap),
            reserve_credits=credits.reserve,
        ),
        router=router,
        open_sandbox=rig.open_sandbox,
        on_progress=_no_progress,
        next_message=plan.inbox,
    )


# The journal's local storage in memory where the machine has it: the same code (fsync'd writes
# and renames), without a hundred runs' worth of disk flushes.
_MEMORY = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

_SETTLED = (CapExceeded, AwaitingMessage, NeedsResolution, RunFailure)


def _settle(conversation: Conversation) -> Exception | None:
    """Run the conversation to where the actor would stop; what stopped it (None: it answered)."""
    try:
        asyncio.run(conversation.run())
    except _SETTLED as stopped:
        return stopped
    return None


def _cap_stop_needed(plan: Plan, records: list[JournalRecord]) -> tuple[Decimal, str]:
    """What the next call needed at its largest, recomputed from the journal where the run stopped:
    the turn's check when the stop came before its routing, else the routed model's next call."""
    by_step = {record.step_id: record for record in records}
    messages = [message_content(record.payload, by_step) for record in records if record.kind == "message"]
    prompts = [m for m in messages if m["role"] == "user" and isinstance(m["content"], str)]
    routes = {r.step_id: r for r in records if r.kind == "route" and r.state == "Completed"}
    route = routes.get(f"turn-{len(prompts)}/route")
    if route is None:
        return plan.turn_check(prompts[-1]["content"], messages), f"at the start of turn {len(prompts)}"
    tokens = max_input_tokens(plan.system, messages, [BASH_TOOL])
    return plan.worst(route.payload["result"]["model"], tokens, plan.max_tokens), "mid-turn"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(), script=st.lists(answers(), min_size=1, max_size=8), data=st.data())
def test_a_run_never_spends_past_its_cap(plan: Plan, script: list[Answer], data: st.DataObject) -> None:
    """Random agents, caps, prices, answers and usage through the real run loop: the journal's
    total never passes the cap, each charge is the price of its usage, and a run stopped at its cap
    stops with MaxCostReached, for a next call that really did not fit and was never made."""
    routing = ScriptedRouter(
        picks=data.draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=3)),
        shares=data.draw(st.lists(st.integers(0, 1000), min_size=1, max_size=3)),
        overreport=data.draw(st.sampled_from([1, 1, 1, 3])),
    )
    model = ScriptedModel(plan.prices, script)
    credits = Holds(
        short=frozenset(data.draw(st.lists(st.integers(1, 6), max_size=2), label="credits short"))
    )
    with tempfile.TemporaryDirectory(dir=_MEMORY) as root:
        rig = CapRig(Path(root))
        # The run's actors: one that dies mid-call, or waits for credits and gives its actor back,
        # is followed by one that replays the journal.
        for _actor in range(len(script) + len(credits.short) + 2):
            conversation = _conversation(rig, plan, model, routing, credits)
            try:
                stopped = _settle(conversation)
                break
            except (Crash, CreditsExhausted) as gone:
                event(f"an actor stopped: {type(gone).__name__}")
        else:
            raise AssertionError("the run never settled")
        records = rig.records()

        # A new actor over the settled journal makes no call, writes nothing and ends the same.
        replayed = _conversation(rig, plan, NoModel(plan.prices), _no_router, Holds())
        again = _settle(replayed)
        assert type(again) is type(stopped) and str(again) == str(stopped)
        assert replayed.cost_usd == conversation.cost_usd
        assert len(rig.records()) == len(records)

    event(f"{plan.access}: {type(stopped).__name__ if stopped else 'answered'}")
    event(f"{len(model.served)} model calls")
    total = sum((D(record.cost_usd) for record in records), D(0))
    assert total == conversation.cost_usd
    if plan.cap is None:
        assert total == 0 and credits.held == []
    else:
        assert total <= plan.cap
        assert sum(credits.held, D(0)) >= total  # every charge was held from credits first

    # Every call that reached the model has its Started record, checked at the call's largest.
    starts = [r for r in records if r.kind == "model" and r.state == "Started"]
    assert len(starts) == len(model.served)
    served = {(r.step_id, r.attempt): (r, call) for r, call in zip(starts, model.served, strict=True)}
    for start, call in served.values():
        tokens = max_input_tokens(call.request.system, call.request.messages, call.request.tools)
        assert D(start.payload["boundUSD"]) == plan.worst(call.request.model, tokens, plan.max_tokens)
    # Every charge is the price of the usage reported (within the bound checked for it).
    prompts = {f"turn-{i}/route": prompt for i, prompt in enumerate(plan.prompts, start=1)}
    for record in records:
        charged = D(record.cost_usd)
        if record.state != "Completed" or record.kind not in ("model", "route"):
            assert charged == 0, record
            continue
        result = record.payload["result"]
        assert charged == D(result["billedUSD"])
        if record.kind == "route":
            usage = Usage(input_tokens=result["routerInputTokens"])
            expected = _priced(plan.prices.price(ROUTER_MODEL), usage, plan.access)
            checked = plan.worst(
                ROUTER_MODEL, router_input_tokens(prompts[record.step_id]), ROUTER_MAX_OUTPUT_TOKENS
            )
            assert charged == (min(expected, checked) if result["routing"] == "jev" else 0)
            assert routing.overreport > 1 or charged == expected
            continue
        start, call = served[(record.step_id, record.attempt)]
        assert call.usage is not None and Usage.from_dict(result["usage"]) == call.usage
        expected = _priced(plan.prices.price(result["model"]), call.usage, plan.access)
        checked = D(start.payload["boundUSD"])
        if call.honest:
            assert charged == expected <= checked  # the bound held: an honest call is charged exactly
        else:
            assert charged == min(expected, checked)  # past the bound: charged what was checked

    if isinstance(stopped, CapExceeded):
        # The documents: the run waits with MaxCostReached and makes no more calls.
        assert plan.access == "Nodus" and plan.cap is not None
        assert stopped.reason == RunReason.MAX_COST_REACHED and RunReason.MAX_COST_REACHED in PARKED_REASONS
        assert (stopped.cap, stopped.remaining) == (plan.cap, plan.cap - total)
        assert stopped.needed > stopped.remaining  # the next call, at its largest, really did not fit
        needed, where = _cap_stop_needed(plan, records)
        assert stopped.needed == needed
        event(f"stopped at the cap {where}")
