"""The real control plane actor's CPU per call, beside a bare async Ray actor's, on a service's head.

`control_plane_sim.py` runs the control plane's services in one process, so what Ray adds to
every call (its RPC, the actor's task queue, serialization in the actor's own process) is not in
its figures. This measures that part on the real thing: a service of its own (`nodus up`, no run
pool, the offline model at 600 s a call so a run stays Running), and a driver, in a process of
its own, that calls

* a bare async actor's no-op ``report(project, name, patch)``: Ray's floor for one call;
* the control plane's ``get_run`` (a read from memory);
* the control plane's ``report`` with a progress patch on a Running run (merged, ``run.json``
  written);
* the control plane's ``create_runs`` of one run into a group whose one place is held, so the
  run is stored and queued and no actor starts (an admission with no process start),
* and then creates ``--named`` named, detached actors with ``get_if_exists`` as
  `RayRunActors.start` does on the control plane's event loop, timing each blocking call (a
  resource no node has keeps them from starting a process),

``--inflight`` at once, and reads the callee process's CPU time (``/proc``, every thread) before
and after (50 calls first, not counted): CPU per call in the process that serves it.

    .venv/bin/python benchmarks/control_plane_calls.py --calls 2000
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from support import nodus_up, ray_address, temporary_service

__all__ = ["main"]

_PROBE = """
import asyncio, os, time
import psutil, ray
ray.init(address={address!r}, namespace="nodus", logging_level="ERROR", log_to_driver=False)
from nodus_ray.settings import CONTROL_PLANE_NAME
CALLS, INFLIGHT, NAMED, P = {calls}, {inflight}, {named}, "bench"
V1 = "nodus.dev/v1"

@ray.remote(num_cpus=0, max_concurrency=1000)
class Bare:
    def pid(self):
        return os.getpid()
    async def report(self, project, name, patch):
        return None

def cpu(pid):
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system

def cp_pid():
    for process in psutil.process_iter(["cmdline"]):
        if "ray::ControlPlane" in " ".join(process.info["cmdline"] or []):
            return process.pid
    raise SystemExit("no control plane process")

async def measure(label, pid, call, count):
    limit = asyncio.Semaphore(INFLIGHT)
    async def one(i):
        async with limit:
            await call(i)
    await asyncio.gather(*(one(100000 + i) for i in range(min(50, count))))  # warm: not counted
    before, wall = cpu(pid), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    wall, used = time.perf_counter() - wall, cpu(pid) - before
    print(f"| {{label}} | {{count}} | {{wall:.2f}} s | {{count / wall:,.0f}} | {{used / count * 1e6:,.0f}} |", flush=True)

def doc(kind, name, spec):
    return {{"apiVersion": V1, "kind": kind, "metadata": {{"name": name}}, "spec": spec}}

async def main():
    cp = ray.get_actor(CONTROL_PLANE_NAME, namespace="nodus")
    await cp.apply_agent.remote(P, doc("Agent", "w", {{}}))
    await cp.apply_group.remote(P, doc("AgentGroup", "g", {{"agent": "w", "limits": {{"maxActive": 1}}}}))
    await cp.create_run.remote(P, doc("AgentRun", "g-held", {{"agent": "w", "input": "wait", "group": "g", "taskKey": "held"}}))
    await cp.create_run.remote(P, doc("AgentRun", "live", {{"agent": "w", "input": "wait"}}))
    while (await cp.get_run.remote(P, "live"))["status"]["phase"] != "Running":
        await asyncio.sleep(0.2)
    bare = Bare.remote()
    bare_pid, plane_pid = await bare.pid.remote(), cp_pid()
    patch = {{"turns": [{{"index": 0, "prompt": "wait", "family": "haiku", "inputTokens": 700,
              "outputTokens": 60, "toolCalls": 1, "costUSD": "0", "startedAt": "2026-12-03T00:00:00Z"}}],
              "sandbox": {{"backend": "bubblewrap", "note": None, "workspace": "/w", "origin": None}}}}
    print("| call | count | wall | calls/s | callee CPU us each |")
    print("| --- | --- | --- | --- | --- |")
    await measure("bare async actor: no-op report", bare_pid, lambda i: bare.report.remote(P, "live", patch), CALLS)
    await measure("control plane: get_run", plane_pid, lambda i: cp.get_run.remote(P, "live"), CALLS)
    await measure("control plane: report (progress)", plane_pid, lambda i: cp.report.remote(P, "live", patch), CALLS)
    def create(i):
        item = doc("AgentRun", f"g-q{{i:05d}}", {{"agent": "w", "input": "q", "group": "g", "taskKey": f"q{{i:05d}}"}})
        return cp.create_runs.remote(P, {{"apiVersion": V1, "kind": "AgentRunList", "items": [item]}})
    await measure("control plane: create_runs of 1, queued", plane_pid, create, CALLS // 4)
    # What `RayRunActors.start` does on the control plane's loop, synchronously: a named,
    # detached actor created with get_if_exists. A resource no node has keeps each one pending
    # (registered in the GCS, no process started); each is killed after.
    seconds, created = [], []
    for i in range(NAMED):
        start = time.perf_counter()
        created.append(Bare.options(name=f"bench-named-{{i}}", lifetime="detached", get_if_exists=True,
                                    resources={{"nodus_bench_never": 1}}).remote())
        seconds.append(time.perf_counter() - start)
    for handle in created:
        ray.kill(handle, no_restart=True)
    seconds.sort()
    print(f"\\nnamed detached actor created with get_if_exists (the caller blocks), {{NAMED}} of them: "
          f"p50 {{seconds[len(seconds) // 2] * 1e3:.2f}} ms, p99 {{seconds[int(len(seconds) * 0.99)] * 1e3:.2f}} ms")

asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--named", type=int, default=200, help="named actors created (never scheduled)")
    args = parser.parse_args()
    with temporary_service("nodus-cp-calls-", NODUS_RUN_POOL="0", NODUS_OFFLINE_LATENCY="600") as env:
        nodus_up(env)
        probe = _PROBE.format(
            address=ray_address(env), calls=args.calls, inflight=args.inflight, named=args.named
        )
        done = subprocess.run([sys.executable, "-c", probe], env=env, check=False)
        if done.returncode != 0:
            sys.exit(f"the probe failed ({done.returncode})")


if __name__ == "__main__":
    main()
