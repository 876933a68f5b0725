"""Cost accounting under random conversations: does the cap hold, and what does the bookkeeping cost?

N runs, each a journaled `Conversation` built directly (no Ray, no control plane) the way the
run actor builds one: `Steps(Journal(Storage(dir)))`, the real `AnthropicProvider` pointed at the
in-process `FakeMessagesAPI` (tests/fakes), `RunSpend` on Nodus access with a random
`perRunMaxCostUSD` and a no-op credit reservation, the jev router (`JevRouter().route`), and a
real sandbox from `create_sandbox` (bubblewrap when the host has it) running trivial commands.

The fake answers with seeded random conversations: each reply is either a `bash` tool call
(`echo N` or `seq N`) or a final text (`end_turn`, sometimes `max_tokens`), with a seeded chance
per run of ending the turn and at most 12 model calls. Usage is random but plausible: input
tokens (split into plain, cache write and cache read) are the request's compact JSON bytes
divided by 3 to 4.5 plus 150-400 tokens of framing, and output tokens follow the reply's
length, up to the request's ``max_tokens`` (all of it when the reply stops at ``max_tokens``).
Each run draws its own agent: a non-empty subset of families (haiku and sonnet
each allowed 3 times in 4, opus about 1 in 3, fable 1 in 5), ``maxTokens`` log-uniform in
64..4096, ``maxToolCalls`` in 4..50, and a cap in $0.001..$0.50 drawn log-uniform around the
worst case of the turn's first call (see `_agent`), so that about a third of the runs stop at the
cap: some before their first call (even its worst case does not fit), most after a few.

What is checked, per run: ``spend / cap`` (``conversation.cost_usd / cap``), which must never
pass 1 (the script exits 1 if it does); the spend re-derived from the journal as stored (a fresh
`Journal.load()` summing every record's ``cost_usd``), which must equal the conversation's; and
every model step's charge, which must be ``min(billed actual cost, the bound checked before the
call)`` recomputed from the usage in the journal. ``--overreport P`` makes a fraction P of the
replies report 20x their usage (far over the bound) to exercise the clamp.

What is timed, per model call (`time.perf_counter`):

* **provider**: `AnthropicProvider.complete` itself, in its worker thread (a timing proxy);
* **journaled**: `Conversation._model_call` (bound computation, cap check, the ``Started`` and
  ``Completed`` journal records, the thread hop, the provider call, billing, decoding the
  recorded result) plus the journal write of the assistant message that follows it. Routing
  (once per turn) and commands are not part of it;
* **bookkeeping** = journaled - provider of the same call (paired, so HTTP noise cancels);
* **bare SDK**, the baseline: after each run, each of its model calls is sent again with the
  plain SDK, ``anthropic.Anthropic(...).messages.create(**same_body, stream=True)`` iterated to
  the end, with the same reply scripted into the fake (same request, same reply bytes). The
  baseline is interleaved with the runs, on the same fake server and the same process.

Journal writes are real (one Arrow segment per record, fsync'd) on the storage directory,
``--dir`` or a temporary directory. The provider and the bare client are each created once, so
both reuse their HTTP connection across runs. Not included: what a run actor adds around the
conversation through Ray, the credit reservation before each call and the progress report after
each step (both control-plane calls in a real run, no-ops here). The fake's server is given
TCP_NODELAY: without it every streamed reply waits ~40 ms for a delayed ACK (Nagle), in the
bare SDK call as much as in the provider, which would hide everything measured here.

    .venv/bin/python benchmarks/cost_accounting.py --runs 200

Prints a human summary to stderr and a Markdown row for benchmarks/RESULTS.md to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fakes, when run as a script

from support import words  # noqa: E402

from nodus.resources import FAMILIES  # noqa: E402
from nodus_ray.durable.journal import Journal  # noqa: E402
from nodus_ray.durable.steps import Steps  # noqa: E402
from nodus_ray.models.anthropic_provider import AnthropicProvider  # noqa: E402
from nodus_ray.models.base import BASH_TOOL, ModelRequest, ModelResponse, Usage  # noqa: E402
from nodus_ray.money.billing import RunBudget, billed, max_input_tokens  # noqa: E402
from nodus_ray.money.prices import (  # noqa: E402
    DEFAULT_PRICE_TABLE,
    ROUTER_MAX_OUTPUT_TOKENS,
    ROUTER_MODEL,
    PriceTable,
)
from nodus_ray.money.spend import CapExceeded, RunSpend  # noqa: E402
from nodus_ray.runtime.conversation import Conversation, ConversationSpec, RunFailure  # noqa: E402
from nodus_ray.runtime.router import JevRouter, router_input_tokens  # noqa: E402
from nodus_ray.sandbox import create_sandbox  # noqa: E402
from nodus_ray.store.storage import Storage  # noqa: E402
from tests.fakes.anthropic_api import FakeMessagesAPI, Reply, text_reply, tool_use_reply  # noqa: E402

API_KEY = "sk-bench"
MAX_CALLS = 12
_WORDS = (
    "the",
    "run",
    "cap",
    "journal",
    "step",
    "model",
    "answer",
    "sandbox",
    "token",
    "cost",
    "replay",
    "result",
    "command",
    "output",
    "family",
    "router",
    "budget",
    "call",
    "we",
    "so",
)
_PROMPTS = (
    "What is {a} + {b}?",
    "List the numbers from 1 to {a} and tell me their sum.",
    "Debug this: the loop prints {a} lines instead of {b}. Explain why, step by step.",
    "Design a distributed algorithm to count {a} items and compare the trade-offs.",
    "Say hello {a} times.",
    "Analyze the output of seq {a} and refactor the command so it prints {b} lines.",
)


# --------------------------------------------------------------------------------------------
# The fake's random conversations


@dataclass
class Dice:
    """The current run's randomness, read by the fake's responder (one request at a time)."""

    rng: random.Random
    p_end: float
    overreport: float
    exchanges: list[tuple[dict[str, Any], Reply]] = field(default_factory=list)


class RandomResponder:
    def __init__(self) -> None:
        self.dice: Dice | None = None

    def __call__(self, body: dict[str, Any]) -> Reply:
        dice = self.dice
        assert dice is not None, "a request arrived outside a run"
        rng = dice.rng
        messages = body["messages"]
        call = 1 + sum(1 for message in messages if message.get("role") == "assistant")
        max_tokens = int(body["max_tokens"])
        sent = {key: body.get(key) for key in ("system", "messages", "tools")}
        total_in = int(len(json.dumps(sent, separators=(",", ":"))) / rng.uniform(3.0, 4.5))
        total_in += rng.randint(150, 400)
        if call == 1:
            read = 0
            creation = int(total_in * rng.uniform(0.3, 0.9)) if rng.random() < 0.8 else 0
        else:
            read = int(total_in * rng.uniform(0.5, 0.95)) if rng.random() < 0.85 else 0
            creation = int((total_in - read) * rng.uniform(0.0, 0.9))
        usage = {
            "input_tokens": total_in - read - creation,
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
        }

        if call >= MAX_CALLS or rng.random() < dice.p_end:
            if rng.random() < 0.1:  # cut at maxTokens
                output, stop = max_tokens, "max_tokens"
            else:
                output, stop = rng.randint(1, max_tokens), "end_turn"
            text = _words(rng, max(1, int(output * rng.uniform(2.5, 4.0))))
            answer: Reply = text_reply(text, stop_reason=stop, usage={**usage, "output_tokens": output})
        else:
            command = f"{rng.choice(('echo', 'seq'))} {rng.randint(1, 200)}"
            preamble = _words(rng, rng.randint(10, 400)) if rng.random() < 0.6 else None
            written = len(preamble or "") + len(command) + 40  # the tool call's JSON around it
            output = min(max_tokens, int(written / rng.uniform(3.0, 4.0)) + 5)
            answer = tool_use_reply(command, text=preamble, usage={**usage, "output_tokens": output})
        if rng.random() < dice.overreport:
            answer = _inflated(answer, 20)
        dice.exchanges.append((body, answer))
        return answer


def _words(rng: random.Random, chars: int) -> str:
    return words(rng, chars, _WORDS) or "ok"


def _inflated(answer: Reply, factor: int) -> Reply:
    usage = {key: value * factor for key, value in (answer.usage or {}).items()}  # type: ignore[union-attr]
    return type(answer)(**{**answer.__dict__, "usage": usage})


# --------------------------------------------------------------------------------------------
# Timing wrappers


class TimedJournal(Journal):
    """Counts the time spent in `Journal.append` (segment encoding, write, fsync, rename)."""

    def __init__(self, storage: Storage, prefix: str):
        super().__init__(storage, prefix)
        self.append_seconds = 0.0

    def append(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().append(*args, **kwargs)
        finally:
            self.append_seconds += time.perf_counter() - started


class TimedProvider:
    """The provider, with the duration of each `complete` recorded."""

    def __init__(self, inner: AnthropicProvider):
        self.inner = inner
        self.name = inner.name
        self.durations: list[float] = []

    def model_for_family(self, family: str) -> str:
        return self.inner.model_for_family(family)

    def complete(self, request: ModelRequest) -> ModelResponse:
        started = time.perf_counter()
        try:
            return self.inner.complete(request)
        finally:
            self.durations.append(time.perf_counter() - started)


@dataclass(frozen=True)
class CallTiming:
    provider: float
    journaled: float
    journal: float  # time inside Journal.append during the call (3 records)
    bound: float  # time computing the call's worst case (max_input_tokens and pricing)
    bare: float = math.nan

    @property
    def bookkeeping(self) -> float:
        return self.journaled - self.provider


class TimedConversation(Conversation):
    """`Conversation` with each model call timed; behaviour is unchanged."""

    calls: list[CallTiming]
    _pending: tuple[float, float, float, float] | None
    _bound_seconds: float

    def start_timing(self) -> None:
        self.calls, self._pending, self._bound_seconds = [], None, 0.0

    def _input_bound(self) -> int:
        started = time.perf_counter()
        try:
            return super()._input_bound()
        finally:
            self._bound_seconds += time.perf_counter() - started

    async def _model_call(self, *args: Any, **kwargs: Any) -> tuple[ModelResponse, Decimal]:
        # Whatever `Conversation._model_call` takes is passed through untouched: the timing must not
        # pin its signature (it did, and the script stopped running when the family was added).
        provider: TimedProvider = self.provider  # type: ignore[assignment]
        journal: TimedJournal = self.steps.journal  # type: ignore[assignment]
        done = len(provider.durations)
        journal_before, self._bound_seconds = journal.append_seconds, 0.0
        started = time.perf_counter()
        result = await super()._model_call(*args, **kwargs)
        elapsed = time.perf_counter() - started
        assert len(provider.durations) == done + 1
        self._pending = (
            provider.durations[done],
            elapsed,
            journal.append_seconds - journal_before,
            self._bound_seconds,
        )
        return result

    async def _add_message(self, message: dict[str, Any]) -> None:
        journal: TimedJournal = self.steps.journal  # type: ignore[assignment]
        journal_before = journal.append_seconds
        started = time.perf_counter()
        await super()._add_message(message)
        elapsed = time.perf_counter() - started
        if message.get("role") == "assistant" and self._pending is not None:
            provider, call, journal_s, bound = self._pending
            self.calls.append(
                CallTiming(
                    provider=provider,
                    journaled=call + elapsed,
                    journal=journal_s + journal.append_seconds - journal_before,
                    bound=bound,
                )
            )
            self._pending = None


# --------------------------------------------------------------------------------------------
# One run


@dataclass
class RunResult:
    index: int
    cap: Decimal
    spent: Decimal
    journal_spent: Decimal
    outcome: str  # Completed, MaxTokensReached, MaxCostReached, or a RunFailure reason
    model_calls: int
    router_calls: int
    calls: list[CallTiming]
    charge_errors: list[str]
    clamped: int
    charge_over_bound: list[float]  # each model call's charge / the bound checked for it

    @property
    def ratio(self) -> float:
        return float(self.spent / self.cap)


async def _no_credits(_amount: Decimal) -> None:
    return None


async def _no_progress(_turns: Any) -> None:
    return None


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _first_check(prices: PriceTable, agent: dict[str, Any]) -> float:
    """Roughly what the turn's first cap check asks for: the router call and the dearest first call."""
    spend = RunSpend(prices, "Nodus", RunBudget(None), reserve_credits=_no_credits)
    tokens = max_input_tokens(agent["system"], [{"role": "user", "content": agent["prompt"]}], [BASH_TOOL])
    first = max(
        spend.worst(prices.family_models[family], tokens, agent["max_tokens"]) for family in agent["families"]
    )
    if len(agent["families"]) > 1:
        first += spend.worst(ROUTER_MODEL, router_input_tokens(agent["prompt"]), ROUTER_MAX_OUTPUT_TOKENS)
    return float(first)


# How often an agent allows each family: most allow haiku and sonnet, fewer the dear ones.
_FAMILY_ODDS = {"haiku": 0.75, "sonnet": 0.75, "opus": 0.35, "fable": 0.2}


def _families(rng: random.Random) -> list[str]:
    chosen = [family for family in FAMILIES if rng.random() < _FAMILY_ODDS[family]]
    return chosen or [rng.choice(FAMILIES)]


def _agent(rng: random.Random, prices: PriceTable) -> dict[str, Any]:
    """A random agent and prompt, and a cap in $0.001..$0.50.

    The cap is drawn log-uniform around the turn's first check ``first`` (the router call plus the
    dearest allowed family's first call at its largest): for 1 run in 10 between 0.3x and 1x of
    it, so the run cannot make even its first call, otherwise between 1x and 30x, so many runs
    stop at the cap after some calls and the rest finish. Both windows are clipped to
    $0.001..$0.50; when clipping empties a window (fable or opus with a large maxTokens can need
    more than $0.50 for one call), the cap is drawn over the whole range.
    """
    agent: dict[str, Any] = {
        "families": _families(rng),
        "max_tokens": int(round(_log_uniform(rng, 64, 4096))),
        "prompt": rng.choice(_PROMPTS).format(a=rng.randint(2, 400), b=rng.randint(2, 400)),
        "max_tool_calls": rng.randint(4, 50),
        "p_end": rng.uniform(0.08, 0.6),
        "system": rng.choice(
            (
                "Answer briefly.",
                "You are a careful engineer. Use the bash tool when a command helps, and keep answers short.",
            )
        ),
    }
    first = _first_check(prices, agent)
    low, high = (0.3 * first, first) if rng.random() < 0.1 else (first, 30 * first)
    low, high = max(0.001, low), min(0.5, high)
    if low >= high:
        low, high = 0.001, 0.5
    agent["cap"] = Decimal(str(_log_uniform(rng, low, high))).quantize(Decimal("0.000001"))
    return agent


async def one_run(
    index: int,
    seed: int,
    base: Path,
    storage: Storage,
    provider: TimedProvider,
    responder: RandomResponder,
    prices: PriceTable,
    overreport: float,
    exchanges: list[tuple[dict[str, Any], Reply]],
) -> RunResult:
    """One seeded run; ``exchanges`` receives the (request body, reply) pairs the fake served."""
    rng = random.Random(f"{seed}:{index}")
    agent = _agent(rng, prices)
    responder.dice = Dice(
        rng=random.Random(f"{seed}:{index}:fake"),
        p_end=agent["p_end"],
        overreport=overreport,
        exchanges=exchanges,
    )
    prefix = f"runs/run-{index:05d}/journal"
    journal = TimedJournal(storage, prefix)
    workspace = base / "sandboxes" / f"run-{index:05d}"
    sandboxes: list[Any] = []

    def open_sandbox() -> Any:
        sandbox = create_sandbox(workspace)
        sandboxes.append(sandbox)
        return sandbox

    conversation = TimedConversation(
        steps=Steps(journal),
        provider=provider,
        spec=ConversationSpec(
            system=agent["system"],
            families=agent["families"],
            model_name=None,
            max_tokens=agent["max_tokens"],
            max_tool_calls=agent["max_tool_calls"],
            prompt=agent["prompt"],
        ),
        spend=RunSpend(prices, "Nodus", RunBudget(agent["cap"]), reserve_credits=_no_credits),
        router=JevRouter().route,
        open_sandbox=open_sandbox,
        on_progress=_no_progress,
    )
    conversation.start_timing()
    try:
        await conversation.run()
        outcome = "MaxTokensReached" if conversation.stop_reason == "max_tokens" else "Completed"
    except CapExceeded:
        outcome = "MaxCostReached"
    except RunFailure as failure:
        outcome = failure.reason
    finally:
        for sandbox in sandboxes:
            await asyncio.to_thread(sandbox.delete)
        responder.dice = None

    # The spend as stored: read the journal back from storage, as a replay would.
    records = await asyncio.to_thread(Journal(storage, prefix).load)
    journal_spent = sum((Decimal(record.cost_usd) for record in records), Decimal(0))
    bounds = {
        r.step_id: Decimal(r.payload["boundUSD"])
        for r in records
        if r.kind == "model" and r.state == "Started"
    }
    charge_errors: list[str] = []
    clamped = 0
    ratios: list[float] = []
    model_calls = router_calls = 0
    for record in records:
        if record.state != "Completed":
            continue
        if record.kind == "route":
            router_calls += record.payload["result"]["routing"] == "jev"
        if record.kind != "model":
            continue
        model_calls += 1
        result = record.payload["result"]
        actual = billed(prices.cost(result["model"], Usage.from_dict(result["usage"])), "Nodus")
        bound = bounds[record.step_id]
        charged = Decimal(record.cost_usd)
        clamped += actual > bound
        if charged != min(actual, bound) or charged != Decimal(result["billedUSD"]):
            charge_errors.append(
                f"run {index} {record.step_id}: charged {charged}, actual {actual}, bound {bound}"
            )
        if bound > 0:
            ratios.append(float(charged / bound))
    return RunResult(
        index=index,
        cap=agent["cap"],
        spent=conversation.cost_usd,
        journal_spent=journal_spent,
        outcome=outcome,
        model_calls=model_calls,
        router_calls=router_calls,
        calls=conversation.calls,
        charge_errors=charge_errors,
        clamped=clamped,
        charge_over_bound=ratios,
    )


# --------------------------------------------------------------------------------------------
# The baseline


def bare_call(
    client: anthropic.Anthropic, fake: FakeMessagesAPI, body: dict[str, Any], answer: Reply
) -> float:
    """The same request, answered with the same reply, through the plain SDK; its seconds."""
    params = {key: value for key, value in body.items() if key != "stream"}
    fake.script(answer)
    started = time.perf_counter()
    stream = client.messages.create(**params, stream=True)
    for _event in stream:
        pass
    elapsed = time.perf_counter() - started
    assert fake.pending == 0
    return elapsed


# --------------------------------------------------------------------------------------------
# Report


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f} / {_pct(values, 0.95) * 1000:.2f} ms"


async def main_async(args: argparse.Namespace) -> int:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="nodus-bench-cost-"))
    base.mkdir(parents=True, exist_ok=True)
    storage = Storage(str(base / "storage"))
    prices = DEFAULT_PRICE_TABLE
    responder = RandomResponder()
    fake = FakeMessagesAPI().start()  # it sets TCP_NODELAY, as real API front ends do
    fake.set_responder(responder)
    provider = TimedProvider(
        AnthropicProvider(
            api_key=API_KEY, base_url=fake.base_url, family_models=prices.family_models, max_retries=0
        )
    )
    client = anthropic.Anthropic(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
    results: list[RunResult] = []
    started = time.perf_counter()
    try:
        # Warm both paths (imports, connections, the bubblewrap probe); not counted.
        warm: list[tuple[dict[str, Any], Reply]] = []
        await one_run(-1, args.seed, base, storage, provider, responder, prices, 0.0, warm)
        for body, answer in warm:
            bare_call(client, fake, body, answer)
        provider.durations.clear()
        for index in range(args.runs):
            exchanges: list[tuple[dict[str, Any], Reply]] = []
            result = await one_run(
                index, args.seed, base, storage, provider, responder, prices, args.overreport, exchanges
            )
            # The baseline for each of this run's model calls, right after the run.
            bares = [
                await asyncio.to_thread(bare_call, client, fake, body, answer) for body, answer in exchanges
            ]
            if len(bares) != len(result.calls):
                raise RuntimeError(f"run {index}: {len(bares)} replies for {len(result.calls)} timed calls")
            result.calls = [
                CallTiming(c.provider, c.journaled, c.journal, c.bound, bare)
                for c, bare in zip(result.calls, bares, strict=True)
            ]
            results.append(result)
            if args.verbose:
                print(
                    f"run {index}: {result.outcome} after {result.model_calls} call(s), "
                    f"${result.spent} of ${result.cap} ({result.ratio:.3f})",
                    file=sys.stderr,
                )
    finally:
        provider.inner.close()
        client.close()
        fake.stop()
        if not args.dir and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    wall = time.perf_counter() - started
    if fake.responder_errors:
        raise RuntimeError(f"the responder failed: {fake.responder_errors[0]!r}")
    return report(args, results, wall)


def report(args: argparse.Namespace, results: list[RunResult], wall: float) -> int:
    calls = [call for result in results for call in result.calls]
    outcomes = Counter(result.outcome for result in results)
    at_cap = [result for result in results if result.outcome == "MaxCostReached"]
    at_cap_before_any = sum(1 for result in at_cap if result.model_calls == 0)
    max_ratio = max((result.ratio for result in results), default=0.0)
    worst = max(results, key=lambda result: result.ratio) if results else None
    mismatched = [result for result in results if result.journal_spent != result.spent]
    charge_errors = [error for result in results for error in result.charge_errors]
    clamped = sum(result.clamped for result in results)
    per_run_calls = Counter(result.model_calls for result in results)
    charge_over_bound = [ratio for result in results for ratio in result.charge_over_bound]
    total_spent = sum((result.spent for result in results), Decimal(0))

    out = sys.stderr
    print(
        f"{len(results)} runs (seed {args.seed}) in {wall:.1f} s: {len(calls)} model calls, "
        f"{sum(r.router_calls for r in results)} router calls, ${total_spent} billed in all",
        file=out,
    )
    print("  outcomes: " + ", ".join(f"{name} {count}" for name, count in outcomes.most_common()), file=out)
    print(
        f"  stopped at the cap: {len(at_cap)} ({at_cap_before_any} before their first model call, "
        f"{len(at_cap) - at_cap_before_any} after 1+ calls)",
        file=out,
    )
    print(
        "  model calls per run (calls: runs): "
        + ", ".join(f"{n}: {c}" for n, c in sorted(per_run_calls.items())),
        file=out,
    )
    if worst is not None:
        stopped_later = [r.ratio for r in at_cap if r.model_calls > 0]
        print(
            f"  max spend/cap {max_ratio:.4f} (run {worst.index}: ${worst.spent} of ${worst.cap}, "
            f"{worst.outcome}); spend/cap of the runs stopped at the cap after 1+ calls: median "
            f"{statistics.median(stopped_later) if stopped_later else float('nan'):.4f}, "
            f"max {max(stopped_later, default=float('nan')):.4f}",
            file=out,
        )
    if charge_over_bound:
        print(
            f"  charge / checked bound per model call: median {statistics.median(charge_over_bound):.4f}, "
            f"max {max(charge_over_bound):.4f}; {clamped} charge(s) clamped to the bound",
            file=out,
        )
    print(
        f"  journal re-derivation: {len(results) - len(mismatched)}/{len(results)} runs agree; "
        f"{len(charge_errors)} wrong charge(s)",
        file=out,
    )
    if calls:
        print(
            f"  per model call, p50 / p95: bare SDK {_ms([c.bare for c in calls])}, "
            f"provider.complete {_ms([c.provider for c in calls])}, "
            f"journaled {_ms([c.journaled for c in calls])}",
            file=out,
        )
        print(
            f"  bookkeeping (journaled - provider, same call) {_ms([c.bookkeeping for c in calls])}: "
            f"journal appends {_ms([c.journal for c in calls])} (3 records), "
            f"worst-case bound {_ms([c.bound for c in calls])}",
            file=out,
        )
        print(
            f"  journaled - bare SDK (same request and reply) {_ms([c.journaled - c.bare for c in calls])}",
            file=out,
        )
    for error in charge_errors[:5]:
        print(f"  WRONG CHARGE: {error}", file=out)
    for result in mismatched[:5]:
        print(
            f"  JOURNAL MISMATCH: run {result.index}: conversation ${result.spent}, journal "
            f"${result.journal_spent}",
            file=out,
        )

    print(
        "| date | runs (seed) | model calls | stopped at cap (before 1st call) | max spend/cap "
        "| bare SDK p50 / p95 | provider.complete p50 / p95 | journaled call p50 / p95 "
        "| bookkeeping (journaled - provider) p50 / p95 | journaled - bare p50 / p95 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    if calls:
        print(
            f"| {time.strftime('%Y-%m-%d')} | {len(results)} ({args.seed}) | {len(calls)} "
            f"| {len(at_cap)} ({at_cap_before_any}) | {max_ratio:.3f} "
            f"| {_ms([c.bare for c in calls])} | {_ms([c.provider for c in calls])} "
            f"| {_ms([c.journaled for c in calls])} | {_ms([c.bookkeeping for c in calls])} "
            f"| {_ms([c.journaled - c.bare for c in calls])} |"
        )

    failed = False
    if max_ratio > 1:
        print(f"FAIL: a run spent past its cap (spend/cap {max_ratio})", file=out)
        failed = True
    if mismatched or charge_errors:
        print("FAIL: the journal does not account for the spend", file=out)
        failed = True
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--overreport",
        type=float,
        default=0.0,
        help="fraction of replies that report 20x their usage (exercises the clamp)",
    )
    parser.add_argument("--dir", help="storage and sandbox directory (default: a temporary one, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--verbose", action="store_true", help="one line per run on stderr")
    args = parser.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
