"""Shared rate limits without Ray: the operator's table, the adaptive buckets, a limited call
(its waits, 429/529 back-off and settlement), the provider's deferred refusals against the fake
Messages API enforcing a limit, and what a group and the lifecycle make of a rate-limited run."""

from __future__ import annotations

import asyncio
import hashlib
import os
from decimal import Decimal as D
from typing import Any

import pytest

from nodus.lifecycle import (
    PARKED_REASONS,
    BlockedReason,
    RunPhase,
    RunReason,
    check_run_transition,
    is_parked,
)
from nodus_ray.control.run_reports import RunReport
from nodus_ray.core.admission import Admission, GroupLimits, Member
from nodus_ray.core.rate_buckets import AdaptiveBuckets
from nodus_ray.core.rate_limits import RateLimit, RateLimitTable, key_fingerprint
from nodus_ray.models.anthropic_provider import AnthropicProvider
from nodus_ray.models.base import ModelError, ModelRequest, ModelResponse, Usage
from nodus_ray.runtime.rate_limited import RateLimitedProvider, call_model, limit_calls
from nodus_ray.settings import ServerSettings
from tests.fakes.anthropic_api import FakeMessagesAPI, text_reply
from tests.fakes.rate_limits import FakeRateLimit

KEY = "sk-ant-test-rate-limits-0123456789"
FP = key_fingerprint(KEY)

# -- the operator's table ----------------------------------------------------------------------


def test_the_fingerprint_is_what_sha256sum_prints_and_never_the_key() -> None:
    assert FP == hashlib.sha256(KEY.encode()).hexdigest()[:16]
    assert key_fingerprint(KEY + "\n") == FP  # a key read from a file
    assert KEY not in FP


def test_the_compact_form_and_the_most_specific_entry_wins() -> None:
    table = RateLimitTable.parse(f"default/*=rpm:50; sonnet=rpm:40,otpm:8000\n{FP}/sonnet=itpm:30000,rpm:5")
    assert table.for_call(FP, "sonnet") == RateLimit(rpm=5, itpm=30000)
    assert table.for_call(FP, "haiku") == RateLimit(rpm=50)
    assert table.for_call("0" * 16, "sonnet") == RateLimit(rpm=40, otpm=8000)
    assert RateLimitTable.parse(table.to_text()) == table  # how it travels to run actors
    assert RateLimitTable.parse(f"{FP}/haiku=rpm:1").for_call("0" * 16, "haiku") is None
    assert RateLimitTable.parse("").empty and RateLimitTable.parse(None).empty


def test_the_json_form_is_the_same_table() -> None:
    table = RateLimitTable.parse(
        f'{{"default": {{"*": {{"rpm": 60}}}}, "{FP}": {{"opus": {{"otpm": 100}}}}}}'
    )
    assert table.for_call(FP, "opus") == RateLimit(otpm=100)
    assert table.for_call(FP, "haiku") == RateLimit(rpm=60)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("sonnet=rpm:0", "default/sonnet: rpm must be a positive number per minute, not '0'"),
        ("sonnet=rpm:-5", "rpm must be a positive number"),
        ("default/*=itpm:lots", "default/*: itpm must be a positive number per minute, not 'lots'"),
        ("sonnet=otpm:nan", "otpm must be a positive number"),
        ("sonnet=otpm", "otpm must be a positive number"),
        ('{"default": {"*": {"rpm": 0}}}', "default/*: rpm must be a positive number"),
        ('{"default": {"*": {"rpm": true}}}', "rpm must be a positive number"),
        ("sonnet=burst:5", "unknown field 'burst'"),
        (f"{KEY}/sonnet=rpm:5", "neither 'default' nor a key fingerprint"),
        ("sonnet=rpm:5;sonnet=rpm:6", "default/sonnet is given twice"),
        ("rpm:5", "must be KEY/FAMILY="),
        ("{not json", "not valid JSON"),
    ],
)
def test_a_limit_that_is_not_a_positive_number_is_refused_naming_the_variable(text: str, words: str) -> None:
    with pytest.raises(ValueError) as refused:
        RateLimitTable.parse(text)
    assert str(refused.value).startswith("NODUS_RATE_LIMITS: ")
    assert words in str(refused.value)
    assert KEY not in str(refused.value)  # a key pasted by mistake is not echoed back


def test_nodus_up_refuses_a_bad_limit_once_at_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODUS_RATE_LIMITS", "haiku=rpm:0")
    with pytest.raises(ValueError, match=r"NODUS_RATE_LIMITS: default/haiku: rpm must be a positive"):
        ServerSettings.from_env()
    monkeypatch.setenv("NODUS_RATE_LIMITS", "haiku = rpm:60 , otpm:4000")
    assert ServerSettings.from_env().rate_limits == "default/haiku=rpm:60,otpm:4000"
    monkeypatch.delenv("NODUS_RATE_LIMITS")
    assert ServerSettings.from_env().rate_limits == ""


# -- the buckets -------------------------------------------------------------------------------


def test_calls_are_scheduled_at_the_budget_rate_first_come_first_served() -> None:
    buckets = AdaptiveBuckets(RateLimit(rpm=120), now=0.0)
    delays = [buckets.reserve(0.0, 10, 10) for _ in range(9)]
    assert delays[0] == 0 and delays[1] == 0  # a burst of one second's budget
    assert delays[2:] == pytest.approx([0.5 * n for n in range(1, 8)])  # then one every 0.5 s
    assert buckets.stats.granted == 9 and buckets.stats.delayed == 7


def test_the_long_run_rate_of_any_budget_is_its_limit() -> None:
    buckets = AdaptiveBuckets(RateLimit(rpm=600, itpm=6000, otpm=60000), now=0.0)
    # each call: 200 uncached input tokens estimated, 100 used; 50 output reserved, 50 used
    last = 0.0
    for _ in range(300):
        last = buckets.reserve(0.0, 200, 50)
        buckets.settle(200, 50, 100, 50)
    # 300 calls of 100 input tokens at 6000 a minute take 5 minutes, less the first second's burst
    assert 290 <= last <= 300


def test_a_429_empties_the_buckets_honours_retry_after_and_the_rate_recovers() -> None:
    buckets = AdaptiveBuckets(RateLimit(rpm=60), now=0.0)
    assert buckets.reserve(0.0, 1, 1) == 0
    assert buckets.refused(0.5, 429, 7.0) == pytest.approx(7.0)
    assert buckets.factor(0.5) == pytest.approx(0.9)
    assert buckets.reserve(0.5, 1, 1) >= 7.0  # nothing before the retry-after
    assert buckets.stats.throttled == 1
    assert buckets.factor(0.5 + 8) == pytest.approx(1.0)  # 90% -> 100% in 8 s without a 429
    assert buckets.refused(30.0, 429, 1.0) == pytest.approx(1.0)
    assert buckets.refused(30.5, 429, 1.0) == pytest.approx(1.0)  # a call already on its way
    assert buckets.factor(30.5) == pytest.approx(0.9 + 0.5 * 0.0125)  # one back-off, one drop
    for n in range(40):  # refusals one after another never stop it entirely
        buckets.refused(40.0 + 2 * n, 429, None)
    assert 0.25 <= buckets.factor(120.0) < 0.4


def test_a_529_backs_off_exponentially_until_a_call_succeeds() -> None:
    buckets = AdaptiveBuckets(RateLimit(otpm=1000), now=0.0)
    assert [buckets.refused(0.0, 529, None) for _ in range(3)] == [1.0, 2.0, 4.0]
    buckets.settle(0, 0, 0, 0)
    assert buckets.refused(100.0, 529, None) == 1.0
    assert buckets.refused(200.0, 529, 3.0) == 3.0  # its retry-after when it sends one
    assert buckets.stats.overloaded == 5


def test_a_changed_limit_is_taken_at_the_next_call() -> None:
    buckets = AdaptiveBuckets(RateLimit(rpm=60), now=0.0)
    buckets.reserve(0.0, 1, 1)
    buckets.configure(RateLimit(rpm=6000), 0.0)
    assert buckets.reserve(0.0, 1, 1) == 0


# -- a limited call ----------------------------------------------------------------------------


class _Limiter:
    """The limiter actor's logic in this process (the actor is `AdaptiveBuckets` behind Ray)."""

    def __init__(self, fingerprint: str, family: str, limit: RateLimit):
        self.limit = limit
        self.buckets = AdaptiveBuckets(limit, now=0.0)
        self.now = 0.0
        self.settled: list[tuple[int, int, int, int]] = []

    async def reserve(self, input_tokens: int, output_tokens: int) -> float:
        return self.buckets.reserve(self.now, input_tokens, output_tokens)

    async def settle(self, *amounts: int) -> None:
        self.settled.append(amounts)  # type: ignore[arg-type]
        self.buckets.settle(*amounts)

    async def refused(self, status: int, retry_after: float | None) -> float:
        return self.buckets.refused(self.now, status, retry_after)


class _Provider:
    name = "anthropic"
    family_models = {"haiku": "claude-haiku-5-5", "sonnet": "claude-sonnet-5-5"}

    def __init__(self, refusals: list[ModelError]):
        self.refusals = refusals
        self.calls = 0

    def model_for_family(self, family: str) -> str:
        return self.family_models[family]

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.refusals:
            raise self.refusals.pop(0)
        usage = Usage(input_tokens=30, output_tokens=7, cache_read_input_tokens=500)
        return ModelResponse(model=request.model, content=[], stop_reason="end_turn", usage=usage)


def _limited(
    inner: _Provider, text: str
) -> tuple[RateLimitedProvider, list[str | None], dict[str, _Limiter]]:
    waits: list[str | None] = []
    limiters: dict[str, _Limiter] = {}

    async def on_wait(waiting: str | None) -> None:
        waits.append(waiting)

    def limiter(fingerprint: str, family: str, limit: RateLimit) -> _Limiter:
        limiters[family] = _Limiter(fingerprint, family, limit)
        return limiters[family]

    return RateLimitedProvider(inner, FP, RateLimitTable.parse(text), on_wait, limiter), waits, limiters


def _call(model: str = "claude-haiku-5-5") -> ModelRequest:
    return ModelRequest(
        model=model, system="s", messages=[{"role": "user", "content": "x" * 400}], max_tokens=64
    )


def test_a_refused_call_queues_again_through_the_limiter_and_a_long_wait_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    inner = _Provider(
        [ModelError("429", reason="ModelUnavailable", retryable=True, status=429, retry_after=4.0)]
    )
    provider, waits, limiters = _limited(inner, "haiku=rpm:60")
    monkeypatch.setattr("nodus_ray.runtime.rate_limited.asyncio.sleep", sleep)
    response = asyncio.run(call_model(provider, _call()))
    assert inner.calls == 2 and response.attempts == 2  # the refused request counts as an attempt
    assert slept == [pytest.approx(4.0)]  # the retry-after, once: no polling
    assert waits[0] is not None and "rate limit of haiku on key " + FP in waits[0] and waits[1] is None
    assert KEY not in waits[0]
    limiter = limiters["haiku"]
    assert limiter.buckets.stats.throttled == 1
    # what it reserved (the prompt's estimate, max_tokens) and what it used (cache reads are free)
    (settled,) = limiter.settled
    assert settled[1:] == (64, 30, 7)


def test_a_family_without_a_limit_and_an_error_that_is_not_a_refusal_go_straight_through() -> None:
    inner = _Provider([ModelError("bad", reason="ModelRequestInvalid", status=400)])
    provider, waits, limiters = _limited(inner, "haiku=rpm:60")
    with pytest.raises(ModelError, match="bad"):
        asyncio.run(call_model(provider, _call()))
    assert inner.calls == 1 and limiters["haiku"].settled == [(limiters["haiku"].settled[0][0], 64, 0, 0)]
    asyncio.run(call_model(provider, _call("claude-sonnet-5-5")))
    assert "sonnet" not in limiters and waits == []
    # on a limited key the SDK leaves 429 to us: a family without a limit retries it itself
    inner.refusals = [ModelError("429", reason="ModelUnavailable", status=429, retry_after=0.01)]
    assert asyncio.run(call_model(provider, _call("claude-sonnet-5-5"))).attempts == 2


def test_only_anthropic_runs_under_a_configured_limit_are_wrapped() -> None:
    async def report(_: RunReport) -> None:
        return None

    inner = _Provider([])
    access = {"provider": "anthropic", "apiKey": KEY}
    assert limit_calls(inner, access, "", report) is inner  # type: ignore[arg-type]
    assert limit_calls(inner, {"provider": "offline", "apiKey": None}, "rpm=rpm:1", report) is inner  # type: ignore[arg-type]
    assert limit_calls(inner, access, "0123456789abcdef/*=rpm:60", report) is inner  # type: ignore[arg-type]
    limited = limit_calls(inner, access, "default/*=rpm:60", report)  # type: ignore[arg-type]
    assert isinstance(limited, RateLimitedProvider) and limited.fingerprint == FP and KEY not in repr(limited)


# -- the provider against a fake API that enforces a limit --------------------------------------


@pytest.fixture
def api() -> Any:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        os.environ.pop(name, None)
    with FakeMessagesAPI() as fake:
        yield fake


def test_the_fake_api_refuses_over_its_limit_with_retry_after_and_counts_nothing(
    api: FakeMessagesAPI,
) -> None:
    api.rate_limit(FakeRateLimit(rpm=60, window_seconds=2))
    api.set_responder(lambda body: text_reply("ok"))
    provider = AnthropicProvider(api_key=KEY, base_url=api.base_url, timeout_seconds=10, defer_refusals=True)
    provider.complete(_call())
    provider.complete(_call())
    with pytest.raises(ModelError) as refused:
        provider.complete(_call())
    error = refused.value
    assert (error.status, error.reason, error.retryable) == (429, "ModelUnavailable", True)
    assert error.retry_after is not None and error.retry_after >= 1
    assert len(api.message_requests()) == 3 and api.throttled == 1  # the SDK did not retry it
    assert len(api.admitted) == 2
    other = AnthropicProvider(api_key=KEY + "x", base_url=api.base_url, timeout_seconds=10)
    other.complete(_call())  # limits are per key


def test_a_529_is_the_limiters_too_and_without_deferring_the_sdk_retries_it(api: FakeMessagesAPI) -> None:
    api.overload(1, retry_after="0")
    deferring = AnthropicProvider(api_key=KEY, base_url=api.base_url, timeout_seconds=10, defer_refusals=True)
    with pytest.raises(ModelError) as refused:
        deferring.complete(_call())
    assert refused.value.status == 529 and api.overloaded == 1
    api.overload(1)
    api.script(text_reply("after one retry"))
    plain = AnthropicProvider(api_key=KEY, base_url=api.base_url, timeout_seconds=10)
    assert plain.complete(_call()).attempts == 2


def test_a_model_error_keeps_its_status_and_retry_after_across_processes() -> None:
    import pickle

    error = pickle.loads(
        pickle.dumps(ModelError("m", reason="ModelUnavailable", status=429, retry_after=2.5))
    )
    assert (error.status, error.retry_after, error.reason) == (429, 2.5, "ModelUnavailable")


# -- the lifecycle and the group ----------------------------------------------------------------


def test_a_rate_limited_run_waits_with_its_actor_and_goes_back_to_running() -> None:
    assert RunReason.RATE_LIMITED == "RateLimited" and RunReason.RATE_LIMITED not in PARKED_REASONS
    assert not is_parked(RunPhase.WAITING, RunReason.RATE_LIMITED)
    check_run_transition(RunPhase.RUNNING, RunPhase.WAITING)
    check_run_transition(RunPhase.WAITING, RunPhase.RUNNING)


def test_a_groups_blocked_reasons_count_its_rate_limited_members() -> None:
    adm = Admission(GroupLimits(max_active=3))
    adm.add([Member(key=f"t{i}", run=f"g-t{i}", cap=D("0.10")) for i in range(3)])
    for run in adm.decide().start:
        adm.started(run)
    adm.progressed("g-t0", state="Waiting", spent=D(0), reason="RateLimited")
    status = adm.progressed("g-t1", state="Waiting", spent=D(0), reason="RateLimited").status
    assert status.blocked_reasons[BlockedReason.RATE_LIMITED] == 2
    assert status.to_dict()["blockedReasons"]["RateLimited"] == 2
    assert status.counts["waiting"] == 2 and status.waiting_reasons == {"RateLimited": 2}
    adm.progressed("g-t0", state="Active", spent=D(0))
    status = adm.progressed("g-t1", state="Active", spent=D(0)).status
    assert "RateLimited" not in status.blocked_reasons  # present while members wait


def test_nodus_up_says_what_is_wrong_in_one_line_and_starts_nothing(tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    nodus = str(Path(sys.executable).parent / "nodus")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NODUS_", "RAY_"))},
        "HOME": str(tmp_path),
        "NODUS_RATE_LIMITS": "default/haiku=rpm:60,otpm:-3",
    }
    up = subprocess.run([nodus, "up", "--port", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode != 0
    assert up.stderr.strip() == (
        "error: Invalid: NODUS_RATE_LIMITS: default/haiku: otpm must be a positive number per minute, not '-3'"
    )
    assert not (tmp_path / ".nodus" / "cluster.json").exists()
