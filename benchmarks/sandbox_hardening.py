"""What the sandbox's hardening costs per command, beside the same sandbox without it.

Five ways to run the same commands, one after the other in this process:

- **plain subprocess**: ``subprocess.run(["sh", "-c", cmd])`` in the workspace, no isolation;
- **bare bubblewrap**: ``bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all
  --die-with-parent sh -c cmd`` (no seccomp, no uid drop, no limits, no cgroup): the floor of
  a command in fresh namespaces;

and three configurations of one `BubblewrapSandbox`:

- **baseline**: bubblewrap's namespaces, mounts, uid drop and limits, with the seccomp filter
  and the disk watch switched off (monkeypatched here, for this measurement only);
- **hardened**: what every run gets (seccomp filter, disk cap watch before, during and after);
- **hardened + egress**: also the egress proxy (an Agent with ``network.allowedHosts``): the
  forwarder starts in the sandbox before each command.

    python benchmarks/sandbox_hardening.py --commands 40

Prints a Markdown table for benchmarks/RESULTS.md: median and p90 wall time per command, and
for the hardened rows the ratio of their median to bare bubblewrap's.

``--stops`` measures instead how long a stopped command takes to come back, which the unit tests
no longer time (they check *what* stopped it): a timeout, a cancel, the output cap, a fork bomb
at the process limit, the disk cap, and a command whose background child holds its output open
(bubblewrap and the process fallback). Each figure is the wall time of one `run` (the timeout's
includes its deadline); the cancel's is from `cancel()` to the command's result.

    python benchmarks/sandbox_hardening.py --stops --commands 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path

from nodus.egress_policy import EgressPolicy
from nodus_ray.egress.proxy import EgressProxy
from nodus_ray.sandbox import BubblewrapSandbox, ProcessSandbox, Sandbox, SandboxLimits, bwrap_available
from nodus_ray.sandbox import bubblewrap as sandbox_bubblewrap
from nodus_ray.sandbox import runner as sandbox_runner
from nodus_ray.sandbox.api import _SANDBOX_PATH

COMMANDS = {
    "true": "true",
    "python3 -c pass": "python3 -c pass",
    "write 1 MiB": "head -c 1048576 /dev/zero > f",
}


class _NoDiskWatch:
    def __init__(self, *_: object, **__: object) -> None:
        self.killed = False
        self.baseline = self.usage = 0

    def measure_baseline(self) -> None: ...

    def start(self, _on_exceeded: object) -> None: ...

    def stop(self) -> None: ...

    def finish(self) -> bool:
        return False


@contextlib.contextmanager
def _no_seccomp() -> Iterator[None]:
    yield None


@contextlib.contextmanager
def _baseline() -> Iterator[None]:
    # Patched where they are looked up: the bubblewrap backend opens the filter, the runner
    # makes the disk watch.
    runner_names = vars(sandbox_runner)
    saved = sandbox_bubblewrap._seccomp_fd, runner_names["DiskWatch"]
    sandbox_bubblewrap._seccomp_fd = _no_seccomp
    runner_names["DiskWatch"] = _NoDiskWatch
    try:
        yield
    finally:
        sandbox_bubblewrap._seccomp_fd, runner_names["DiskWatch"] = saved


def _times(box: BubblewrapSandbox, command: str, count: int) -> list[float]:
    def run() -> tuple[int | None, str]:
        result = box.run(command)
        return result.exit_code, result.output

    return _timed(run, command, count)


def _timed(run: Callable[[], tuple[int | None, str]], command: str, count: int) -> list[float]:
    run()  # warm the page cache for this command
    times = []
    for _ in range(count):
        began = time.perf_counter()
        exit_code, output = run()
        times.append(time.perf_counter() - began)
        if exit_code != 0:
            sys.exit(f"{command!r} failed in the benchmark: {output[:200]}")
    return times


_BARE_BWRAP = [
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--unshare-all",
    "--die-with-parent",
]


def _plain_times(workspace: Path, command: str, count: int, *, bwrap: bool) -> list[float]:
    """``sh -c command`` as a plain subprocess, or under bare bubblewrap, output captured alike,
    with the sandbox's environment (its PATH finds the same ``python3`` as the sandbox's)."""
    workspace.mkdir(exist_ok=True)
    env = {"PATH": _SANDBOX_PATH, "HOME": str(workspace), "LANG": "C.UTF-8", "TERM": "dumb"}
    argv = ["sh", "-c", command]
    if bwrap:
        argv = [
            "bwrap",
            *_BARE_BWRAP,
            "--bind",
            str(workspace),
            str(workspace),
            "--chdir",
            str(workspace),
            *argv,
        ]

    def run() -> tuple[int | None, str]:
        proc = subprocess.run(
            argv,
            cwd=workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return proc.returncode, proc.stdout.decode("utf-8", "replace")

    return _timed(run, command, count)


def _timed_run(box: Sandbox, command: str, **kwargs: float) -> tuple[float, str | None]:
    began = time.perf_counter()
    result = box.run(command, **kwargs)
    return time.perf_counter() - began, result.limit or ("cancelled" if result.cancelled else None)


def _cancelled_after(box: Sandbox) -> float:
    """Seconds from `cancel()` to the command's result, for a command that would run a minute."""
    done: list[float] = []

    def run() -> None:
        box.run("touch started; sleep 60")
        done.append(time.perf_counter())

    worker = threading.Thread(target=run)
    worker.start()
    while not (box.workspace / "started").exists():
        time.sleep(0.01)
    cancelled = time.perf_counter()
    box.cancel()
    worker.join(timeout=60)
    (box.workspace / "started").unlink()
    return done[0] - cancelled


def _stops(root: Path, uid: int | None, count: int) -> None:
    """The ``--stops`` table: median and worst wall time of each way a command is stopped."""
    cases: dict[str, list[float]] = {}

    def measure(
        label: str, expect: str | None, make: Callable[[], Sandbox], command: str, **kw: float
    ) -> None:
        for _ in range(count):
            box = make()
            try:
                seconds, stopped_by = _timed_run(box, command, **kw)
            finally:
                box.delete()
            if stopped_by != expect:
                sys.exit(f"{label}: stopped by {stopped_by!r}, expected {expect!r}")
            cases.setdefault(label, []).append(seconds)

    def bwrap(limits: SandboxLimits | None = None) -> Callable[[], Sandbox]:
        return lambda: BubblewrapSandbox(root / "stops", limits or SandboxLimits(timeout_seconds=30), uid=uid)

    def fallback() -> Sandbox:
        return ProcessSandbox(root / "stops-process", SandboxLimits(timeout_seconds=30), uid=uid)

    measure("timeout 2 s (busy loop)", "timeout", bwrap(), "while true; do :; done", timeout=2)
    measure("timeout 1 s, process fallback", "timeout", fallback, "while true; do :; done", timeout=1)
    measure("output cap 1000 B (`yes`)", "output", bwrap(SandboxLimits(output_bytes=1000)), "yes")
    measure(
        "fork bomb, 64 processes",
        "processes",
        bwrap(SandboxLimits(processes=64, timeout_seconds=3)),
        ":(){ :|:& };:; sleep 30",
    )
    measure(
        "disk cap 8 MiB (paced writer)",
        "disk",
        bwrap(SandboxLimits(disk_bytes=8 << 20)),
        "for i in $(seq 200); do head -c 1M /dev/zero >> fill; sleep 0.01; done",
    )
    measure("background child holds the output", None, bwrap(), "sleep 60 & echo started")
    measure("background child, process fallback", None, fallback, "sleep 60 & echo started")
    for label, make in (("cancel of `sleep 60`", bwrap()), ("cancel, process fallback", fallback)):
        box = make()
        try:
            cases[label] = [_cancelled_after(box) for _ in range(count)]
        finally:
            box.delete()
    print("| date | stopped by | median | worst |\n| --- | --- | --- | --- |")
    for label, times in cases.items():
        print(f"| {date.today()} | {label} | {statistics.median(times):.2f} s | {max(times):.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--commands", type=int, default=40, help="timed commands per configuration and command"
    )
    parser.add_argument("--stops", action="store_true", help="time the ways a command is stopped instead")
    args = parser.parse_args()
    if not bwrap_available():
        sys.exit("bubblewrap is not available here")
    root = Path(tempfile.mkdtemp(prefix="nodus-bench-sandbox-"))
    root.chmod(0o711)
    uid = 310_000 + os.getpid() % 1000 if os.geteuid() == 0 else None
    if args.stops:
        _stops(root, uid, max(1, min(args.commands, 5)))
        return
    rows = []
    with EgressProxy(
        root / "egress.sock", EgressPolicy.from_settings(["example.com"], ""), lambda _: None
    ) as proxy:
        for label, command in COMMANDS.items():
            plain = _plain_times(root / "plain", command, args.commands, bwrap=False)
            bare = _plain_times(root / "bare", command, args.commands, bwrap=True)
            with _baseline():
                base = _times(BubblewrapSandbox(root / "baseline", uid=uid), command, args.commands)
            hardened = _times(BubblewrapSandbox(root / "hardened", uid=uid), command, args.commands)
            egress = _times(
                BubblewrapSandbox(root / "egress", uid=uid, egress_socket=proxy.socket_path),
                command,
                args.commands,
            )
            bare_median = statistics.median(bare)
            for name, times in (
                ("plain subprocess", plain),
                ("bare bubblewrap", bare),
                ("baseline", base),
                ("hardened", hardened),
                ("hardened + egress", egress),
            ):
                median = statistics.median(times)
                ratio = f"{median / bare_median:.2f}x" if name.startswith("hardened") else ""
                rows.append((label, name, median * 1000, sorted(times)[int(0.9 * len(times))] * 1000, ratio))
                print(f"{label} / {name}: median {rows[-1][2]:.1f} ms", file=sys.stderr)
    print("| date | command | sandbox | median | p90 | median / bare bwrap |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, name, median, p90, ratio in rows:
        print(f"| {date.today()} | `{label}` | {name} | {median:.1f} ms | {p90:.1f} ms | {ratio} |")


if __name__ == "__main__":
    main()
