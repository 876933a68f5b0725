"""What the sandbox's hardening costs per command, beside the same sandbox without it.

Three configurations of one `BubblewrapSandbox`, run one after the other in this process, each
for the same commands:

- **baseline**: bubblewrap's namespaces, mounts, uid drop and limits, with the seccomp filter
  and the disk watch switched off (monkeypatched here, for this measurement only);
- **hardened**: what every run gets (seccomp filter, disk cap watch before, during and after);
- **hardened + egress**: also the egress proxy (an Agent with ``network.allowedHosts``): the
  forwarder starts in the sandbox before each command.

    python benchmarks/sandbox_hardening.py --commands 40

Prints a Markdown table for benchmarks/RESULTS.md: median and p90 wall time per command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

from nodus.egress_policy import EgressPolicy
from nodus_ray.egress.proxy import EgressProxy
from nodus_ray.sandbox import BubblewrapSandbox, bwrap_available
from nodus_ray.sandbox import bubblewrap as sandbox_bubblewrap
from nodus_ray.sandbox import runner as sandbox_runner

COMMANDS = {
    "true": "true",
    "python3 -c pass": "python3 -c pass",
    "write 1 MiB": "head -c 1048576 /dev/zero > f",
}


class _NoDiskWatch:
    def __init__(self, *_: object, **__: object) -> None:
        self.killed = False

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
    saved = sandbox_bubblewrap._seccomp_fd, sandbox_runner.DiskWatch
    sandbox_bubblewrap._seccomp_fd, sandbox_runner.DiskWatch = _no_seccomp, _NoDiskWatch  # type: ignore[assignment]
    try:
        yield
    finally:
        sandbox_bubblewrap._seccomp_fd, sandbox_runner.DiskWatch = saved


def _times(box: BubblewrapSandbox, command: str, count: int) -> list[float]:
    box.run(command)  # warm the page cache for this command
    times = []
    for _ in range(count):
        began = time.perf_counter()
        result = box.run(command)
        times.append(time.perf_counter() - began)
        if result.exit_code != 0:
            sys.exit(f"{command!r} failed in the benchmark: {result.output[:200]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--commands", type=int, default=40, help="timed commands per configuration and command"
    )
    args = parser.parse_args()
    if not bwrap_available():
        sys.exit("bubblewrap is not available here")
    root = Path(tempfile.mkdtemp(prefix="nodus-bench-sandbox-"))
    root.chmod(0o711)
    uid = 310_000 + os.getpid() % 1000 if os.geteuid() == 0 else None
    rows = []
    with EgressProxy(
        root / "egress.sock", EgressPolicy.from_settings(["example.com"], ""), lambda _: None
    ) as proxy:
        for label, command in COMMANDS.items():
            with _baseline():
                base = _times(BubblewrapSandbox(root / "baseline", uid=uid), command, args.commands)
            hardened = _times(BubblewrapSandbox(root / "hardened", uid=uid), command, args.commands)
            egress = _times(
                BubblewrapSandbox(root / "egress", uid=uid, egress_socket=proxy.socket_path),
                command,
                args.commands,
            )
            for name, times in (("baseline", base), ("hardened", hardened), ("hardened + egress", egress)):
                rows.append(
                    (
                        label,
                        name,
                        statistics.median(times) * 1000,
                        sorted(times)[int(0.9 * len(times))] * 1000,
                    )
                )
                print(f"{label} / {name}: median {rows[-1][2]:.1f} ms", file=sys.stderr)
    print("| date | command | sandbox | median | p90 |\n| --- | --- | --- | --- | --- |")
    for label, name, median, p90 in rows:
        print(f"| {date.today()} | `{label}` | {name} | {median:.1f} ms | {p90:.1f} ms |")


if __name__ == "__main__":
    main()
