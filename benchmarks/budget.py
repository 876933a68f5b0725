"""The cost benchmark of the project Budget: many runs under a small Budget never pass it.

Two projects on one service, the same runs in each (an offline opus call over some 16 KB of
context, a command, a second call: model and sandbox spend both, each step's hold of the same
order as what it spends):

* ``baseline``: no Budget. Its runs all finish; what they spent in all is the project's need.
* ``budgeted``: a Budget of ``--fraction`` of that need (half by default). Its runs start together
  and spend until the Budget is used up; the others wait with ``BudgetExceeded``.

While the budgeted runs go, the script samples the project's spend (the sum of its runs'
``status.cost.billedUSD``, read from the API, and the Budget's own ``spentUSD`` and
``reservedUSD``) every ``--interval`` seconds and records the largest figure seen: it must never
pass the Budget. Then it raises the Budget to twice the need and times how long the waiting
runs take to finish. The figures are printed and appended to benchmarks/RESULTS.md.

    python benchmarks/budget.py --runs 30

It starts nodus with `nodus up` on a temporary home, storage and Ray head of its own and stops it
after.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from support import auth_headers, nodus_up, temporary_service, wait_until, words

V1 = "nodus.dev/v1"
RESULTS = Path(__file__).with_name("RESULTS.md")
TERMINAL = ("Succeeded", "Failed", "Cancelled")


@dataclass
class Sample:
    at: float
    billed: Decimal  # the sum of the project's runs' billedUSD
    spent: Decimal  # the Budget's spentUSD
    reserved: Decimal
    succeeded: int
    waiting: int


@dataclass
class Outcome:
    need: Decimal = Decimal(0)
    baseline_seconds: float = 0.0
    limit: Decimal = Decimal(0)
    samples: list[Sample] = field(default_factory=list)
    final_spent: Decimal = Decimal(0)
    finished_under_budget: int = 0
    waited: int = 0
    resume_seconds: float = 0.0
    final_after_raise: Decimal = Decimal(0)


def _agent(http: httpx.Client, project: str) -> None:
    response = http.put(
        f"/v1/projects/{project}/agents/worker",
        json={
            "apiVersion": V1,
            "kind": "Agent",
            "metadata": {"name": "worker"},
            "spec": {
                "system": "Run what you are asked to.",
                "maxTokens": 256,
                "perRunMaxCostUSD": "1.00",
                "model": {"access": "Nodus", "families": ["opus"]},
            },
        },
    )
    response.raise_for_status()


_VOCABULARY = ("ledger", "invoice", "quarter", "balance", "account", "total", "month", "report", "entry")


def _create_runs(http: httpx.Client, project: str, count: int, context_bytes: int) -> list[str]:
    names = [f"work-{index:04d}" for index in range(count)]
    rng = random.Random(7)  # the same inputs in both projects
    for index, name in enumerate(names):
        context = words(rng, context_bytes, _VOCABULARY)
        response = http.post(
            f"/v1/projects/{project}/agentruns",
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                # The offline model runs what follows "run:" as a command, then answers.
                "spec": {"agent": "worker", "input": f"{context}\n\nrun: seq 1 {20000 + index} | md5sum"},
            },
        )
        response.raise_for_status()
    return names


def _runs(http: httpx.Client, project: str) -> list[dict[str, Any]]:
    response = http.get(f"/v1/projects/{project}/agentruns")
    response.raise_for_status()
    return list(response.json()["items"])


def _billed(run: dict[str, Any]) -> Decimal:
    cost = run["status"].get("cost") or {}
    billed = Decimal(str(cost.get("billedUSD") or "0"))
    parts = Decimal(str(cost.get("totalUSD") or "0")) + Decimal(str(cost.get("sandboxUSD") or "0"))
    return max(billed, parts)


def _sample(http: httpx.Client, project: str, start: float) -> Sample:
    runs = _runs(http, project)
    budget = http.get(f"/v1/projects/{project}/budgets/default").json()["status"]
    return Sample(
        at=time.monotonic() - start,
        billed=sum((_billed(run) for run in runs), Decimal(0)),
        spent=Decimal(budget["spentUSD"]),
        reserved=Decimal(budget["reservedUSD"]),
        succeeded=sum(run["status"]["phase"] == "Succeeded" for run in runs),
        waiting=sum(run["status"].get("reason") == "BudgetExceeded" for run in runs),
    )


def _settled(runs: list[dict[str, Any]], count: int) -> bool:
    """Every run finished or waits for the Budget, and none has an actor any more."""
    return len(runs) == count and all(
        run["status"]["phase"] in TERMINAL
        or (run["status"].get("reason") == "BudgetExceeded" and not run["status"].get("actorName"))
        for run in runs
    )


def _bench(env: dict[str, str], args: argparse.Namespace) -> Outcome:
    port = nodus_up(env)
    outcome = Outcome()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth_headers(env), timeout=60) as http:
        # The baseline: the same runs with no Budget; what they spend is the need.
        _agent(http, "baseline")
        start = time.monotonic()
        _create_runs(http, "baseline", args.runs, args.context_bytes)
        finished = wait_until(
            lambda: (
                (runs := _runs(http, "baseline"))
                and all(r["status"]["phase"] in TERMINAL for r in runs)
                and runs
            ),
            timeout=args.timeout,
            what="the baseline runs to finish",
            interval=0.5,
        )
        outcome.baseline_seconds = time.monotonic() - start
        outcome.need = sum((_billed(run) for run in finished), Decimal(0))
        failed = [r["metadata"]["name"] for r in finished if r["status"]["phase"] != "Succeeded"]
        if failed:
            sys.exit(f"baseline runs did not succeed: {failed[:5]}")
        outcome.limit = (outcome.need * Decimal(str(args.fraction))).quantize(Decimal("0.000001"))

        # The same runs under a Budget of a fraction of the need.
        _agent(http, "budgeted")
        response = http.post(
            "/v1/projects/budgeted/budgets",
            json={
                "apiVersion": V1,
                "kind": "Budget",
                "metadata": {"name": "default"},
                "spec": {"maxCostUSD": str(outcome.limit), "period": "total"},
            },
        )
        response.raise_for_status()
        start = time.monotonic()
        _create_runs(http, "budgeted", args.runs, args.context_bytes)
        while True:
            sample = _sample(http, "budgeted", start)
            outcome.samples.append(sample)
            if _settled(_runs(http, "budgeted"), args.runs):
                break
            if sample.at > args.timeout:
                sys.exit("timed out waiting for the budgeted runs to finish or wait")
            time.sleep(args.interval)
        final = _sample(http, "budgeted", start)
        outcome.samples.append(final)
        outcome.final_spent = final.billed
        outcome.finished_under_budget = final.succeeded
        outcome.waited = final.waiting

        # Raised, the Budget lets every waiting run finish.
        raised = http.patch(
            "/v1/projects/budgeted/budgets/default",
            json={"spec": {"maxCostUSD": str(outcome.need * 2)}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        raised.raise_for_status()
        start = time.monotonic()
        done = wait_until(
            lambda: (
                (runs := _runs(http, "budgeted"))
                and all(r["status"]["phase"] in TERMINAL for r in runs)
                and runs
            ),
            timeout=args.timeout,
            what="the budgeted runs to finish after the raise",
            interval=0.5,
        )
        outcome.resume_seconds = time.monotonic() - start
        outcome.final_after_raise = sum((_billed(run) for run in done), Decimal(0))
    return outcome


def _report(outcome: Outcome, args: argparse.Namespace) -> str:
    peak_billed = max(sample.billed for sample in outcome.samples)
    peak_held = max(sample.spent + sample.reserved for sample in outcome.samples)
    over = [s for s in outcome.samples if s.billed > outcome.limit or s.spent + s.reserved > outcome.limit]
    timeline = ", ".join(
        f"{s.at:.0f}s ${s.billed}"
        for s in outcome.samples[:: max(1, len(outcome.samples) // 8)] + outcome.samples[-1:]
    )
    verdict = "never passed" if not over else f"PASSED the Budget in {len(over)} samples"
    return "\n".join(
        [
            "",
            f"## Project Budget: spend never passes it ({datetime.now(UTC):%Y-%m-%d})",
            "",
            f"`.venv/bin/python benchmarks/budget.py --runs {args.runs} --fraction {args.fraction}`: "
            f"{args.runs} runs in one project (an offline opus call over {args.context_bytes} bytes of "
            "context, a command, a second call: model and sandbox spend), beside a baseline of the "
            "same runs in a project with no Budget.",
            "",
            f"- **Baseline** (no Budget): all {args.runs} succeeded in {outcome.baseline_seconds:.1f} s and "
            f"spent ${outcome.need}.",
            f"- **Budgeted** (maxCostUSD ${outcome.limit}, {args.fraction:g} of that): "
            f"{outcome.finished_under_budget} runs finished and {outcome.waited} waited with "
            f"BudgetExceeded; the project spent ${outcome.final_spent}.",
            f"- **Never passed:** over {len(outcome.samples)} samples ({args.interval:g} s apart) the "
            f"highest spend seen was ${peak_billed}, and the highest spent + reserved "
            f"${peak_held}, against the limit ${outcome.limit}: {verdict}.",
            f"- Spend over time: {timeline}.",
            f"- **Raised** to ${outcome.need * 2}: the waiting runs finished in {outcome.resume_seconds:.1f} s; "
            f"the project then spent ${outcome.final_after_raise} in all (the baseline: ${outcome.need}).",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--fraction", type=float, default=0.5, help="the Budget, as a fraction of the need")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between spend samples")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--context-bytes", type=int, default=16000, help="filler context of each input")
    parser.add_argument("--no-results", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()
    with temporary_service(
        "nodus-bench-budget-", NODUS_INITIAL_CREDITS="1000", NODUS_OFFLINE_LATENCY="0.05"
    ) as env:
        outcome = _bench(env, args)
    text = _report(outcome, args)
    print(text)
    if not args.no_results:
        with RESULTS.open("a") as results:
            results.write(text)
    over = [s for s in outcome.samples if s.billed > outcome.limit or s.spent + s.reserved > outcome.limit]
    if over:
        sys.exit(1)


if __name__ == "__main__":
    main()
