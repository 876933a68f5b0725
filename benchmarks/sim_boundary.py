"""The simulated Ray boundary of one real control plane, for `control_plane_sim.py`.

The real `ControlPlane` facade (`control/plane.py`) and its services run in this process over
real local storage; only what crosses Ray is simulated. Its run-actor launcher starts
`SimRunActor`s: no process, no program, the calls a real run actor makes
(`runtime/run_actor.py`) in its order. Its group launcher gives each group a real
`GroupSupervisor` in this process. Every call in either direction copies its arguments and
answer through pickle, as Ray serializes them; Ray's own per-call machinery is not here.
`StorageOps` counts what the control plane asks of storage.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nodus_ray.control.plane as plane_module
from nodus.lifecycle import RunPhase
from nodus_ray.control.client import ControlPlaneClient, RideOutRestarts, RunOutcome, RunReport
from nodus_ray.runtime.group_supervisor import GroupSupervisor
from nodus_ray.runtime.run_actor import RunConfig
from nodus_ray.settings import ServerSettings
from nodus_ray.store.storage import Storage

__all__ = [
    "PROJECT",
    "InProcessHandle",
    "Script",
    "Sim",
    "SimRunActor",
    "StorageOps",
    "copied",
    "group_doc",
    "make_sim",
    "rss_bytes",
    "run_doc",
    "run_list",
]

PROJECT = "sim"
STAMP = "2026-12-03T00:00:00Z"


def copied(value: Any) -> Any:
    """What the other side of a Ray call receives: the value serialized and read back."""
    return pickle.loads(pickle.dumps(value, protocol=5))


def rss_bytes() -> int:
    """This process's resident set size, from /proc (the figure `waiting_runs.py` reads too)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class StorageOps:
    """Counts the operations (and bytes written) of one `Storage` instance, by kind.

    Wraps the instance's methods in place, so every caller of that instance is counted
    (`write_json` and `read_json` go through `write_bytes` and `read_bytes`), from any thread.
    """

    KINDS = ("write_bytes", "create_bytes", "read_bytes", "exists", "list_dir", "delete", "delete_tree")
    WRITES = ("write_bytes", "create_bytes", "delete", "delete_tree")

    def __init__(self, storage: Storage) -> None:
        self.counts: Counter[str] = Counter()
        self.written = 0
        self._lock = threading.Lock()
        for kind in self.KINDS:
            setattr(storage, kind, self._wrap(kind, getattr(storage, kind)))

    def _wrap(self, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            with self._lock:
                self.counts[kind] += 1
                if kind in ("write_bytes", "create_bytes"):
                    self.written += len(args[1])
            return original(*args)

        return counted

    def snapshot(self) -> tuple[Counter[str], int]:
        with self._lock:
            return Counter(self.counts), self.written

    @staticmethod
    def writes(counts: Counter[str]) -> int:
        return sum(counts[kind] for kind in StorageOps.WRITES)


# -- the Ray boundary, in process -----------------------------------------------------------


class _Method:
    def __init__(self, target: Any, name: str, calls: Counter[str]) -> None:
        self._fn = getattr(target, name)
        self._name = name
        self._calls = calls

    def remote(self, *args: Any) -> Awaitable[Any]:
        self._calls[self._name] += 1
        return asyncio.ensure_future(self._call(copied(args)))

    async def _call(self, args: tuple[Any, ...]) -> Any:
        return copied(await self._fn(*args))


class InProcessHandle:
    """``handle.method.remote(*args)`` on an object in this process, copied as Ray would."""

    def __init__(self, target: Any, calls: Counter[str]) -> None:
        self._target = target
        self._calls = calls

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._target, name, self._calls)


@dataclass
class Script:
    """What one simulated run does: commands, each between two model calls (issue 19's: 1)."""

    commands: int = 1
    hold: bool = False  # the benchmark moves the run itself (per-op) or it never ends (memory)

    @property
    def reports(self) -> int:  # Running, after the route, after each command, after the answer
        return 3 + self.commands

    @property
    def calls(self) -> int:  # the lookups, the reports, two reservations a model call, one a command
        return 2 + self.reports + 2 * (self.commands + 1) + self.commands


def _turn(tool_calls: int, model_calls: int) -> dict[str, Any]:
    return {
        "index": 0,
        "prompt": "run: echo tok",
        "family": "haiku",
        "model": "claude-haiku-4-5",
        "routing": "jev",
        "inputTokens": 700 * model_calls,
        "outputTokens": 60 * model_calls,
        "toolCalls": tool_calls,
        "costUSD": str(0.001 * model_calls),
        "stopReason": "tool_use",
        "startedAt": STAMP,
    }


def _cost(model_calls: int) -> dict[str, str]:
    usd = f"{0.001 * model_calls:.6f}"
    return {"totalUSD": usd, "modelUSD": usd, "sandboxUSD": "0.000010", "billedUSD": usd}


class SimRunActor:
    """A run actor with no process and no program: it makes the real actor's calls, in order."""

    def __init__(self, config: RunConfig, control: ControlPlaneClient, script: Script) -> None:
        self.config = config
        self.control = control
        self.script = script
        self.started = asyncio.get_running_loop().create_future()
        self.outcome: asyncio.Future[RunOutcome] = asyncio.get_running_loop().create_future()
        self.killed = False

    # What the control plane calls (through an InProcessHandle).
    async def run(self) -> RunOutcome:
        if not self.started.done():
            self.started.set_result(None)
        if self.script.hold:
            return await asyncio.shield(self.outcome)
        await self.lookups()
        await self.running()
        model_calls = 0
        await self.progress(0, 0)  # routed
        for command in range(self.script.commands):
            model_calls += 1
            await self.reserve_model_call()
            await self.reserve_command()
            await self.progress(command + 1, model_calls)
        model_calls += 1
        await self.reserve_model_call()
        await self.progress(self.script.commands, model_calls)
        return self.succeeded(model_calls)

    async def cancel(self) -> None:
        return None

    # The calls, one by one (the per-op phase makes them itself).
    async def lookups(self) -> None:
        await self.control.model_access(self.config.project, self.config.name)
        await self.control.run_secrets(self.config.project, self.config.name)

    async def running(self) -> None:
        sandbox = {"node": "sim", "nodeId": "sim", "workspace": self.config.workspace}
        report = RunReport(
            phase=RunPhase.RUNNING, reason=None, message=None, startedAt=STAMP, sandbox=sandbox
        )
        await self._report(report)

    async def progress(self, tool_calls: int, model_calls: int) -> None:
        sandbox = {"backend": "bubblewrap", "note": None, "workspace": self.config.workspace, "origin": None}
        report = RunReport(turns=[_turn(tool_calls, model_calls)], cost=_cost(model_calls), sandbox=sandbox)
        await self._report(report)

    async def reserve_model_call(self) -> None:
        c = self.config
        await self.control.reserve_credits(c.project, c.name, "0.004", c.attempt)
        await self.control.reserve_budget(c.project, c.name, "0.004", c.attempt)

    async def reserve_command(self) -> None:
        c = self.config
        await self.control.reserve_budget(c.project, c.name, "0.0001", c.attempt)

    def succeeded(self, model_calls: int) -> RunOutcome:
        turn = {**_turn(self.script.commands, model_calls), "stopReason": "end_turn", "finishedAt": STAMP}
        return RunOutcome(
            phase=RunPhase.SUCCEEDED,
            reason="Completed",
            turns=[turn],
            cost=_cost(model_calls),
            answer={"preview": "tok", "bytes": 3},
            finishedAt=STAMP,
        )

    async def _report(self, report: RunReport) -> None:
        report.attempt = self.config.attempt
        await self.control.report(self.config.project, self.config.name, report)


class SimRunActors:
    """The control plane's `RunActorLauncher`: named `SimRunActor`s behind in-process handles."""

    def __init__(self, script: Script, calls: Counter[str]) -> None:
        self.script = script
        self.calls = calls
        self.control: ControlPlaneClient | None = None  # set once the control plane exists
        self.actors: dict[str, SimRunActor] = {}
        self.live: dict[str, InProcessHandle] = {}

    def find(self, name: str) -> Any | None:
        return self.live.get(name)

    def start(self, name: str, config: RunConfig) -> Any:
        if name not in self.live:  # get_if_exists, as Ray's
            assert self.control is not None
            actor = SimRunActor(copied(config), self.control, self.script)
            self.actors[name] = actor
            self.live[name] = InProcessHandle(actor, Counter())
        return self.live[name]

    def kill(self, actor: Any) -> None:
        for name, handle in list(self.live.items()):
            if handle is actor:
                self.live.pop(name)
                self.actors[name].killed = True


class SimGroupSupervisors:
    """The control plane's `GroupSupervisors`: a real `GroupSupervisor` per group, in process."""

    def __init__(self, calls: Counter[str]) -> None:
        self.calls = calls
        self.control: Callable[[], ControlPlaneClient] | None = None
        self.supervisors: dict[tuple[str, str], GroupSupervisor] = {}
        self._handles: dict[tuple[str, str], InProcessHandle] = {}

    def handle(self, key: tuple[str, str]) -> Any:
        if key not in self._handles:
            assert self.control is not None
            supervisor = GroupSupervisor(*key)
            # The seam the supervisor lacks: its client is made in __init__ for Ray's named actor.
            supervisor._control_plane = self.control()  # noqa: SLF001
            self.supervisors[key] = supervisor
            self._handles[key] = InProcessHandle(supervisor, self.calls)
        return self._handles[key]

    def release(self, key: tuple[str, str]) -> None:
        self._handles.pop(key, None)
        supervisor = self.supervisors.pop(key, None)
        executor = getattr(supervisor, "_executor", None)
        if executor is not None:
            executor.cancel()


class NoGraders:
    """The `Graders` of groups that are no evaluations: none is ever asked to grade."""

    def grader(self, key: tuple[str, str]) -> Any:
        raise AssertionError(f"group {key} is no evaluation: nothing to grade")

    def release(self, key: tuple[str, str]) -> None:
        return None


@dataclass
class Sim:
    """A control plane (the real facade) over fresh storage, with its simulated Ray boundary."""

    plane: plane_module.ControlPlane
    run_actors: SimRunActors
    groups: SimGroupSupervisors
    ops: StorageOps
    calls: Counter[str] = field(default_factory=Counter)  # calls into the control plane, by method

    @property
    def storage(self) -> Storage:
        return self.plane.registry.storage

    def client(self) -> ControlPlaneClient:
        handle = InProcessHandle(self.plane, self.calls)
        return ControlPlaneClient(RideOutRestarts(), locate=lambda: handle)

    def phase(self, name: str) -> str:
        return str(self.plane.registry.runs[(PROJECT, name)]["status"]["phase"])


async def make_sim(root: Path, script: Script) -> Sim:
    """The real `ControlPlane` with the simulated launchers in place of Ray's, recovered."""
    settings = ServerSettings(
        storage_uri=str(root / "storage"),
        sandbox_root=str(root / "sandboxes"),
        secret_key_file=str(root / "secret.key"),
        run_pool_per_node=0,
        initial_credits_usd="1000000",
    )
    calls: Counter[str] = Counter()
    run_actors, groups = SimRunActors(script, Counter()), SimGroupSupervisors(Counter())
    plane = plane_module.ControlPlane(
        settings, run_actors=run_actors, group_actors=groups, graders=NoGraders()
    )
    sim = Sim(plane, run_actors, groups, StorageOps(plane.registry.storage), calls)
    run_actors.control = sim.client()
    groups.control = sim.client
    await plane.ready()  # the first call: recovery runs behind the gate
    await plane.apply_agent(
        PROJECT, {"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "w"}, "spec": {}}
    )
    return sim


def run_doc(name: str, group: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"agent": "w", "input": f"run: echo {name}"}
    if group is not None:
        spec.update(group=group, taskKey=name.removeprefix(f"{group}-"))
    return {"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": name}, "spec": spec}


def group_doc(name: str, max_active: int) -> dict[str, Any]:
    spec = {"agent": "w", "limits": {"maxActive": max_active}}
    return {"apiVersion": "nodus.dev/v1", "kind": "AgentGroup", "metadata": {"name": name}, "spec": spec}


def run_list(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "AgentRunList", "items": docs}
