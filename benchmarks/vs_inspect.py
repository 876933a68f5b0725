"""The same agent workload on Inspect AI and on nodus, side by side, on this machine.

Issue 19's workload: ``--n`` samples, ``--c`` at once, each two model calls of ``--latency``
seconds and one ``echo`` command, every answer checked. Inspect AI is what people would use
instead for this, so its figures are the bar nodus's overhead is judged against:

* **Inspect AI**: a task of n samples on its ``local`` sandbox, a model API of this script's own
  (mockllm's behaviour with an ``await asyncio.sleep(latency)`` per call: the first call asks
  the ``bash`` tool for ``echo TOKEN``, the second answers with what it printed), scored with
  ``includes()`` against TOKEN; ``max_samples``, ``max_connections``, ``max_sandboxes`` and
  ``max_subprocesses`` all c. It runs in a virtualenv of its own (``--venv``, installed on first
  use, never the project's) as a subprocess, so its imports stay out of this process.
* **nodus**: a service of this script's own (`support.temporary_service`: own HOME, storage, Ray
  head and ports, ``NODUS_OFFLINE_LATENCY`` = latency), one AgentGroup with ``maxActive`` c and
  n runs whose input is ``run: echo TOKEN`` (the offline model runs it, then answers with what
  it printed); each run's answer is read and checked for TOKEN.

Both are measured the same way: wall time of the workload alone (Inspect's ``eval()`` call;
nodus's group from creation to finished, the service already up) and the CPU seconds the whole
machine spent in that window (/proc/stat), so Ray's and the sandboxes' processes count too.
Inspect's CPU is also given net of the idle machine's rate (measured for 10 s before each
Inspect run), because nodus's service idles beside it. The systems alternate ``--repeat`` times. In the same invocation, on the same Ray head, the
script measures the floor of a process per run: a bare detached Ray actor's create, one call and
kill, ``--floor`` times one after another, in CPU seconds each.

    .venv/bin/python benchmarks/vs_inspect.py --n 100 --c 20

It exits non-zero if either system got an answer wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import ray
from process_cpu import ProcessCpu
from support import auth_headers, nodus_up, ray_address, temporary_service, wait_until

V1 = "nodus.dev/v1"
INSPECT_VERSION = "0.3.285"
DEFAULT_VENV = Path.home() / ".cache" / "nodus-bench" / "inspect-ai"
_TICKS = os.sysconf("SC_CLK_TCK")

# Run by the Inspect venv's python with argv: n, c, latency. Prints one JSON line.
_INSPECT_TASK = r'''
import asyncio, json, os, sys, tempfile, time
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import GenerateConfig, ModelAPI, ModelOutput, get_model, modelapi
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash

N, C, LATENCY = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

def busy() -> float:
    values = [int(v) for v in open("/proc/stat").readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")

class SlowMock(ModelAPI):
    """mockllm with a latency: a bash call for the sample's echo, then an answer."""
    async def generate(self, input, tools, tool_choice, config):
        await asyncio.sleep(LATENCY)
        last = input[-1]
        if last.role == "tool":
            return ModelOutput.from_content(model="slowmock", content=f"It printed: {last.text.strip()}")
        token = input[0].text.split("run: echo ", 1)[1].strip()
        return ModelOutput.for_tool_call(model="slowmock", tool_name="bash", tool_arguments={"command": f"echo {token}"})

@modelapi(name="slowmock")
def slowmock():
    return SlowMock

samples = [Sample(input=f"run: echo tok-{i}", target=f"tok-{i}") for i in range(N)]
task = Task(dataset=samples, solver=[use_tools(bash()), generate()], scorer=includes(), sandbox="local")
model = get_model("slowmock/slowmock", config=GenerateConfig(max_connections=C))
with tempfile.TemporaryDirectory() as logs:
    cpu, start = busy(), time.perf_counter()
    (log,) = eval(task, model=model, max_samples=C, max_sandboxes=C, max_subprocesses=C,
                  log_dir=logs, display="none")
    wall, cpu = time.perf_counter() - start, busy() - cpu
    done = log.samples or []  # read before the log directory goes
    right = sum(1 for s in done if s.scores and all(v.value == "C" for v in s.scores.values()))
    calls = sum(len([m for m in s.messages if m.role == "assistant"]) for s in done)
print(json.dumps({"wall": wall, "cpu": cpu, "right": right, "samples": len(done),
                  "status": log.status, "model_calls": calls}))
'''


def busy_cpu_seconds() -> float:
    """CPU seconds the machine has spent outside idle and iowait since boot (every process)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / _TICKS


@dataclass(frozen=True)
class Result:
    system: str
    wall: float
    cpu: float
    right: int
    samples: int
    background: float = 0.0  # what the idle machine (nodus's service up) spends over the same wall

    @property
    def net(self) -> float:
        return self.cpu - self.background

    def row(self, n: int, c: int) -> str:
        net = f" (net of {self.background:.1f} s idle: {self.net:.1f} s)" if self.background else ""
        return (
            f"| {n} / {c} | {self.system} | {self.wall:.1f} s | {self.cpu:.1f} s{net} "
            f"| {self.net / self.samples:.2f} s | {self.right}/{self.samples} |"
        )


def idle_rate(seconds: float) -> float:
    """CPU seconds per second the machine spends with nothing of the workload running: nodus's
    idle service and whoever else shares the machine. Inspect's window is charged net of it, so
    nodus's service idling beside Inspect is not counted as Inspect's (other people's load
    stays in nodus's figures: the comparison leans against nodus, never for it)."""
    cpu = busy_cpu_seconds()
    time.sleep(seconds)
    return (busy_cpu_seconds() - cpu) / seconds


def inspect_python(venv: Path) -> tuple[Path, str]:
    """The Inspect venv's python, installing Inspect AI there first if it is missing: the pinned
    version when pip has it, else the newest pip offers. Returns the python and the version."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('inspect-ai'))"]
    found = subprocess.run(probe, capture_output=True, text=True, check=False) if python.exists() else None
    if found is None or found.returncode != 0:
        print(f"installing Inspect AI into {venv} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        if subprocess.run([*pip, f"inspect-ai=={INSPECT_VERSION}"], check=False).returncode != 0:
            print(f"inspect-ai=={INSPECT_VERSION} not available; the newest instead", file=sys.stderr)
            subprocess.run([*pip, "inspect-ai"], check=True)
        found = subprocess.run(probe, capture_output=True, text=True, check=True)
    return python, found.stdout.strip()


def run_inspect(python: Path, n: int, c: int, latency: float, idle: float) -> Result:
    with tempfile.TemporaryDirectory(prefix="nodus-bench-inspect-") as work:
        script = Path(work) / "task.py"
        script.write_text(_INSPECT_TASK)
        env = {**os.environ, "INSPECT_DISPLAY": "none", "INSPECT_LOG_DIR": work}
        done = subprocess.run(
            [str(python), str(script), str(n), str(c), str(latency)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        sys.exit(f"the Inspect AI task failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if figures["status"] != "success" or figures["model_calls"] != 2 * n:
        print(f"Inspect AI: {figures}", file=sys.stderr)
    wall = figures["wall"]
    return Result("Inspect AI", wall, figures["cpu"], figures["right"], figures["samples"], idle * wall)


def nodus_agent(http: httpx.Client) -> None:
    """The agent, and one warm-up run: a server's first run pays the router's and pool's first starts."""
    spec = {"system": "Run what you are asked to.", "model": {"families": ["haiku"]}}
    agent = {"apiVersion": V1, "kind": "Agent", "metadata": {"name": "bench"}, "spec": spec}
    http.put("/agents/bench", json=agent).raise_for_status()
    warm = {"agent": "bench", "input": "run: echo warm"}
    http.post(
        "/agentruns", json={"apiVersion": V1, "kind": "AgentRun", "metadata": {"name": "warm"}, "spec": warm}
    ).raise_for_status()
    wait_until(
        lambda: http.get("/agentruns/warm").json()["status"]["phase"] == "Succeeded", 300, "the warm-up run"
    )
    time.sleep(2.0)  # the pool refills after the warm-up, as it would between batches


def run_nodus(http: httpx.Client, group: str, n: int, c: int) -> Result:
    cpu, start = busy_cpu_seconds(), time.perf_counter()
    spec = {"agent": "bench", "limits": {"maxActive": c}}
    http.post(
        "/agentgroups",
        json={"apiVersion": V1, "kind": "AgentGroup", "metadata": {"name": group}, "spec": spec},
    ).raise_for_status()
    for first in range(0, n, 100):
        items = [
            {
                "apiVersion": V1,
                "kind": "AgentRun",
                "spec": {"agent": "bench", "group": group, "taskKey": f"t{i}", "input": f"run: echo tok-{i}"},
            }
            for i in range(first, min(first + 100, n))
        ]
        http.post(
            "/agentruns",
            json={"apiVersion": V1, "kind": "AgentRunList", "items": items},
            headers={"Idempotency-Key": f"{group}-{first}"},
        ).raise_for_status()
    http.patch(f"/agentgroups/{group}", json={"spec": {"sealed": True}}).raise_for_status()
    wait_until(
        lambda: http.get(f"/agentgroups/{group}").json()["status"]["phase"] != "Running",
        3600,
        f"group {group}",
        interval=0.5,
    )
    wall, cpu = time.perf_counter() - start, busy_cpu_seconds() - cpu
    # Checked after the window: reading answers back is the check, not the workload.
    runs = http.get("/agentruns", params={"group": group}).json()["items"]
    right = 0
    for run in runs:
        token = run["spec"]["input"].removeprefix("run: echo ")
        answer = http.get(f"/agentruns/{run['metadata']['name']}/answer")
        text = answer.json().get("answer", "") if answer.status_code == 200 else ""
        printed = text.split("printed:", 1)[1] if "printed:" in text else ""  # the command names it too
        right += (
            run["status"]["phase"] == "Succeeded"
            and re.search(rf"\b{re.escape(token)}\b", printed) is not None
        )
    return Result("nodus", wall, cpu, right, len(runs))


@ray.remote(num_cpus=0)
class _Bare:
    def ping(self) -> int:
        return 1


def ray_floor(count: int) -> float:
    """CPU seconds of the whole machine per bare detached actor's create + one call + kill, one
    after another: the least a run on its own Ray worker process can cost."""
    actor = _Bare.options(name="bench-bare-warm", namespace="nodus-bench", lifetime="detached").remote()
    ray.get(actor.ping.remote())
    ray.kill(actor)
    cpu = busy_cpu_seconds()
    for index in range(count):
        name = f"bench-bare-{os.getpid()}-{index}"
        actor = _Bare.options(name=name, namespace="nodus-bench", lifetime="detached").remote()
        ray.get(actor.ping.remote())
        ray.kill(actor)
    return (busy_cpu_seconds() - cpu) / count


def print_where(sampler: ProcessCpu, n: int) -> None:
    """nodus's CPU in the window by process role, per run (`process_cpu`)."""
    print(f"\nwhere nodus's CPU went ({sampler.total():.1f} s sampled, {n} runs):")
    print("| role | processes | CPU | per run |")
    print("| --- | --- | --- | --- |")
    for role, cpu, count in sampler.by_role():
        if cpu >= 0.05:
            print(f"| {role} | {count} | {cpu:.2f} s | {cpu / n * 1000:.0f} ms |")


def report(results: list[Result], floor: float, floor_count: int, args: argparse.Namespace) -> None:
    print(f"\nload before: {args.load_before}; {os.cpu_count()} cores; Inspect AI {args.inspect_version}")
    print("\n| samples / at once | system | wall | machine CPU | CPU per sample | right |")
    print("| --- | --- | --- | --- | --- | --- |")
    for result in results:
        print(result.row(args.n, args.c))
    pairs = list(zip(results[0::2], results[1::2], strict=True))
    print(
        "\n| repeat | wall nodus / Inspect | CPU nodus / Inspect net (raw) | nodus CPU per run / bare actor |"
    )
    print("| --- | --- | --- | --- |")
    for index, (inspect, ours) in enumerate(pairs, 1):
        print(
            f"| {index} | {ours.wall / inspect.wall:.2f}x | {ours.cpu / inspect.net:.2f}x "
            f"({ours.cpu / inspect.cpu:.2f}x) "
            f"| {ours.cpu / ours.samples:.2f} s / {floor:.2f} s = {ours.cpu / ours.samples / floor:.2f}x |"
        )
    print(f"\nbare Ray actor create + call + kill: {floor:.3f} CPU s each ({floor_count}, one after another)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="samples (runs)")
    parser.add_argument("--c", type=int, default=20, help="at once (max_samples / maxActive)")
    parser.add_argument("--latency", type=float, default=2.0, help="model seconds per call")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--floor", type=int, default=20, help="bare actors for the Ray floor")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="Inspect AI's virtualenv")
    parser.add_argument(
        "--where",
        action="store_true",
        help="also sample nodus's processes (every 50 ms, which costs CPU itself) and print its CPU by role",
    )
    args = parser.parse_args()
    args.load_before = Path("/proc/loadavg").read_text().split()[:3]
    python, args.inspect_version = inspect_python(args.venv)

    results: list[Result] = []
    with temporary_service(
        "nodus-bench-vs-inspect-", NODUS_OFFLINE_LATENCY=str(args.latency), NODUS_INITIAL_CREDITS="1000"
    ) as env:
        port = nodus_up(env)
        base = f"http://127.0.0.1:{port}/v1/projects/default"
        with httpx.Client(base_url=base, headers=auth_headers(env), timeout=60) as http:
            nodus_agent(http)
            for repeat in range(args.repeat):
                idle = idle_rate(10.0)
                print(f"idle machine: {idle:.3f} CPU s per second", file=sys.stderr)
                results.append(run_inspect(python, args.n, args.c, args.latency, idle))
                print(results[-1].row(args.n, args.c), file=sys.stderr)
                if args.where:
                    with ProcessCpu(env["NODUS_RAY_TEMP_DIR"]) as sampler:
                        results.append(run_nodus(http, f"g{repeat}", args.n, args.c))
                    print_where(sampler, args.n)
                else:
                    results.append(run_nodus(http, f"g{repeat}", args.n, args.c))
                print(results[-1].row(args.n, args.c), file=sys.stderr)
        ray.init(
            address=ray_address(env), namespace="nodus-bench", logging_level="ERROR", log_to_driver=False
        )
        floor = ray_floor(args.floor)
        ray.shutdown()  # temporary_service's `nodus down` stops this service's head alone
    report(results, floor, args.floor, args)
    wrong = [r for r in results if r.right != r.samples or r.samples != args.n]
    if wrong:
        sys.exit(f"answers wrong or missing: {[(r.system, r.right, r.samples) for r in wrong]}")


if __name__ == "__main__":
    main()
