"""One AgentGroup's makespan and start latency, with pre-started run actors and without.

K runs go through one group with ``maxActive`` N on the offline model with L seconds of
simulated latency per call. The same group runs twice on the same machine, once on a server
started with ``NODUS_RUN_POOL=0`` (every admitted run waits for a new Ray worker process: the
baseline) and once with the pool on (``NODUS_RUN_POOL``, default 2 per node). Reported per
phase, all from the server's own timestamps:

* makespan: the group's creation to its ``finishedAt``, against the ideal ``ceil(K/N) x run
  time``, where run time is the median of one run's first model call to its end (what a run
  needs when nothing else costs anything);
* start latency: a run's admission (``status.admittedAt``) to its first model call (the first
  ``model`` step's ``startedAt``), p50 and p99;

and, on its own, the supervisor's decision core (`nodus_ray.core.admission.Admission`, the code the
supervisor actor runs for every report): admission decisions per second for K' runs, with no
Ray and no I/O.

    python benchmarks/group_makespan.py --runs 40 --max-active 4 --latency 0.5

Each phase starts nodus with `nodus up` on its own temporary storage and stops it after.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import httpx
from support import api_port, auth_headers, temporary_service, wait_until

NODUS = str(Path(sys.executable).parent / "nodus")
V1 = "nodus.dev/v1"


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _seconds(start: str, end: str) -> float:
    return (_parse(end) - _parse(start)).total_seconds()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class Phase:
    name: str
    makespan: float
    ideal: float
    run_time: float
    start_latencies: list[float]

    def row(self, runs: int, max_active: int, latency: float) -> str:
        p50 = statistics.median(self.start_latencies) * 1000
        p99 = _percentile(self.start_latencies, 0.99) * 1000
        return (
            f"| {time.strftime('%Y-%m-%d')} | {os.cpu_count()} | {self.name} | {runs} | {max_active} | {latency:g} s "
            f"| {self.makespan:.1f} s / {self.ideal:.1f} s = {self.makespan / self.ideal:.2f}x "
            f"| {self.run_time:.2f} s | {p50:.0f} / {p99:.0f} ms |"
        )


def _up(env: dict[str, str], port: int) -> None:
    result = subprocess.run(
        [NODUS, "up", "--port", str(port)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if result.returncode != 0:
        sys.exit(f"nodus up failed: {result.stderr}")


def _phase(name: str, pool: int, runs: int, max_active: int, latency: float, port: int) -> Phase:
    with temporary_service(
        "nodus-bench-makespan-",
        NODUS_OFFLINE_LATENCY=str(latency),
        NODUS_RUN_POOL=str(pool),
        NODUS_INITIAL_CREDITS="100",
    ) as env:
        port = port or api_port(env)
        _up(env, port)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}/v1/projects/default", timeout=60, headers=auth_headers(env)
        ) as http:
            return _measure(http, name, runs, max_active)


def _measure(http: httpx.Client, name: str, runs: int, max_active: int) -> Phase:
    http.put(
        "/agents/bench",
        json={
            "apiVersion": V1,
            "kind": "Agent",
            "metadata": {"name": "bench"},
            "spec": {"system": "Answer briefly.", "model": {"families": ["haiku"]}},
        },
    ).raise_for_status()
    # A warm-up run: the first run of a server pays for the router's and the pool's first starts.
    http.post(
        "/agentruns",
        json={
            "apiVersion": V1,
            "kind": "AgentRun",
            "metadata": {"name": "warm"},
            "spec": {"agent": "bench", "input": "What is 1 + 1?"},
        },
    ).raise_for_status()
    _wait(lambda: http.get("/agentruns/warm").json()["status"]["phase"] == "Succeeded")
    time.sleep(2.0)  # let the pool refill after the warm-up, as it would between batches

    group = http.post(
        "/agentgroups",
        json={
            "apiVersion": V1,
            "kind": "AgentGroup",
            "metadata": {"name": "g"},
            "spec": {"agent": "bench", "limits": {"maxActive": max_active}},
        },
    )
    group.raise_for_status()
    for first in range(0, runs, 100):
        items = [
            {
                "apiVersion": V1,
                "kind": "AgentRun",
                "spec": {"agent": "bench", "group": "g", "taskKey": f"t{i}", "input": f"What is {i} + {i}?"},
            }
            for i in range(first, min(first + 100, runs))
        ]
        http.post(
            "/agentruns",
            json={"apiVersion": V1, "kind": "AgentRunList", "items": items},
            headers={"Idempotency-Key": f"bench-{first}"},
        ).raise_for_status()
    http.patch("/agentgroups/g", json={"spec": {"sealed": True}}).raise_for_status()
    final = _wait(
        lambda: (g := http.get("/agentgroups/g").json())["status"]["phase"] != "Running" and g, timeout=3600
    )
    assert final["status"]["phase"] == "Succeeded", final["status"]
    makespan = _seconds(final["metadata"]["creationTimestamp"], final["status"]["finishedAt"])
    latencies, run_times = [], []
    for run in http.get("/agentruns", params={"group": "g"}).json()["items"]:
        steps = http.get(f"/agentruns/{run['metadata']['name']}/steps").json()["items"]
        first_model = next(step for step in steps if step["kind"] == "model")
        latencies.append(_seconds(run["status"]["admittedAt"], first_model["startedAt"]))
        run_times.append(_seconds(first_model["startedAt"], run["status"]["finishedAt"]))
    run_time = statistics.median(run_times)
    return Phase(name, makespan, math.ceil(runs / max_active) * run_time, run_time, latencies)


def _wait(condition, timeout: float = 600):  # type: ignore[no-untyped-def]
    return wait_until(condition, timeout, "the group")


def admission_rate(runs: int) -> tuple[float, int]:
    """Decisions per second of the admission core: every run admitted, reported done, next admitted."""
    from nodus_ray.core.admission import Admission, GroupLimits, Member

    admission = Admission(GroupLimits(max_active=10, max_pending=max(runs, 1), max_cost=Decimal("1000000")))
    members = [
        Member(key=f"t{i}", run=f"g-t{i}", cap=Decimal("0.10"), depends_on=(f"t{i - 1}",) if i % 10 else ())
        for i in range(runs)
    ]
    started = time.perf_counter()
    decisions = 0
    pending = list(admission.add(members).start)
    decisions += 1
    while pending:
        run = pending.pop()
        admission.started(run)
        decision = admission.progressed(run, state="Succeeded", spent=Decimal("0.01"))
        decisions += 1
        pending.extend(decision.start)
    elapsed = time.perf_counter() - started
    assert admission.status.counts["succeeded"] == runs
    return decisions / elapsed, decisions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--max-active", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.5, help="offline model seconds per call")
    parser.add_argument(
        "--pool", type=int, default=2, help="pre-started run actors per node (the measured phase)"
    )
    parser.add_argument("--admission-runs", type=int, default=2000)
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    args = parser.parse_args()

    phases = [
        _phase("no pool (baseline)", 0, args.runs, args.max_active, args.latency, args.port),
        _phase(f"pool of {args.pool}", args.pool, args.runs, args.max_active, args.latency, args.port),
    ]
    rates = {
        size: admission_rate(size)
        for size in (args.admission_runs // 10, args.admission_runs, args.admission_runs * 5)
    }
    print(
        "| date | cores | server | runs K | maxActive N | latency L | makespan / ideal | run time | start p50 / p99 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for phase in phases:
        print(phase.row(args.runs, args.max_active, args.latency))
    print("\n| group size (runs) | admission decisions | decisions per second |")
    print("| --- | --- | --- |")
    for size, (rate, decisions) in rates.items():
        print(f"| {size} | {decisions} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
