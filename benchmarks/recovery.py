"""How long a full restart takes to bring back N unfinished runs, beside a restart with none.

The whole service runs on a Ray cluster of its own (a temporary HOME, storage and sandbox root,
``nodus up`` on ``--port``), exactly as a user starts it. Then:

1. **Baseline**: the head killed and ``nodus up`` on empty storage: what any restart costs
   (a Ray head, the control plane, the router, the Serve app, the pool).
2. An AgentGroup of ``--runs`` members (AgentRunList batches of 100) with ``maxActive`` 4, on the
   offline model with a 120 s latency, so that when the cluster is stopped 4 runs are in the
   middle of a model call and the rest are queued: every one of them unfinished.
3. The head killed (every process of the cluster at once, what ``ray stop --force`` does), then
   ``nodus up`` again,
   timed from the start of ``nodus up`` to:
   * **API ready**: ``nodus up`` returned; the control plane has read every resource and the
     API answers;
   * **all listed**: ``GET agentruns`` lists every run in the phase it had before the stop;
   * **resumed**: each run that was running has a new actor (``status.attempts`` 2), which
     replayed its journal and is calling the model again; the group's supervisor was rebuilt
     from its members (its status shows the same counts).

It starts and kills its own Ray head (its own temp dir and ports), never another Ray on the
machine: ``ray stop --force`` would end every Ray process there, so the kill is
`nodus_ray.local_head.stop_head` of this head's session (`support.kill_head`). Run it on an idle
machine all the same: its figures are mostly process starts.

    .venv/bin/python benchmarks/recovery.py --runs 1000
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from support import api_port, auth_headers, kill_head, temporary_service, wait_until

BIN = Path(sys.executable).parent
V1 = "nodus.dev/v1"
RUNS = "/v1/projects/default/agentruns"
ACTIVE = 4


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_until(condition, timeout, what, interval=0.05)


def _run(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stdout}{done.stderr}")
    return time.perf_counter() - started


def _phases(http: httpx.Client) -> dict[str, str]:
    return {run["metadata"]["name"]: run["status"]["phase"] for run in http.get(RUNS).json()["items"]}


def recovery(runs: int, port: int) -> dict[str, float]:
    with temporary_service(
        "nodus-bench-recovery-", NODUS_OFFLINE_LATENCY="120", NODUS_INITIAL_CREDITS="10000"
    ) as env:
        port = port or api_port(env)
        env["NODUS_API_URL"] = f"http://127.0.0.1:{port}"
        return _recover(env, runs, port)


def _recover(env: dict[str, str], runs: int, port: int) -> dict[str, float]:
    up = [str(BIN / "nodus"), "up", "--port", str(port)]
    figures: dict[str, float] = {}
    _run(up, env)
    kill_head(env)
    figures["baseline: nodus up, empty storage"] = _run(up, env)

    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120, headers=auth_headers(env))
    http.put(
        "/v1/projects/default/agents/recovering",
        json={
            "apiVersion": V1,
            "kind": "Agent",
            "metadata": {"name": "recovering"},
            "spec": {"system": "x", "perRunMaxCostUSD": "0.50"},
        },
    ).raise_for_status()
    http.post(
        "/v1/projects/default/agentgroups",
        json={
            "apiVersion": V1,
            "kind": "AgentGroup",
            "metadata": {"name": "many"},
            "spec": {"agent": "recovering", "limits": {"maxActive": ACTIVE}},
        },
    ).raise_for_status()
    created = time.perf_counter()
    for first in range(0, runs, 100):
        items = [
            {
                "apiVersion": V1,
                "kind": "AgentRun",
                "spec": {
                    "agent": "recovering",
                    "group": "many",
                    "taskKey": f"t{i}",
                    "input": "What is 2 + 2?",
                },
            }
            for i in range(first, min(first + 100, runs))
        ]
        http.post(RUNS, json={"apiVersion": V1, "kind": "AgentRunList", "items": items}).raise_for_status()
    figures["creating the runs (batches of 100)"] = time.perf_counter() - created
    _wait(lambda: list(_phases(http).values()).count("Running") == ACTIVE, 300, f"{ACTIVE} running runs")
    before = _phases(http)
    running = sorted(name for name, phase in before.items() if phase == "Running")

    kill_head(env)
    restarted = time.perf_counter()
    _run(up, env)
    figures[f"API ready ({runs} unfinished runs)"] = time.perf_counter() - restarted
    _wait(lambda: _phases(http) == before, 300, "every run listed as before")
    figures["all listed as before"] = time.perf_counter() - restarted

    def resumed() -> bool:
        return all(http.get(f"{RUNS}/{name}").json()["status"]["attempts"] >= 2 for name in running)

    _wait(resumed, 300, "the running runs to have new actors")
    figures["running runs resumed (new actors)"] = time.perf_counter() - restarted
    http.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    args = parser.parse_args()
    figures = recovery(args.runs, args.port)
    print("| date | runs | measure | seconds |\n| --- | --- | --- | --- |")
    for name, seconds in figures.items():
        print(f"| {time.strftime('%Y-%m-%d')} | {args.runs} | {name} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
