"""An evaluation group end to end, beside the same batch as plain group runs without grading.

One service (``nodus up`` on a temporary home and storage, the offline model at zero latency,
the run pool on). One Agent. Per repeat, two groups with the same ``maxActive``:

* **evaluation**: an AgentGroup with ``spec.evaluation`` (``nodus/arithmetic-v2@2.0.0``,
  ``--cases`` tasks, seed 42): the service generates the batch, creates the member runs, seals
  the group, and grades every ended run in the group's grader actor;
* **baseline**: the same prompts (the batch regenerated in this process with the installed
  Environment, before the clock starts) as ordinary runs of a plain group, posted as
  ``AgentRunList`` batches of 100, then the group sealed. No grading.

Measured per group, from the client's clock at the group's POST:

* wall: until the group's ``status.phase`` is terminal (polled every 0.2 s);
* runs done: until the last member run ended (the latest run ``finishedAt``, read once the group
  is over, so that the measurement adds no polling load of its own);
* grading tail: the group's ``finishedAt`` minus the last run's ``finishedAt`` (both the
  server's timestamps): what grading adds after the last answer.

Evaluation also reports ``status.evaluation`` (scored, pass rate, the grader's summed seconds)
and, from ``GET .../results``, each case's latency from its run's end to its final record.
Repeats alternate the order (odd repeats evaluation first, even ones baseline first) so that
neither mode always pays the service's warm-up; one plain warm-up run goes first in any case.

Exits non-zero when any evaluation case is not ``Scored`` or any baseline run did not succeed.

    .venv/bin/python benchmarks/evaluation.py --cases 100 --max-active 10 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import httpx
from support import NODUS, api_port, auth_headers, temporary_service, wait_until

V1 = "nodus.dev/v1"
ENVIRONMENT = "nodus/arithmetic-v2@2.0.0"
SEED = 42
AGENT = "bench-eval"
TERMINAL = {"Succeeded", "Failed", "Cancelled"}
RUN_TERMINAL = {"Succeeded", "Failed", "Cancelled"}


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _wait_group(http: httpx.Client, name: str) -> tuple[dict[str, Any], float]:
    """The group once terminal, and the client's epoch time when that was seen."""
    group = wait_until(
        lambda: (g := http.get(f"/agentgroups/{name}").json())["status"]["phase"] in TERMINAL and g,
        3600,
        f"group {name}",
        interval=0.2,
    )
    return group, time.time()


def _timings(
    http: httpx.Client, name: str, began: float, group: dict[str, Any], seen: float
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    runs = http.get("/agentruns", params={"group": name}).json()["items"]
    ended = [_epoch(run["status"]["finishedAt"]) for run in runs if run["status"].get("finishedAt")]
    last_run = max(ended) if ended else float("nan")
    group_end = _epoch(group["status"]["finishedAt"])
    return {
        "wall": seen - began,
        "runs_done": last_run - began,
        "group_end": group_end - began,
        "tail": group_end - last_run,
    }, runs


def _evaluation(http: httpx.Client, name: str, cases: int, max_active: int) -> dict[str, Any]:
    began = time.time()
    http.post(
        "/agentgroups",
        json={
            "apiVersion": V1,
            "kind": "AgentGroup",
            "metadata": {"name": name},
            "spec": {
                "agent": AGENT,
                "limits": {"maxActive": max_active},
                "evaluation": {"environment": ENVIRONMENT, "tasks": cases, "seed": SEED, "timeout": "30m"},
            },
        },
    ).raise_for_status()
    group, seen = _wait_group(http, name)
    timing, runs = _timings(http, name, began, group, seen)
    results = http.get(f"/agentgroups/{name}/results").json()
    ends = {
        run["metadata"]["name"]: _epoch(run["status"]["finishedAt"])
        for run in runs
        if run["status"].get("finishedAt")
    }
    latencies = sorted(
        (
            (_epoch(item["finishedAt"]) - ends[item["run"]], ends[item["run"]] - began, item["taskId"])
            for item in results["items"]
            if item.get("finishedAt") and item["run"] in ends
        ),
        reverse=True,
    )
    to_final = [latency for latency, _, _ in latencies]
    for latency, run_end, task in latencies[:3]:  # the slowest: is it the grader actor's start?
        print(
            f"  {name}: case {task}: run ended at {run_end:.1f} s, final {latency * 1000:.0f} ms later",
            file=sys.stderr,
            flush=True,
        )
    evaluation = group["status"]["evaluation"]
    problems = [
        f"{name}: case {item['taskId']} (run {item['run']}) is {item['state']}: reason={item.get('reason')!r}, "
        f"evidence={item.get('evidence')!r}"
        for item in results["items"]
        if item["state"] != "Scored"
    ]
    if len(results["items"]) != cases:
        problems.append(f"{name}: {len(results['items'])} results for {cases} cases")
    if group["status"]["phase"] != "Succeeded":
        problems.append(f"{name}: group ended {group['status']['phase']}: {group['status'].get('message')!r}")
    return {
        **timing,
        "mode": "evaluation",
        "group": name,
        "phase": group["status"]["phase"],
        "runs": len(runs),
        "succeeded": sum(run["status"]["phase"] == "Succeeded" for run in runs),
        "scored": evaluation["scored"],
        "pass_rate": evaluation["passRate"],
        "grader_seconds": evaluation["grading"]["seconds"],
        "graded": evaluation["grading"]["graded"],
        "to_final_p50": statistics.median(to_final) if to_final else float("nan"),
        "to_final_max": max(to_final) if to_final else float("nan"),
        "problems": problems,
    }


def _baseline(
    http: httpx.Client, name: str, prompts: list[tuple[str, str]], max_active: int
) -> dict[str, Any]:
    began = time.time()
    http.post(
        "/agentgroups",
        json={
            "apiVersion": V1,
            "kind": "AgentGroup",
            "metadata": {"name": name},
            "spec": {"agent": AGENT, "limits": {"maxActive": max_active}},
        },
    ).raise_for_status()
    for first in range(0, len(prompts), 100):
        items = [
            {
                "apiVersion": V1,
                "kind": "AgentRun",
                "spec": {"agent": AGENT, "group": name, "taskKey": key, "input": prompt},
            }
            for key, prompt in prompts[first : first + 100]
        ]
        http.post(
            "/agentruns", json={"apiVersion": V1, "kind": "AgentRunList", "items": items}
        ).raise_for_status()
    http.patch(f"/agentgroups/{name}", json={"spec": {"sealed": True}}).raise_for_status()
    group, seen = _wait_group(http, name)
    timing, runs = _timings(http, name, began, group, seen)
    problems = [
        f"{name}: run {run['metadata']['name']} ({run['spec'].get('taskKey')}) is {run['status']['phase']}: "
        f"reason={run['status'].get('reason')!r}, message={run['status'].get('message')!r}"
        for run in runs
        if run["status"]["phase"] != "Succeeded"
    ]
    if len(runs) != len(prompts):
        problems.append(f"{name}: {len(runs)} runs for {len(prompts)} prompts")
    if group["status"]["phase"] != "Succeeded":
        problems.append(f"{name}: group ended {group['status']['phase']}: {group['status'].get('message')!r}")
    return {
        **timing,
        "mode": "baseline",
        "group": name,
        "phase": group["status"]["phase"],
        "runs": len(runs),
        "succeeded": sum(run["status"]["phase"] == "Succeeded" for run in runs),
        "pass_rate": None,
        "problems": problems,
    }


def _warm_up(http: httpx.Client) -> None:
    """One plain run first: the first run of a server pays the router's and the pool's first starts."""
    http.post(
        "/agentruns",
        json={
            "apiVersion": V1,
            "kind": "AgentRun",
            "metadata": {"name": "warm"},
            "spec": {"agent": AGENT, "input": "What is 1 + 1?"},
        },
    ).raise_for_status()
    wait_until(
        lambda: http.get("/agentruns/warm").json()["status"]["phase"] in RUN_TERMINAL, 600, "the warm-up run"
    )
    time.sleep(2.0)  # let the pool refill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="evaluation tasks (1 to 100)")
    parser.add_argument("--max-active", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1, help="pairs of groups; the order alternates")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args()

    from nodus_ray.environments import resolve

    prompts = [(task.id, task.prompt) for task in resolve(ENVIRONMENT).tasks("test", SEED, args.cases)]
    rows: list[dict[str, Any]] = []
    with temporary_service(
        "nodus-bench-evaluation-", NODUS_OFFLINE_LATENCY="0", NODUS_INITIAL_CREDITS="1000"
    ) as env:
        port = args.port or api_port(env)
        up = subprocess.run(
            [NODUS, "up", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if up.returncode != 0:
            sys.exit(f"nodus up failed ({up.returncode}): {up.stderr}")
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}/v1/projects/default", timeout=120, headers=auth_headers(env)
        ) as http:
            http.put(
                f"/agents/{AGENT}",
                json={
                    "apiVersion": V1,
                    "kind": "Agent",
                    "metadata": {"name": AGENT},
                    "spec": {
                        "system": "Answer in one sentence.",
                        "perRunMaxCostUSD": "0.10",
                        "model": {"access": "Nodus", "families": ["haiku"]},
                    },
                },
            ).raise_for_status()
            _warm_up(http)
            for repeat in range(1, args.repeat + 1):
                order = ("evaluation", "baseline") if repeat % 2 else ("baseline", "evaluation")
                for position, mode in enumerate(order, start=1):
                    if mode == "evaluation":
                        row = _evaluation(http, f"eval-{repeat}", args.cases, args.max_active)
                    else:
                        row = _baseline(http, f"plain-{repeat}", prompts, args.max_active)
                    row.update(repeat=repeat, position=position)
                    rows.append(row)
                    shown = {key: value for key, value in row.items() if key != "problems"}
                    print(f"{mode} (repeat {repeat}, {position} of 2): {shown}", file=sys.stderr, flush=True)
                    for problem in row["problems"]:
                        print(f"  PROBLEM {problem}", file=sys.stderr, flush=True)

    cases = args.cases
    print(
        f"\n{cases} cases, maxActive {args.max_active}, offline model at zero latency, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')}\n"
    )
    print(
        "| repeat (order) | mode | cases (succeeded runs) | wall | s/case | runs done | grading tail "
        "| scored | pass rate | grader s (sum) | run end -> case final p50 / max |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        scored = pass_rate = grader = to_final = "-"
        if row["mode"] == "evaluation":
            scored = str(row["scored"])
            pass_rate = "-" if row["pass_rate"] is None else f"{row['pass_rate']:.2f}"
            grader = f"{row['grader_seconds']:.2f} s"
            to_final = f"{row['to_final_p50'] * 1000:.0f} / {row['to_final_max'] * 1000:.0f} ms"
        print(
            f"| {row['repeat']} ({row['position']} of 2) | {row['mode']} | {row['runs']} ({row['succeeded']}) "
            f"| {row['wall']:.1f} s | {row['wall'] / cases:.3f} s | {row['runs_done']:.1f} s "
            f"| {row['tail']:.2f} s | {scored} | {pass_rate} | {grader} | {to_final} |"
        )
    walls = {
        mode: [row["wall"] for row in rows if row["mode"] == mode] for mode in ("evaluation", "baseline")
    }
    mean_eval, mean_base = statistics.mean(walls["evaluation"]), statistics.mean(walls["baseline"])
    print(
        f"\nmean wall: evaluation {mean_eval:.1f} s, baseline {mean_base:.1f} s over {args.repeat} repeat(s); "
        f"evaluation - baseline = {mean_eval - mean_base:+.1f} s, {(mean_eval - mean_base) / cases * 1000:+.0f} ms "
        f"per case ({mean_eval / mean_base:.2f}x)"
    )
    for repeat in range(1, args.repeat + 1):
        pair = {row["mode"]: row["wall"] for row in rows if row["repeat"] == repeat}
        print(f"repeat {repeat}: {(pair['evaluation'] - pair['baseline']) / cases * 1000:+.0f} ms per case")

    problems = [problem for row in rows for problem in row["problems"]]
    if problems:
        print("\nFAILED: the measurement includes failures:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
