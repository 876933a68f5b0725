"""How many keep-alive runs can wait for a message on this machine, and what each one costs.

A keep-alive run that answered its turn waits for a message without a process (decision 21):
only its journal, its sandbox directory and its record in the control plane remain. This
starts N keep-alive runs (in waves, so no more than ``--wave`` actors exist at once), waits
until every one waits for a message, and then measures, beside the baseline of idle Ray actors
created the same way in the same run (what a waiting run would cost if it kept its actor):

* live run actors (only the pool's parked ones should remain) and the machine's used memory;
* the control plane's resident memory before and after;
* bytes in storage and in sandbox directories per waiting run;
* that a message still wakes one of them (a new actor replays its journal and answers).

    python benchmarks/waiting_runs.py --runs 1000

It starts nodus with `nodus up` on a temporary home, storage and Ray head of its own and stops
it after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import ray
from support import api_port, auth_headers, ray_address, temporary_service, wait_until

NODUS = str(Path(sys.executable).parent / "nodus")
V1 = "nodus.dev/v1"


def _used_memory_mb() -> float:
    info = {
        line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
    }
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


@ray.remote(num_cpus=0)
class _Idle:
    def ping(self) -> int:
        return 1


def _baseline(count: int) -> float:
    """Used memory per idle detached actor (what a waiting run with an actor would cost)."""
    before = _used_memory_mb()
    actors = [
        _Idle.options(name=f"bench-idle-{i}", namespace="nodus-bench", lifetime="detached").remote()
        for i in range(count)
    ]
    ray.get([actor.ping.remote() for actor in actors])
    time.sleep(2)
    per_actor = (_used_memory_mb() - before) / count
    for actor in actors:
        ray.kill(actor)
    return per_actor


def _wait(condition, timeout: float, what: str):  # type: ignore[no-untyped-def]
    return wait_until(condition, timeout, what, interval=0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--wave", type=int, default=16, help="runs started at once")
    parser.add_argument("--baseline-actors", type=int, default=20)
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    args = parser.parse_args()

    with temporary_service("nodus-bench-waiting-", NODUS_INITIAL_CREDITS="1000") as env:
        _bench(env, args)


def _bench(env: dict[str, str], args: argparse.Namespace) -> None:
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
        sys.exit(f"nodus up failed: {up.stderr}")
    try:
        address = ray_address(env)  # the state API, like ray.init, would otherwise find "auto"
        ray.init(address=address, namespace="nodus-bench", logging_level="ERROR", log_to_driver=False)
        from ray.util.state import list_actors

        per_idle_actor = _baseline(args.baseline_actors)
        time.sleep(10)  # let the killed baseline actors' memory go back before measuring from here
        control_plane = list_actors(
            address=address, filters=[("name", "=", "nodus-control-plane")], detail=True
        )[0]
        cp_before, used_before = _rss_mb(int(control_plane.pid)), _used_memory_mb()
        api = f"http://127.0.0.1:{port}/v1/projects/default"
        started = time.monotonic()
        with httpx.Client(base_url=api, timeout=60, headers=auth_headers(env)) as http:
            http.put(
                "/agents/waiter",
                json={
                    "apiVersion": V1,
                    "kind": "Agent",
                    "metadata": {"name": "waiter"},
                    "spec": {"system": "Answer briefly."},
                },
            ).raise_for_status()
            for first in range(0, args.runs, args.wave):
                names = [f"w-{i}" for i in range(first, min(first + args.wave, args.runs))]
                http.post(
                    "/agentruns",
                    json={
                        "apiVersion": V1,
                        "kind": "AgentRunList",
                        "items": [
                            {
                                "apiVersion": V1,
                                "kind": "AgentRun",
                                "metadata": {"name": name},
                                "spec": {"agent": "waiter", "input": "What is 1 + 1?", "keepAlive": True},
                            }
                            for name in names
                        ],
                    },
                ).raise_for_status()

                def wave_waits(names: list[str] = names) -> bool:
                    runs = http.get("/agentruns", params={"agent": "waiter"}).json()["items"]
                    mine = [r for r in runs if r["metadata"]["name"] in names]
                    return all(r["status"].get("reason") == "AwaitingMessage" for r in mine)

                _wait(wave_waits, 600, f"wave {first}")
                print(
                    f"{first + len(names)} runs waiting after {time.monotonic() - started:.0f} s",
                    file=sys.stderr,
                )
            elapsed = time.monotonic() - started
            time.sleep(3)
            actors = list_actors(
                address=address,
                filters=[("state", "=", "ALIVE"), ("class_name", "=", "RunActor")],
                limit=10000,
                detail=True,
            )
            cp_after, used_after = _rss_mb(int(control_plane.pid)), _used_memory_mb()
            storage = _tree_bytes(Path(env["NODUS_STORAGE"]) / "projects" / "default" / "agentruns")
            sandboxes = _tree_bytes(Path(env["NODUS_SANDBOX_ROOT"]))
            # A message still wakes a waiting run.
            woke = time.monotonic()
            http.post("/agentruns/w-0/messages", json={"payload": "What is 2 + 3?"}).raise_for_status()
            _wait(
                lambda: http.get("/agentruns/w-0").json()["status"]["answer"]["preview"] == "2 + 3 = 5.",
                120,
                "w-0 to answer its message",
            )
            wake_seconds = time.monotonic() - woke
        print(
            "| date | cores | waiting runs | run actors alive | used memory (machine) | control plane RSS "
            "| storage / run | sandbox dir / run | idle Ray actor (baseline) | wake one |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        print(
            f"| {time.strftime('%Y-%m-%d')} | {os.cpu_count()} | {args.runs} (started in {elapsed:.0f} s) "
            f"| {len(actors)} | +{used_after - used_before:.0f} MB "
            f"| {cp_before:.0f} -> {cp_after:.0f} MB | {storage / args.runs / 1024:.1f} KiB "
            f"| {sandboxes / args.runs / 1024:.1f} KiB | {per_idle_actor:.0f} MB each "
            f"(x {args.runs} = {per_idle_actor * args.runs / 1024:.0f} GB) | {wake_seconds:.2f} s |"
        )
    finally:
        ray.shutdown()  # temporary_service's `nodus down` stops the service and its head


if __name__ == "__main__":
    main()
