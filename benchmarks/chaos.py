"""A fault campaign: a mixed workload on a service of its own while a seeded driver injects
faults, then a checker that every invariant held (issue 16, requirement 2).

    .venv/bin/python benchmarks/chaos.py --minutes 2 --seed 1 [--storage s3]

It starts its own nodus (`chaos.service`: its own HOME, storage, sandbox root, Ray temp dir and
ports; on S3, a moto server of its own), never a user's service or ``/tmp/ray``, and ends
everything it started. For ``--minutes`` the workload (`chaos.workload`: groups with
dependencies and caps, keep-alive runs and their messages, egress and BYOK runs, an evaluation,
``nodus batch run``, SDK ``agent.map``; every command ticks a counter file) runs beside the
fault driver (`chaos.faults`: SIGKILL and SIGSTOP/SIGCONT of run actors, group supervisors,
the grader, the router, the control plane and Serve replicas; a second node killed or frozen
into a zombie's node; ``ray stop --force`` then ``nodus up``). Then the service comes to rest
(``--settle`` seconds at most after the last fault) and `chaos.checker` reads storage and the
API. It prints a table (`chaos.report`) and exits 1 on any violation, each listed with its run.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter

from chaos.checker import Checker
from chaos.faults import FaultDriver
from chaos.report import table
from chaos.service import own_service
from chaos.workload import Workload

__all__ = ["campaign"]


def _tamper(checker: Checker) -> None:
    """Check the checker: one more tick in a counted run's counter must be found as a repeat."""
    from nodus_ray.sandbox.run_workspaces import workspace_path

    for acked in checker.workload.runs.values():
        path = workspace_path(checker.service.sandbox_root, "default", acked.name, acked.uid) / "counter.txt"
        if path.exists():
            with path.open("a") as counter:
                counter.write("tick\n")
            print(f"tampered: one more tick in {acked.name}'s counter", file=sys.stderr)
            return


def campaign(
    minutes: float, seed: int, storage: str, settle: float, verbose: bool, tamper: bool = False
) -> int:
    started = time.monotonic()

    def log(line: str) -> None:
        if verbose:
            print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    with own_service(storage) as service:
        log(f"service up at {service.api_url} on {storage} storage")
        workload = Workload(service, random.Random(f"workload-{seed}"), log)
        workload.setup()
        driver = FaultDriver(service, random.Random(f"faults-{seed}"), log)
        stop = threading.Event()
        until = time.monotonic() + minutes * 60
        faults = threading.Thread(target=driver.run, args=(until, stop), name="chaos-faults", daemon=True)
        faults.start()
        try:
            workload.run(until, stop)
            faults.join()
        finally:
            stop.set()
            faults.join(timeout=120)
        log("campaign over; waiting for the batch and the map")
        workload.finish(timeout=settle)
        since_fault = time.monotonic() - driver.last_fault
        checker = Checker(service, workload, log)
        checker.settle(max(10.0, settle - since_fault))
        log(f"at rest after {checker.settle_seconds:.0f}s; checking")
        if tamper:
            _tamper(checker)
        checker.check()
        notes = [
            f"seed {seed}, {minutes:g} min on {storage} storage; wall time {time.monotonic() - started:.0f} s "
            f"(at rest {since_fault + checker.settle_seconds:.0f} s after the last fault)",
            f"{len(workload.runs)} runs acknowledged; waiting at rest: "
            f"{dict(sorted(Counter(checker.waiting.values()).items()))}",
            f"resolved by a person (egress/BYOK runs cut mid-step): {checker.resolved or 'none'}",
            f"BYOK calls the fake Claude served: {service.fake.calls}",
        ]
        if service.proxy_404s:
            notes.append(
                f"Serve's proxy answered 404 (no route yet) {service.proxy_404s} times while the app started"
            )
        if service.server_errors:
            notes.append(f"500 answers (retried): {len(service.server_errors)}: {service.server_errors[:3]}")
        print(
            table(
                f"Fault campaign: {minutes:g} min, seed {seed}, {storage}",
                driver.injected,
                workload.ops,
                workload.unanswered,
                checker.violations,
                notes,
            )
        )
        return 1 if checker.violations else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--storage", choices=("local", "s3"), default="local")
    parser.add_argument("--settle", type=float, default=150.0, help="bound (s) after the last fault")
    parser.add_argument("--quiet", action="store_true", help="no progress log on stderr")
    parser.add_argument(
        "--tamper", action="store_true", help="check the checker: add a tick to one counter (must exit 1)"
    )
    args = parser.parse_args()
    sys.exit(campaign(args.minutes, args.seed, args.storage, args.settle, not args.quiet, args.tamper))


if __name__ == "__main__":
    main()
