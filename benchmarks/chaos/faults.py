"""The fault driver: seeded random faults on the campaign's own service, from outside.

Small faults, one every few seconds, on a process found through Ray's state API (the pids of
live actors, by name; a run actor by the ``status.actorName`` of a running run):

* ``SIGKILL`` of a run actor, a group supervisor, an evaluation's grader, the router, the
  control plane or a Serve replica of the API (each is restarted or replaced by Ray, Serve or
  the run supervisor);
* ``SIGSTOP`` of one of them for 1-5 s, then ``SIGCONT`` (Ray does not replace a stopped
  actor: what is checked is that the stall loses and repeats nothing).

Big faults, each once per campaign at a seeded moment:

* a second Ray node joins, takes runs, and is then either killed (its whole process tree,
  SIGKILL) or frozen (SIGSTOP) until Ray declares it dead (about 10 s with the campaign's
  health-check settings; its runs get replacements on the head), then woken (SIGCONT: its actors
  are zombies that must stop at their epoch check) and killed;
* ``ray stop --force`` (this head alone) then ``nodus up``.

Every pid is checked to be a process of this service's head or of the node the driver started
before it is signalled.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from nodus_ray.local_head import HeadPorts

from .service import Service

__all__ = ["FaultDriver"]

TARGETS = ("run actor", "group supervisor", "grader", "router", "control plane", "serve replica")


class _SecondNode:
    """A second Ray node on this machine (`ray start --block`), in a session of its own."""

    def __init__(self, service: Service) -> None:
        ray = str(Path(sys.executable).parent / "ray")
        self.process = subprocess.Popen(
            [ray, "start", "--address", service.env["RAY_ADDRESS"], "--block", "--num-cpus", "1",
             "--disable-usage-stats"],
            env=service.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def signal(self, signum: int) -> None:
        for process in self.tree():
            try:
                process.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    def end(self) -> None:
        if self.process.poll() is None:
            family = self.tree()
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            psutil.wait_procs(family, timeout=30)
            self.process.wait(timeout=30)


class FaultDriver:
    """Injects faults until told to stop; counts them by kind; remembers the last one's time."""

    def __init__(self, service: Service, rng: random.Random, log: Callable[[str], None]) -> None:
        self.service = service
        self.rng = rng
        self.log = log
        self.injected: Counter[str] = Counter()
        self.last_fault = time.monotonic()
        self.node: _SecondNode | None = None
        self.frozen = False
        self._dashboard = f"http://127.0.0.1:{HeadPorts(int(service.env['NODUS_RAY_PORTS'])).dashboard}"

    # -- the loop ----------------------------------------------------------------------------

    def run(self, until: float, stop: threading.Event) -> None:
        start = time.monotonic()
        span = until - start
        big = sorted(
            [
                (start + span * self.rng.uniform(0.05, 0.2), self.second_node),
                (start + span * self.rng.uniform(0.45, 0.65), self.restart_cluster),
            ],
            key=lambda item: item[0],
        )
        stop.wait(self.rng.uniform(2, 4))
        while (time.monotonic() < until or big) and not stop.is_set():
            # Each big fault happens once in every campaign, a short one too (then a little late).
            if big and (time.monotonic() >= big[0][0] or time.monotonic() >= until):
                _, fault = big.pop(0)
                fault(until)
            else:
                self.small()
            stop.wait(self.rng.uniform(2.0, 5.0))
        if self.node is not None:
            self.node.end()

    def small(self) -> None:
        """SIGKILL or SIGSTOP/SIGCONT of one process of the service, chosen at random."""
        # Run actors are where the steps happen: they are picked first three times as often.
        kinds = list(TARGETS)
        self.rng.shuffle(kinds)
        if self.rng.random() < 0.4:
            kinds.remove("run actor")
            kinds.insert(0, "run actor")
        action = self.rng.choice(["SIGKILL", "SIGSTOP"])
        for kind in kinds:
            targets = self._targets(kind)
            if not targets:
                continue
            name, pid = self.rng.choice(sorted(targets))
            if pid not in self._own_pids():
                self.log(f"skipped {kind} {name}: pid {pid} is not this service's")
                continue
            try:
                if action == "SIGKILL":
                    os.kill(pid, signal.SIGKILL)
                else:
                    pause = self.rng.uniform(1.0, 5.0)
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(pause)
                    os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue
            self._record(f"{action} {kind}", name)
            return

    def _targets(self, kind: str) -> list[tuple[str, int]]:
        from ray.util.state import list_actors

        try:
            actors = list_actors(
                address=self._dashboard,
                filters=[("state", "=", "ALIVE")],
                detail=True,
                limit=10000,
                timeout=10,
            )
        except Exception:  # noqa: BLE001 - the state API is down while the head restarts
            return []
        found = [(str(a.name or a.class_name), int(a.pid)) for a in actors if a.pid]
        if kind == "run actor":
            running = self._running_actor_names()
            return [(n, p) for n, p in found if n in running]
        prefix = {
            "group supervisor": "group.",
            "grader": "grader.",
            "router": "nodus-router",
            "control plane": "nodus-control-plane",
        }.get(kind)
        if prefix is not None:
            return [(n, p) for n, p in found if n.startswith(prefix)]
        return [(n, p) for n, p in found if "SERVE_REPLICA" in n and "nodus" in n]

    def _running_actor_names(self) -> set[str]:
        response = self.service.request(
            "GET", "/v1/projects/default/agentruns", params={"phase": "Running"}, patience=5
        )
        if response is None or response.status_code != 200:
            return set()
        items: list[dict[str, Any]] = response.json()["items"]
        return {
            str(r["status"]["actorName"])
            for r in items
            if r["status"].get("phase") == "Running" and r["status"].get("actorName")
        }

    def _own_pids(self) -> set[int]:
        pids = self.service.own_pids()
        if self.node is not None:
            pids |= {p.pid for p in self.node.tree()}
            if self.frozen:  # a frozen node stays frozen until the driver wakes it
                pids -= {p.pid for p in self.node.tree()}
        return pids

    def _record(self, kind: str, target: str) -> None:
        self.injected[kind] += 1
        self.last_fault = time.monotonic()
        self.log(f"fault: {kind} ({target})")

    # -- big faults ----------------------------------------------------------------------------

    def second_node(self, until: float) -> None:
        """A node joins and takes runs, then dies or freezes (a zombie's node) and dies."""
        from ray.util.state import list_nodes

        def alive_other() -> str | None:
            try:
                nodes = list_nodes(address=self._dashboard, detail=True, limit=100, timeout=10)
            except Exception:  # noqa: BLE001
                return None
            head = [n for n in nodes if n.is_head_node]
            others = [n.node_id for n in nodes if n.state == "ALIVE" and not n.is_head_node]
            return others[0] if head and others else None

        self.node = _SecondNode(self.service)
        node_id = _wait(alive_other, 60)
        if node_id is None:
            self.log("the second node did not join; no node fault")
            self.node.end()
            self.node = None
            return
        self._busy(8.0)  # runs land on it
        if self.rng.random() < 0.5:
            self.node.end()
            self._record("second node SIGKILL", node_id[:8])
        else:
            self.node.signal(signal.SIGSTOP)
            self.frozen = True

            def dead() -> bool:
                try:
                    nodes = list_nodes(address=self._dashboard, detail=True, limit=100, timeout=10)
                except Exception:  # noqa: BLE001
                    return False
                return any(n.node_id == node_id and n.state == "DEAD" for n in nodes)

            declared = self._busy(60, dead)
            self.node.signal(signal.SIGCONT)  # its actors wake as zombies
            self.frozen = False
            self._busy(3.0)
            self.node.end()
            self._record(
                "second node SIGSTOP, dead, SIGCONT", f"{node_id[:8]} declared dead: {bool(declared)}"
            )
        self.node = None

    def _busy(self, seconds: float, done: Callable[[], Any] | None = None) -> Any:
        """Small faults while a big one takes its time (``done``: until it says so)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if done is not None and (value := done()):
                return value
            time.sleep(self.rng.uniform(2.0, 4.0))
            self.small()
        return done() if done is not None else None

    def restart_cluster(self, until: float) -> None:
        """`ray stop --force` of this head, then `nodus up`."""
        killed = self.service.kill_head()
        self._record("ray stop --force + nodus up", f"{killed} processes")
        time.sleep(self.rng.uniform(1.0, 3.0))
        self.service.up()
        self.last_fault = time.monotonic()


def _wait(condition: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    return None
