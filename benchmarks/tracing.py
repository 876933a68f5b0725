"""Traces off cost nothing; on, what a run's process pays (decision 57). No Ray.

Three measurements, each beside its baseline in the same run:

* **Imports.** Fresh interpreters, alternating, ``--reps`` each: the run path's modules
  (`runtime.run_actor`, `conversation`, `durable.journal`, the program server) with tracing
  off (``configure(())``, what every run does without an endpoint), against the same with
  tracing on (``configure`` with an endpoint: the SDK, the OTLP/HTTP exporter, a tracer
  provider). CPU is the child's own user+system time; the count of ``opentelemetry`` modules
  it loaded says what "nothing imported" means. Then what the tracing package itself adds to
  the run path, off: its modules' cumulative import time (``python -X importtime``) inside the
  run path's imports, beside the whole run path's.
* **A call, off.** ``with tracing.journal_write(...)`` (what a journal write, a command and a
  model call each make when off) ``--calls`` times, beside the same loop over a bare
  ``contextlib.nullcontext()``; and, for scale, one real local journal append (`Journal.append`
  on a fresh directory: a write and an fdatasync) in the same run.
* **A span, on.** The same ``journal_write`` calls in a child with tracing on, exporting to a
  local OTLP/HTTP receiver (`tests.fakes.otlp_receiver`), the flush included; beside the loop off.

    .venv/bin/python benchmarks/tracing.py
    .venv/bin/python benchmarks/tracing.py --reps 9 --calls 200000 --spans 5000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_RUN_PATH = (
    "import nodus_ray.runtime.run_actor, nodus_ray.runtime.conversation, nodus_ray.durable.journal, "
    "nodus_ray.runtime.program.server, nodus_ray.runtime.program.model_calls"
)
_CHILD = """
import resource, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
{body}
print(cpu(), sum(1 for m in sys.modules if m.startswith("opentelemetry")))
"""
_OFF = _RUN_PATH + "\nfrom nodus_ray import tracing\ntracing.configure(())"
_ON = _OFF + "\ntracing.configure((('OTEL_EXPORTER_OTLP_ENDPOINT', 'http://127.0.0.1:9'),))"

_SPANS = """
import sys, time
from types import SimpleNamespace
from nodus_ray import tracing
n, endpoint = int(sys.argv[1]), sys.argv[2]
on = endpoint != "-"
if on:
    tracing.configure((("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_BSP_MAX_QUEUE_SIZE", str(n + 10))))
began = time.perf_counter()
for i in range(n):
    with tracing.journal_write(i, 1, "turn-1/model-1", "Completed", "log"):
        pass
tracing.flush()
print(time.perf_counter() - began)
"""


def _child(code: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def _imports(body: str) -> tuple[float, int]:
    cpu, modules = _child(_CHILD.format(body=body)).split()
    return float(cpu), int(modules)


def _importtime() -> tuple[float, float]:
    """Seconds: the run path's whole import and, inside it, `nodus_ray.tracing`'s (cumulative)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _RUN_PATH],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    whole = package = 0.0
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = [p.strip() for p in line.split("|")]
        if not parts[1].isdigit():
            continue
        name, cumulative = parts[2], int(parts[1]) / 1e6
        if name == "nodus_ray.tracing":
            package = cumulative
        if not line.split("|")[2].startswith("  "):  # a top-level import
            whole += cumulative
    return whole, package


def _loop(calls: int) -> tuple[float, float]:
    """Seconds per call: `tracing.journal_write` off, and a bare nullcontext."""
    from nodus_ray import tracing

    assert not tracing.enabled()
    null = contextlib.nullcontext()
    began = time.perf_counter()
    for i in range(calls):
        with tracing.journal_write(i, 1, "turn-1/model-1", "Completed", "log"):
            pass
    off = (time.perf_counter() - began) / calls
    began = time.perf_counter()
    for _ in range(calls):
        with null:
            pass
    bare = (time.perf_counter() - began) / calls
    return off, bare


def _append(writes: int) -> float:
    """Seconds per local journal append (a write and an fdatasync)."""
    from nodus_ray.durable.journal import Journal
    from nodus_ray.store.storage import Storage

    with tempfile.TemporaryDirectory(dir="/var/tmp") as folder:
        journal = Journal(Storage(folder), "journal")
        began = time.perf_counter()
        for i in range(writes):
            journal.append(f"turn-1/command-{i}", "command", "Completed", {"exit_code": 0})
        return (time.perf_counter() - began) / writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--spans", type=int, default=5_000)
    args = parser.parse_args()

    off, on, times = [], [], []
    for _ in range(args.reps):  # alternating, so a busy moment hits both sides
        off.append(_imports(_OFF))
        on.append(_imports(_ON))
        times.append(_importtime())
    med = statistics.median
    print("imports of a run's process (CPU s, median of", args.reps, "fresh interpreters; otel modules)")
    print(f"  tracing off : {med(c for c, _ in off):.3f} s   opentelemetry modules: {off[0][1]}")
    print(f"  tracing on  : {med(c for c, _ in on):.3f} s   opentelemetry modules: {on[0][1]}")
    print(f"  on - off    : {med(c for c, _ in on) - med(c for c, _ in off):+.3f} s")
    whole, package = med(w for w, _ in times), med(p for _, p in times)
    print(
        f"  -X importtime, the run path : {whole * 1e3:.0f} ms, of which nodus_ray.tracing {package * 1e3:.1f} ms"
    )

    per_call, bare = _loop(args.calls)
    append = _append(500)
    print(f"a call, off ({args.calls} calls)")
    print(f"  tracing.journal_write off : {per_call * 1e9:.0f} ns")
    print(f"  bare nullcontext          : {bare * 1e9:.0f} ns")
    print(
        f"  a local journal append    : {append * 1e6:.0f} us  (the call off is {per_call / append:.5%} of it)"
    )

    from tests.fakes.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    try:
        span_on = float(_child(_SPANS, str(args.spans), receiver.endpoint)) / args.spans
        span_off = float(_child(_SPANS, str(args.spans), "-")) / args.spans
        received = len(receiver.spans())
    finally:
        receiver.stop()
    print(f"a span, on ({args.spans} spans, exported and flushed; {received} received)")
    print(f"  on  : {span_on * 1e6:.1f} us a span")
    print(f"  off : {span_off * 1e6:.2f} us a call")


if __name__ == "__main__":
    main()
