"""What a run costs beyond Ray itself: N trivial runs beside a bare-Ray baseline, in one process.

A trivial run is one turn on the offline model with no latency and no command ("What is
2 + 2?"): what remains is nodus's own overhead (the API, the control plane, one detached
actor per run, the sandbox directory, the journal writes, the status reports). The baseline
does the least Ray work a run needs: create a detached actor, call it once, kill it. Both
phases run on the same cluster, one after the other, with the same concurrency, and both are
measured the same way: wall time from the first submit to the last completion, each item's
latency, and the CPU seconds the whole machine spent (from /proc/stat, so Ray's own
processes count too).

    python benchmarks/run_overhead.py --runs 20

``--memory K`` also measures what an active run holds: K runs each in a ``sleep`` command at
once, the proportional set size (PSS, /proc/PID/smaps_rollup) of each run actor process while
its command runs, beside K bare actors alive at once (created and called once), each one's PSS.

It starts nodus with `nodus up` on a temporary home, storage and Ray head of its own (or uses
NODUS_API_URL's server, and the Ray at RAY_ADDRESS, when --reuse is given) and prints a Markdown
row for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import ray
from support import NODUS, api_port, ray_address, temporary_service

import nodus

_TICKS = os.sysconf("SC_CLK_TCK")


def _busy_cpu_seconds() -> float:
    """CPU seconds the machine has spent outside idle and iowait since boot."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / _TICKS


@dataclass(frozen=True)
class Phase:
    name: str
    items: int
    wall_seconds: float
    cpu_seconds: float
    latencies: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p95(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _measure(name: str, count: int, concurrency: int, one: callable) -> Phase:  # type: ignore[valid-type]
    cpu_before, started = _busy_cpu_seconds(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        latencies = list(pool.map(lambda i: one(i), range(count)))
    wall = time.perf_counter() - started
    return Phase(name, count, wall, _busy_cpu_seconds() - cpu_before, latencies)


@ray.remote(num_cpus=0)
class _Bare:
    def ping(self) -> int:
        return 1

    def pid(self) -> int:
        return os.getpid()


def _pss_bytes(pid: int) -> int:
    """A process's proportional set size: its private pages plus its share of shared ones."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def _bare_pss(count: int) -> list[int]:
    """Each of ``count`` bare actors' PSS, all alive at once (created, called once)."""
    actors = [
        _Bare.options(
            name=f"bench-mem-{os.getpid()}-{i}", namespace="nodus-bench", lifetime="detached"
        ).remote()
        for i in range(count)
    ]
    pids = ray.get([actor.pid.remote() for actor in actors])
    sizes = [_pss_bytes(pid) for pid in pids]
    for actor in actors:
        ray.kill(actor)
    return sizes


def _actor_pid(actor_name: str) -> int | None:
    """The process of a named actor, from Ray's state API (its title names its method, not it)."""
    from ray.util.state import list_actors

    found = list_actors(filters=[("name", "=", actor_name), ("state", "=", "ALIVE")], detail=True)
    return int(found[0].pid) if found and found[0].pid else None


def _runs_pss(agent: nodus.ClaudeAgent, count: int, tag: str) -> list[int]:
    """Each of ``count`` active runs' actor PSS, measured while every one runs ``sleep``."""
    runs = [agent.submit("run: sleep 30", name=f"bench-mem-{tag}-{i}") for i in range(count)]
    deadline = time.monotonic() + 120
    statuses: list[Any] = []
    while time.monotonic() < deadline:  # every run Running on its actor, past its first step
        statuses = [run.status()["status"] for run in runs]
        if all(s.get("phase") == "Running" and s.get("actorName") and s.get("turns") for s in statuses):
            break
        time.sleep(0.2)
    names = [str(status.get("actorName")) for status in statuses]
    pids = [_actor_pid(name) for name in names]
    sizes = [_pss_bytes(pid) for pid in pids if pid is not None]
    if len(sizes) != count:
        print(f"found {len(sizes)} of {count} run actor processes ({names})", file=sys.stderr)
    for run in runs:
        run.cancel()
    for run in runs:
        try:
            run.wait(timeout=120)
        except nodus.errors.AgentRunFailed:
            pass  # cancelled, as asked
        run.delete()
    return sizes


def _bare_ray(index: int) -> float:
    started = time.perf_counter()
    actor = _Bare.options(
        name=f"bench-bare-{os.getpid()}-{index}", namespace="nodus-bench", lifetime="detached"
    ).remote()
    ray.get(actor.ping.remote())
    ray.kill(actor)
    return time.perf_counter() - started


def _seconds_between(start: str, end: str) -> float:
    parse = lambda text: datetime.fromisoformat(text.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def _nodus_run(agent: nodus.ClaudeAgent, tag: str, server_side: list[float]) -> callable:  # type: ignore[valid-type]
    """Submit, wait, delete; also records the server's own createdAt -> finishedAt, which leaves
    out the client's polling interval."""

    def one(index: int) -> float:
        started = time.perf_counter()
        run = agent.submit("What is 2 + 2?", name=f"bench-{tag}-{index}")
        status = run.wait(timeout=600)
        elapsed = time.perf_counter() - started
        server_side.append(_seconds_between(status.createdAt, status.finishedAt))
        run.delete()
        return elapsed

    return one


def _row(nodus_phase: Phase, bare: Phase, runs: int, concurrency: int, server: Phase) -> str:
    return (
        f"| {time.strftime('%Y-%m-%d')} | {runs} | {concurrency} "
        f"| {nodus_phase.wall_seconds:.1f} s / {bare.wall_seconds:.1f} s = {nodus_phase.wall_seconds / bare.wall_seconds:.2f}x "
        f"| {nodus_phase.cpu_seconds:.1f} s / {bare.cpu_seconds:.1f} s = {nodus_phase.cpu_seconds / bare.cpu_seconds:.2f}x "
        f"| {nodus_phase.p50:.2f} / {nodus_phase.p95:.2f} s | {server.p50:.2f} / {server.p95:.2f} s "
        f"| {bare.p50:.2f} / {bare.p95:.2f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--reuse", action="store_true", help="use the server at NODUS_API_URL on the Ray at RAY_ADDRESS"
    )
    parser.add_argument(
        "--memory", type=int, default=0, help="also compare K active runs' PSS with K bare actors'"
    )
    args = parser.parse_args()

    if args.reuse:
        _bench(args, dict(os.environ))
        return
    with temporary_service("nodus-bench-overhead-", NODUS_OFFLINE_LATENCY="0") as env:
        port = api_port(env)
        subprocess.run([NODUS, "up", "--port", str(port)], env=env, check=True, capture_output=True)
        # The SDK in this process reads the service's URL and its operator token (under HOME).
        os.environ.update(HOME=env["HOME"], NODUS_API_URL=f"http://127.0.0.1:{port}")
        os.environ.pop("NODUS_CREDENTIALS_FILE", None)
        _bench(args, env)


def _bench(args: argparse.Namespace, env: dict[str, str]) -> None:
    ray.init(address=ray_address(env), namespace="nodus-bench", logging_level="ERROR", log_to_driver=False)

    agent = nodus.ClaudeAgent("bench-trivial", system="Answer briefly.", families=["haiku"])
    agent.deploy()
    tag = f"{int(time.time())}"
    # Warm both paths once so neither phase pays for first-import costs the other skipped.
    _nodus_run(agent, f"{tag}-warm", [])(0)
    _bare_ray(-1)

    bare = _measure("bare ray", args.runs, args.concurrency, _bare_ray)
    server_side: list[float] = []
    measured = _measure("nodus", args.runs, args.concurrency, _nodus_run(agent, tag, server_side))
    for phase in (bare, measured):
        print(
            f"{phase.name:>9}: {phase.items} items in {phase.wall_seconds:.2f} s wall, "
            f"{phase.cpu_seconds:.2f} CPU s, p50 {phase.p50:.2f} s, p95 {phase.p95:.2f} s",
            file=sys.stderr,
        )
    server = Phase("server", len(server_side), 0.0, 0.0, server_side)
    print(
        f"   server: createdAt -> finishedAt p50 {server.p50:.2f} s, p95 {server.p95:.2f} s", file=sys.stderr
    )
    print(
        "| date | runs | concurrency | wall: nodus / bare = ratio | CPU: nodus / bare = ratio "
        "| nodus p50 / p95 (client) | nodus p50 / p95 (server) | bare p50 / p95 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(_row(measured, bare, args.runs, args.concurrency, server))
    if args.memory:
        bare_sizes = _bare_pss(args.memory)
        run_sizes = _runs_pss(agent, args.memory, tag)
        mib = lambda sizes: statistics.median(sizes) / 2**20 if sizes else float("nan")  # noqa: E731
        print("\n| date | active at once | run actor PSS (median) | bare actor PSS (median) | ratio |")
        print("| --- | --- | --- | --- | --- |")
        print(
            f"| {time.strftime('%Y-%m-%d')} | {args.memory} | {mib(run_sizes):.1f} MiB ({len(run_sizes)} processes) "
            f"| {mib(bare_sizes):.1f} MiB | {mib(run_sizes) / mib(bare_sizes):.2f}x |"
        )
    ray.shutdown()  # temporary_service's `nodus down` stops the service and its head


if __name__ == "__main__":
    main()
