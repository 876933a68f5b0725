"""The control plane's services without Ray: real storage and registry, fake actor launchers.

`Plane` composes the services exactly as the actor does (`control.services.compose`) over a
local `Storage` on a temp dir; only what would start Ray actors is fake: run actors (whose
``run`` answers when a test says so), group supervisors (which accept every member unless told
to refuse) and graders. `Plane.restart` is a control plane restarted by Ray: new services over
the same storage, recovered, while the old actors live on in the same launchers.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from ray.exceptions import RayActorError

from nodus_ray.control.client import RunOutcome
from nodus_ray.control.services import Services, compose
from nodus_ray.core.admission import AdmissionError
from nodus_ray.runtime.run_actor import RunConfig
from nodus_ray.settings import ServerSettings
from nodus_ray.store.storage import Storage

__all__ = [
    "FakeRunActor",
    "FakeRunActors",
    "FakeGroupSupervisor",
    "FakeGroupSupervisors",
    "FakeGraders",
    "Plane",
    "make_plane",
    "agent_doc",
    "run_doc",
    "group_doc",
    "until",
]

T = TypeVar("T")


class _Remote:
    """``method.remote(*args)`` as a Ray handle's method: an awaitable of the call."""

    def __init__(self, call: Callable[..., Awaitable[Any]]) -> None:
        self._call = call
        self.calls = 0  # how often it was called (a test waits for a call it expects)

    def remote(self, *args: Any) -> Awaitable[Any]:
        self.calls += 1
        return asyncio.ensure_future(self._call(*args))


Report = Callable[[str, str, dict[str, Any]], Awaitable[None]]


class FakeRunActor:
    """A run actor whose program ends with whatever the test gives `end` (or dies by `die`).

    Like the real one it reports Running to the control plane before its program starts, so an
    outcome always follows the phase the lifecycle expects.
    """

    def __init__(self, name: str, config: RunConfig, report: Report | None = None) -> None:
        self.name = name
        self.config = config
        self._report = report
        self.cancelled = False
        self.killed = False
        self._outcome: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.run = _Remote(self._run)
        self.cancel = _Remote(self._cancel)

    async def _run(self) -> RunOutcome:
        if self._report is not None:
            patch = {"phase": "Running", "reason": None, "message": None, "startedAt": "2026-12-01T00:00:00Z"}
            await self._report(self.config.project, self.config.name, patch)
        # What crosses from the actor is a RunOutcome, as from the real one: a test's outcome
        # that is not one fails here.
        return RunOutcome(**await asyncio.shield(self._outcome))

    async def _cancel(self) -> None:
        self.cancelled = True

    def end(self, outcome: dict[str, Any]) -> None:
        if not self._outcome.done():
            self._outcome.set_result(outcome)

    def die(self) -> None:
        self.killed = True
        if not self._outcome.done():
            self._outcome.set_exception(RayActorError())
            self._outcome.exception()  # retrieved: an actor nobody awaited dies quietly


class FakeRunActors:
    """The `RunActorLauncher` of the tests: named actors that live until killed."""

    def __init__(self) -> None:
        self.started: list[FakeRunActor] = []
        self.live: dict[str, FakeRunActor] = {}
        self.kills: list[str] = []  # every kill's actor name, in order (an actor may be killed twice)
        self.report: Report | None = None  # the control plane's `report`, set once it is composed

    def find(self, name: str) -> Any | None:
        return self.live.get(name)

    def start(self, name: str, config: RunConfig) -> Any:
        actor = self.live.get(name)
        if actor is None:  # get_if_exists, as Ray's
            actor = FakeRunActor(name, config, self.report)
            self.started.append(actor)
            self.live[name] = actor
        return actor

    def kill(self, actor: Any) -> None:
        assert isinstance(actor, FakeRunActor)
        self.kills.append(actor.name)
        self.live.pop(actor.name, None)
        actor.die()

    def of(self, run: str) -> list[FakeRunActor]:
        """Every actor started for the run, in order."""
        return [actor for actor in self.started if actor.config.name == run]


@dataclass
class FakeGroupSupervisor:
    """Takes every member (unless `refusal` is set) and answers a Running status."""

    key: tuple[str, str]
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    refusal: AdmissionError | None = None
    status: dict[str, Any] = field(default_factory=lambda: {"phase": "Running"})

    def __post_init__(self) -> None:
        for method in ("load", "check", "add", "progressed", "reconcile", "configure", "budget"):
            setattr(self, method, _Remote(self._answer(method)))

    def _answer(self, method: str) -> Callable[..., Awaitable[Any]]:
        async def answer(*args: Any) -> Any:
            self.calls.append((method, args))
            if method == "check" and self.refusal is not None:
                raise self.refusal
            return None if method in ("check", "progressed") else dict(self.status)

        return answer

    def called(self, method: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == method]


class FakeGroupSupervisors:
    """The `GroupSupervisors` of the tests: one fake per group, kept after release (to inspect)."""

    def __init__(self) -> None:
        self.supervisors: dict[tuple[str, str], FakeGroupSupervisor] = {}
        self.released: list[tuple[str, str]] = []

    def handle(self, key: tuple[str, str]) -> Any:
        return self.supervisors.setdefault(key, FakeGroupSupervisor(key))

    def release(self, key: tuple[str, str]) -> None:
        self.released.append(key)


class FakeGraders:
    """Graders that score every answer 1.0 (a test may replace `outcome`)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.released: list[tuple[str, str]] = []
        self.outcome: dict[str, Any] = {
            "outcome": "scored",
            "verdict": "pass",
            "reward": 1.0,
            "evidence": "ok",
            "seconds": 0.1,
        }
        self.grade = _Remote(self._grade)

    async def _grade(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        return dict(self.outcome)

    def grader(self, key: tuple[str, str]) -> Any:
        return self

    def release(self, key: tuple[str, str]) -> None:
        self.released.append(key)


@dataclass
class Plane:
    """One control plane's services and the fakes at its Ray boundary."""

    settings: ServerSettings
    services: Services
    run_actors: FakeRunActors
    group_actors: FakeGroupSupervisors
    graders: FakeGraders

    @property
    def storage(self) -> Storage:
        return self.services.registry.storage

    def phase(self, run: str, project: str = "demo") -> str | None:
        """The run's phase as the registry holds it now (None while there is no such run)."""
        found = self.services.registry.runs.get((project, run))
        return None if found is None else str(found["status"]["phase"])

    def stored_phase(self, run: str, project: str = "demo") -> str | None:
        """The run's phase as storage holds it (what a restarted control plane would read back)."""
        path = f"projects/{project}/agentruns/{run}/run.json"
        return str(self.storage.read_json(path)["status"]["phase"]) if self.storage.exists(path) else None

    async def restart(self) -> Plane:
        """A restarted control plane: new services over the same storage, recovered; actors live on."""
        services = compose(
            self.settings, run_actors=self.run_actors, group_actors=self.group_actors, graders=self.graders
        )
        self.run_actors.report = services.runs.report
        await services.recover()
        return replace(self, services=services)


async def make_plane(tmp_path: Path, **overrides: Any) -> Plane:
    """A recovered control plane over ``tmp_path`` (storage, sandboxes, the secret key)."""
    settings = ServerSettings(
        storage_uri=str(tmp_path / "storage"),
        sandbox_root=str(tmp_path / "sandboxes"),
        secret_key_file=str(tmp_path / "secret.key"),
        run_pool_per_node=0,
        **overrides,
    )
    run_actors, group_actors, graders = FakeRunActors(), FakeGroupSupervisors(), FakeGraders()
    services = compose(settings, run_actors=run_actors, group_actors=group_actors, graders=graders)
    run_actors.report = services.runs.report
    await services.recover()
    return Plane(settings, services, run_actors, group_actors, graders)


async def until(condition: Callable[[], T | Awaitable[T]], *, timeout: float = 10.0, what: str) -> T:
    """Wait until ``condition()`` (called, and awaited when it gives an awaitable) is truthy; return it.

    The services move runs on in tasks of their own (supervision, timers, storage threads), so a
    test waits for the state it is about to assert or use, never for an amount of time: between
    polls it only yields to the loop (then, after a while, naps a millisecond so storage threads
    get the CPU). After ``timeout`` seconds it fails naming ``what`` it waited for.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    polls = 0
    while True:
        value = condition()
        result: T = await value if inspect.isawaitable(value) else value
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}; last saw {result!r}")
        polls += 1
        await asyncio.sleep(0 if polls < 100 else 0.001)


def agent_doc(name: str = "helper", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": name}, "spec": spec}


def run_doc(name: str, agent: str = "helper", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"agent": agent, "input": "hello", **spec},
    }


def group_doc(name: str, agent: str = "helper", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentGroup",
        "metadata": {"name": name},
        "spec": {"agent": agent, **spec},
    }
