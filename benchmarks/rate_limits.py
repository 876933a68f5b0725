"""200 concurrent runs against an API that enforces a rate limit: with the limiter, and without.

One service (``nodus up`` on a temporary home and storage) whose ``ANTHROPIC_BASE_URL`` is an
in-process `FakeMessagesAPI` (tests/fakes) enforcing ``--rpm`` requests a minute per key over a
``--window`` of seconds (the API may enforce a minute's limit over shorter intervals; a short
window is the strict case), answering 429 with ``retry-after`` over it. Two BYOK agents on two
keys, haiku only. Each run makes ``--calls`` model calls: the fake answers its first
``calls - 1`` with a ``bash`` tool call of ``true`` (a cheap command in the run's sandbox) and
the last with ``end_turn``, so that demand (runs started a second times calls a run) exceeds
the limit and the limit, not the runs' start, sets the rate:

* **baseline**: a key the operator did not limit. Its calls go out as soon as their run starts,
  and the SDK retries 429 itself (``max_retries`` 4, honouring ``retry-after``): blind retries;
* **limited**: a key with ``NODUS_RATE_LIMITS`` at the same ``--rpm``: every call is scheduled
  by the cluster-wide limiter first, and a 429 goes back to it.

Each side is ``--runs`` runs in one group (maxActive ``--max-active``, all of them by default),
the limited side first, then the baseline, on the same service in the same invocation. Recorded
per side: runs succeeded / failed (and why), the 429s the API sent, the calls it let through,
the achieved throughput against ``--rpm`` (calls a minute between the first and the last call
let through, and over the **steady middle**: from the call at the 10th percentile of the side's
calls to the one at the 90th, which leaves out the ramp while the first actors start and the
drain while the last runs finish), the wall time, and the most runs seen Waiting / RateLimited
at once (the group's blockedReasons).

    .venv/bin/python benchmarks/rate_limits.py --runs 200 --max-active 50 --calls 4 --rpm 120 --window 2

On two cores, 200 run actors started at once take most of half an hour to start (a process and
the engine's imports each, at a load of 300+), so RESULTS records 50 at once.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from support import auth_headers, nodus_up, temporary_service, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fakes, when run as a script

from tests.fakes.anthropic_api import FakeMessagesAPI, Reply, text_reply, tool_use_reply  # noqa: E402
from tests.fakes.rate_limits import FakeRateLimit  # noqa: E402

V1 = "nodus.dev/v1"
LIMITED_KEY = "sk-ant-bench-limited-" + "1" * 24
BASELINE_KEY = "sk-ant-bench-baseline-" + "2" * 24
TERMINAL = ("Succeeded", "Failed", "Cancelled")
USAGE = {"input_tokens": 40, "output_tokens": 5}
MIDDLE = (0.1, 0.9)  # the steady middle: between these quantiles of a side's calls let through


def _responder(calls: int) -> Any:
    """A run's first ``calls - 1`` calls get a ``true`` tool call, the last one an answer."""

    def respond(body: dict[str, Any]) -> Reply:
        answered = sum(
            1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant"
        )
        if answered < calls - 1:
            return tool_use_reply("true", usage=USAGE)
        return text_reply("4", usage=USAGE)

    return respond


def _per_minute(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0]) * 60 if len(times) > 1 and times[-1] > times[0] else 0.0


def _middle(times: list[float]) -> list[float]:
    if len(times) < 10:
        return times
    low, high = (int(q * (len(times) - 1)) for q in MIDDLE)
    return times[low : high + 1]


@dataclass
class Side:
    name: str
    runs: int
    succeeded: int
    failed: Counter[str]
    throttled: int
    admitted: int
    per_minute: float
    middle_per_minute: float  # over the steady middle (MIDDLE)
    middle_seconds: float
    backlog_per_minute: float | None  # while runs waited for the limiter (the group said so)
    wall: float
    most_rate_limited: int

    def row(self, rpm: float, window: float) -> str:
        failed = ", ".join(f"{n} {reason}" for reason, n in self.failed.most_common()) or "0"
        return (
            f"| {time.strftime('%Y-%m-%d')} | {os.cpu_count()} | {self.name} | {self.runs} | {rpm:g} / {window:g} s "
            f"| {self.succeeded} | {failed} | {self.throttled} | {self.admitted} "
            f"| {_rate(self.per_minute, rpm)} | {_rate(self.middle_per_minute, rpm)} over {self.middle_seconds:.0f} s "
            f"| {_rate(self.backlog_per_minute, rpm)} "
            f"| {self.wall:.0f} s | {self.most_rate_limited} |"
        )


def _rate(per_minute: float | None, rpm: float) -> str:
    return "-" if per_minute is None else f"{per_minute:.1f} ({per_minute / rpm:.2f}x)"


def _fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _agent(http: httpx.Client, name: str, key: str) -> None:
    http.post(
        "/secrets",
        json={
            "apiVersion": V1,
            "kind": "Secret",
            "metadata": {"name": name},
            "stringData": {"ANTHROPIC_API_KEY": key},
        },
    ).raise_for_status()
    spec = {
        "system": "Answer briefly.",
        "model": {"access": "BYOK", "families": ["haiku"], "apiKeySecret": name},
    }
    http.put(
        f"/agents/{name}", json={"apiVersion": V1, "kind": "Agent", "metadata": {"name": name}, "spec": spec}
    ).raise_for_status()


def _members(http: httpx.Client, group: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"group": group}
    while True:
        answer = http.get("/agentruns", params=params)
        if answer.status_code != 200:  # a busy control plane (503): ask again
            print(f"listing {group}: {answer.status_code} {answer.text[:200]}", file=sys.stderr)
            time.sleep(2.0)
            continue
        page = answer.json()
        items.extend(page["items"])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items
        params = {"group": group, "continue": token}


def _side(
    http: httpx.Client, fake: FakeMessagesAPI, name: str, agent: str, runs: int, max_active: int
) -> Side:
    throttled, admitted = fake.throttled, len(fake.admitted)
    began = time.monotonic()
    http.post(
        "/agentgroups",
        json={
            "apiVersion": V1,
            "kind": "AgentGroup",
            "metadata": {"name": name},
            "spec": {"agent": agent, "limits": {"maxActive": max_active}},
        },
    ).raise_for_status()
    for first in range(0, runs, 100):
        items = [
            {
                "apiVersion": V1,
                "kind": "AgentRun",
                "spec": {"agent": agent, "group": name, "taskKey": f"t{i}", "input": f"What is {i} + {i}?"},
            }
            for i in range(first, min(first + 100, runs))
        ]
        http.post(
            "/agentruns", json={"apiVersion": V1, "kind": "AgentRunList", "items": items}
        ).raise_for_status()
    http.patch(f"/agentgroups/{name}", json={"spec": {"sealed": True}}).raise_for_status()
    most = 0
    backlog: list[float] = []  # when the group had members waiting for the limiter
    progress: list[float] = []

    def done() -> bool:
        nonlocal most
        answer = http.get(f"/agentgroups/{name}")
        status = (answer.json().get("status") if answer.status_code == 200 else None) or {}
        waiting = int((status.get("blockedReasons") or {}).get("RateLimited", 0))
        most = max(most, waiting)
        now = time.monotonic()
        if waiting:
            backlog.append(now)
        if len(progress) == 0 or now - progress[-1] >= 30:  # a line on stderr every 30 s
            progress.append(now)
            print(
                f"{name} {now - began:.0f} s: {len(fake.admitted) - admitted} calls let through, "
                f"{fake.throttled - throttled} 429s, {waiting} RateLimited, {status.get('counts')}",
                file=sys.stderr,
                flush=True,
            )
        return status.get("phase") in TERMINAL

    wait_until(done, timeout=3600, what=f"group {name} to finish", interval=1.0)
    wall = time.monotonic() - began
    members = _members(http, name)
    failed = Counter(str(r["status"].get("reason")) for r in members if r["status"]["phase"] != "Succeeded")
    times = fake.admitted[admitted:]
    per_minute = _per_minute(times)
    middle = _middle(times)
    backlog_per_minute = None
    if len(backlog) > 1:  # calls let through while some run waited its turn
        inside = [t for t in times if backlog[0] <= t <= backlog[-1]]
        if len(inside) > 1:
            backlog_per_minute = (len(inside) - 1) / (inside[-1] - inside[0]) * 60
    return Side(
        name=name,
        runs=runs,
        succeeded=sum(1 for r in members if r["status"]["phase"] == "Succeeded"),
        failed=failed,
        throttled=fake.throttled - throttled,
        admitted=len(times),
        per_minute=per_minute,
        middle_per_minute=_per_minute(middle),
        middle_seconds=middle[-1] - middle[0] if middle else 0.0,
        backlog_per_minute=backlog_per_minute,
        wall=wall,
        most_rate_limited=most,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--max-active", type=int, default=0, help="runs at once (0: all of them)")
    parser.add_argument(
        "--rpm", type=float, default=60.0, help="the API's limit and the operator's, a minute"
    )
    parser.add_argument("--calls", type=int, default=4, help="model calls a run (the last one ends it)")
    parser.add_argument("--window", type=float, default=2.0, help="seconds of budget the API's buckets hold")
    args = parser.parse_args()

    fake = FakeMessagesAPI().start()
    fake.set_responder(_responder(args.calls))
    fake.rate_limit(FakeRateLimit(rpm=args.rpm, window_seconds=args.window))
    limits = f"{_fingerprint(LIMITED_KEY)}/haiku=rpm:{args.rpm:g}"
    try:
        with temporary_service(
            "nodus-bench-ratelimits-", ANTHROPIC_BASE_URL=fake.base_url, NODUS_RATE_LIMITS=limits
        ) as env:
            port = nodus_up(env)
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}/v1/projects/default", timeout=60, headers=auth_headers(env)
            ) as http:
                _agent(http, "baseline", BASELINE_KEY)
                _agent(http, "limited", LIMITED_KEY)
                at_once = args.max_active or args.runs
                sides = []
                for name in ("limited", "baseline"):  # the limited side first: the service is fresh
                    sides.append(_side(http, fake, name, name, args.runs, at_once))
                    print(sides[-1].row(args.rpm, args.window), flush=True)  # each side as it ends
    finally:
        fake.stop()
    print(f"runs at once (group maxActive): {args.max_active or args.runs}; model calls a run: {args.calls}")
    print(
        "| date | cores | side | runs | API limit (rpm / window) | succeeded | failed | 429s sent | calls let through "
        "| a minute, first to last (x limit) | a minute, steady middle (x limit) "
        "| a minute while runs waited RateLimited | wall | most RateLimited at once |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for side in sides:
        print(side.row(args.rpm, args.window))


if __name__ == "__main__":
    main()
