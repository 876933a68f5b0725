"""Many runs through one AgentGroup: admission rate, start latency, memory per active run.

One service (``nodus up`` on a temporary home and storage, the offline model at
``--latency`` seconds a call, the run pool on). Two groups run one after the other on it: a
small one (``--baseline-runs``, the baseline) and the big one (``--runs``, default 2000), each
with ``--max-active``, each run answering one arithmetic question. From the server's own
timestamps:

* admission rate: runs admitted per second while the group ran (first to last ``admittedAt``);
* start latency, p50 / p99: a run's admission to its first model call, and its submission
  (``createdAt``) to its first model call, which includes its wait in the queue;
* memory per active run: the proportional set size (PSS) of the run actor processes, sampled
  every second while the group runs, divided by how many there were (psutil).

    .venv/bin/python benchmarks/scale.py --runs 2000 --max-active 20
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
from support import NODUS, api_port, auth_headers, temporary_service, wait_until

BIN = Path(sys.executable).parent
V1 = "nodus.dev/v1"


def _seconds(start: str, end: str) -> float:
    parse = [datetime.fromisoformat(value.replace("Z", "+00:00")) for value in (start, end)]
    return (parse[1] - parse[0]).total_seconds()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _run_actor_pss() -> tuple[int, int]:
    """(run actor processes, their total PSS in bytes) on this machine."""
    count = total = 0
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "RunActor" in cmdline and "__init__" not in cmdline:  # parked pool actors are not active runs
            try:
                total += process.memory_full_info().pss
                count += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return count, total


def _group(http: httpx.Client, name: str, runs: int, max_active: int) -> dict[str, Any]:
    http.post(
        "/agentgroups",
        json={
            "apiVersion": V1,
            "kind": "AgentGroup",
            "metadata": {"name": name},
            "spec": {"agent": "scale", "limits": {"maxActive": max_active}},
        },
    ).raise_for_status()
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            count, pss = _run_actor_pss()
            if count:
                samples.append(pss / count)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.monotonic()
    for first in range(0, runs, 100):
        items = [
            {
                "apiVersion": V1,
                "kind": "AgentRun",
                "spec": {"agent": "scale", "group": name, "taskKey": f"t{i}", "input": f"What is {i} + 1?"},
            }
            for i in range(first, min(first + 100, runs))
        ]
        http.post(
            "/agentruns", json={"apiVersion": V1, "kind": "AgentRunList", "items": items}
        ).raise_for_status()
    http.patch(f"/agentgroups/{name}", json={"spec": {"sealed": True}}).raise_for_status()
    final = wait_until(
        lambda: (g := http.get(f"/agentgroups/{name}").json())["status"]["phase"] != "Running" and g,
        7200,
        f"group {name}",
        interval=1.0,
    )
    wall = time.monotonic() - began
    done.set()
    sampler.join()
    members = http.get("/agentruns", params={"group": name}).json()["items"]
    admitted = sorted(run["status"]["admittedAt"] for run in members)
    from_admission, from_submission = [], []
    for run in members:
        steps = http.get(f"/agentruns/{run['metadata']['name']}/steps").json()["items"]
        model = next(step for step in steps if step["kind"] == "model")
        from_admission.append(_seconds(run["status"]["admittedAt"], model["startedAt"]))
        from_submission.append(_seconds(run["status"]["createdAt"], model["startedAt"]))
    return {
        "runs": runs,
        "phase": final["status"]["phase"],
        "succeeded": final["status"]["counts"]["succeeded"],
        "wall": wall,
        "admission_rate": (len(admitted) - 1) / max(_seconds(admitted[0], admitted[-1]), 1e-9),
        "admit_p50": statistics.median(from_admission),
        "admit_p99": _pct(from_admission, 0.99),
        "submit_p50": statistics.median(from_submission),
        "submit_p99": _pct(from_submission, 0.99),
        "pss": statistics.median(samples) if samples else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--baseline-runs", type=int, default=100)
    parser.add_argument("--max-active", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    args = parser.parse_args()

    results = []
    with temporary_service(
        "nodus-bench-scale-", NODUS_OFFLINE_LATENCY=str(args.latency), NODUS_INITIAL_CREDITS="100000"
    ) as env:
        port = args.port or api_port(env)
        subprocess.run([NODUS, "up", "--port", str(port)], env=env, check=True, capture_output=True)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}/v1/projects/default",
            timeout=120,
            headers=auth_headers(env),
        ) as http:
            http.put(
                "/agents/scale",
                json={
                    "apiVersion": V1,
                    "kind": "Agent",
                    "metadata": {"name": "scale"},
                    "spec": {
                        "system": "Answer briefly.",
                        "perRunMaxCostUSD": "0.01",
                        "model": {"families": ["haiku"]},
                    },
                },
            ).raise_for_status()
            for label, runs in (("baseline", args.baseline_runs), ("scale", args.runs)):
                result = _group(http, f"{label}-group", runs, args.max_active)
                results.append((label, result))
                print(f"{label}: {result}", file=sys.stderr, flush=True)

    print(
        "| date | group | runs (succeeded) | maxActive | wall | admitted/s | admission -> first call p50 / p99 "
        "| submission -> first call p50 / p99 | PSS per active run |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, r in results:
        print(
            f"| {time.strftime('%Y-%m-%d')} | {label} | {r['runs']} ({r['succeeded']}) | {args.max_active} "
            f"| {r['wall']:.0f} s | {r['admission_rate']:.1f} | {r['admit_p50'] * 1000:.0f} / "
            f"{r['admit_p99'] * 1000:.0f} ms | {r['submit_p50']:.1f} / {r['submit_p99']:.1f} s "
            f"| {r['pss'] / 2**20:.0f} MiB |"
        )


if __name__ == "__main__":
    main()
