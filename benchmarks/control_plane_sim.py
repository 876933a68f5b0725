"""One control plane with simulated run actors: how many runs a second it can admit, report, finish.

Issue 19, requirement 6. Every real run is a Ray actor in a process of its own, so the process
start (about 0.6 CPU-s) hides what the control plane itself can carry. Here there are no
processes: the real `ControlPlane` facade (`control/plane.py`: its services, its
`RecoveryGate`, its recovery) runs in this process over real local storage, and only its Ray
boundary is simulated (`sim_boundary.py`). Its run-actor launcher starts `SimRunActor`s, which
make the calls a real run actor makes (`runtime/run_actor.py`): ``model_access``,
``run_secrets``, the Running report, per model call ``reserve_credits`` and ``reserve_budget``,
per command ``reserve_budget``, a progress report after the route, after each command and after
the last answer (`Conversation._turn`'s ``on_progress``), then the `RunOutcome`. Its group
launcher gives each group a real `GroupSupervisor` (admission, the executor) in this process.
Every call in either direction copies its arguments and its answer through pickle, as Ray
serializes them; Ray's own per-call machinery (its RPC, the actor's task queue) is not here:
`control_plane_calls.py` measures it on the real actor, and docs/scale.md adds the two.

Phases, each on a control plane of its own over a fresh storage directory:

* ``per-op``: N plain runs moved one kind of call at a time (``--inflight`` at once), so the
  process CPU of each phase is the cost of that call: admit (create + the supervisor's start of
  the actor), the lookups, the Running report, progress reports, reservations, the finish (the
  outcome merged, the actor released), a read (``get_run``). Storage operations and bytes are
  counted per phase. The baseline in the same run: the same run document written with
  ``Storage.write_json`` alone, the floor of any call that persists a run.
* ``plain``: N runs created by ``--clients`` concurrent callers, each run's actor doing its whole
  script at once: runs a second end to end, control plane calls a second.
* ``group``: N runs in one AgentGroup with ``maxActive`` M (batches of 100, sealed): the same,
  through admission.
* ``memory``: what the process holds per run (tracemalloc, and RSS growth): N runs queued in a
  group whose one active run never ends (waiting, no actor), then N plain runs finished.

    .venv/bin/python benchmarks/control_plane_sim.py --runs 2000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import pickle
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim_boundary import (
    PROJECT,
    Script,
    Sim,
    SimRunActor,
    StorageOps,
    group_doc,
    make_sim,
    rss_bytes,
    run_doc,
    run_list,
)

__all__ = ["main"]


async def settle(condition: Callable[[], bool], what: str, timeout: float = 600.0) -> None:
    """Wait for the simulation to reach a state (a benchmark's wait: it naps 1 ms between looks)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        await asyncio.sleep(0.001)


async def each(items: Iterable[Any], call: Callable[[Any], Awaitable[Any]], inflight: int) -> None:
    """``call`` on every item, ``inflight`` at a time (as many actors or clients calling at once)."""
    limit = asyncio.Semaphore(inflight)

    async def one(item: Any) -> None:
        async with limit:
            await call(item)

    await asyncio.gather(*(one(item) for item in items))


@dataclass
class Measure:
    """One phase: how many operations, the wall and process CPU they took, what storage did."""

    label: str
    count: int
    wall: float
    cpu: float
    storage: Counter[str]
    written: int
    calls: int  # calls into the control plane (through its handle)

    def row(self) -> str:
        writes = StorageOps.writes(self.storage)
        reads = sum(self.storage[kind] for kind in ("read_bytes", "exists", "list_dir"))
        return (
            f"| {self.label} | {self.count} | {self.wall:.2f} s | {self.count / self.wall:,.0f} | "
            f"{self.cpu / self.count * 1e6:,.0f} | {writes / self.count:.2f} | "
            f"{self.written / self.count:,.0f} | {reads / self.count:.2f} |"
        )


HEADER = (
    "| operation | count | wall | per second (wall) | CPU us each | storage writes each "
    "| bytes written each | storage reads each |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
)


async def measure(sim: Sim, label: str, count: int, work: Awaitable[Any]) -> Measure:
    gc.collect()
    before, written = sim.ops.snapshot()
    calls = sum(sim.calls.values())
    wall, cpu = time.perf_counter(), time.process_time()
    await work
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after, written_after = sim.ops.snapshot()
    result = Measure(
        label, count, wall, cpu, after - before, written_after - written, sum(sim.calls.values()) - calls
    )
    print(result.row(), flush=True)
    return result


def terminal_count(sim: Sim) -> Callable[[], int]:
    """A live count of the runs that reached a terminal phase (the registry's own signal)."""
    done: set[tuple[str, str]] = set()

    async def changed(key: tuple[str, str]) -> None:
        run = sim.plane.registry.runs.get(key)
        if run is not None and run["status"]["phase"] in ("Succeeded", "Failed", "Cancelled"):
            done.add(key)

    sim.plane.registry.on_run_changed(changed)
    return lambda: len(done)


# -- the phases ------------------------------------------------------------------------------


async def per_op(root: Path, runs: int, inflight: int, commands: int) -> None:
    sim = await make_sim(root, Script(commands, hold=True))
    plane, launcher = sim.plane, sim.run_actors
    finished = terminal_count(sim)
    names = [f"r{i:05d}" for i in range(runs)]
    print(HEADER)

    async def admit() -> None:
        await each(names, lambda name: plane.create_run(PROJECT, run_doc(name)), inflight)
        await settle(lambda: len(launcher.actors) == runs, "every run's actor")
        await asyncio.gather(*(actor.started for actor in launcher.actors.values()))

    await measure(sim, "admit: create + the actor started", runs, admit())
    actors = list(launcher.actors.values())
    await measure(
        sim, "lookups: model_access, run_secrets", 2 * runs, each(actors, SimRunActor.lookups, inflight)
    )
    await measure(sim, "report: Running", runs, each(actors, SimRunActor.running, inflight))

    async def progress(actor: SimRunActor) -> None:
        await actor.progress(0, 0)
        for command in range(commands):
            await actor.progress(command + 1, command + 1)
        await actor.progress(commands, commands + 1)

    await measure(
        sim, "report: progress (turns, cost)", runs * (commands + 2), each(actors, progress, inflight)
    )

    async def reserve(actor: SimRunActor) -> None:
        for _ in range(commands):
            await actor.reserve_model_call()
            await actor.reserve_command()
        await actor.reserve_model_call()

    await measure(
        sim, "reservation: credits or budget", runs * (3 * commands + 2), each(actors, reserve, inflight)
    )

    async def finish() -> None:
        for actor in actors:
            actor.outcome.set_result(actor.succeeded(commands + 1))
        await settle(
            lambda: finished() == runs and not launcher.live, "every run finished, its actor released"
        )

    await measure(sim, "finish: outcome merged, actor released", runs, finish())
    await measure(
        sim, "read: get_run", runs, each(names, lambda name: plane.get_run(PROJECT, name), inflight)
    )
    document = plane.registry.runs[(PROJECT, names[0])]
    storage = sim.storage

    async def floor() -> None:
        await each(
            range(runs),
            lambda i: asyncio.to_thread(storage.write_json, f"bench/floor/{i:05d}.json", document),
            inflight,
        )

    await measure(sim, "baseline: Storage.write_json of the run document", runs, floor())
    stored = storage.read_bytes(f"projects/{PROJECT}/agentruns/{names[0]}/run.json")
    print(
        f"\na finished run's document: {len(stored):,} bytes as stored, {len(pickle.dumps(document)):,} pickled"
    )


async def flow(root: Path, runs: int, commands: int, clients: int, max_active: int | None) -> None:
    """Every run's whole script at once: plain runs (``max_active`` None) or one group's."""
    sim = await make_sim(root, Script(commands))
    plane = sim.plane
    finished = terminal_count(sim)
    if max_active is None:
        label = f"plain runs, {clients} clients creating"
        names = [f"r{i:05d}" for i in range(runs)]

        async def create() -> None:
            await each(names, lambda name: plane.create_run(PROJECT, run_doc(name)), clients)

    else:
        label = f"one group, maxActive {max_active}, batches of 100"
        await plane.apply_group(PROJECT, group_doc("g", max_active), "create")
        names = [f"g-t{i:05d}" for i in range(runs)]

        async def create() -> None:
            batches = [names[i : i + 100] for i in range(0, runs, 100)]
            await each(
                batches,
                lambda batch: plane.create_runs(PROJECT, run_list([run_doc(n, "g") for n in batch])),
                clients,
            )
            await plane.patch_group(PROJECT, "g", {"spec": {"sealed": True}})

    gc.collect()
    before, written = sim.ops.snapshot()
    calls = sum(sim.calls.values())
    wall, cpu = time.perf_counter(), time.process_time()
    created = asyncio.ensure_future(create())
    await created
    created_at = time.perf_counter() - wall
    await settle(lambda: finished() == runs, "every run finished")
    if max_active is not None:
        group = plane.registry.groups[(PROJECT, "g")]
        await settle(lambda: group["status"]["phase"] == "Succeeded", "the group finished")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after, written_after = sim.ops.snapshot()
    storage = after - before
    succeeded = sum(1 for name in names if sim.phase(name) == "Succeeded")
    creates = runs if max_active is None else -(-runs // 100) + 2  # the batches, the group, its seal
    print(
        f"| {label} | {runs} ({succeeded} succeeded) | {wall:.2f} s (all created at {created_at:.2f} s) "
        f"| {runs / wall:,.0f} | {(sum(sim.calls.values()) - calls + creates) / wall:,.0f} "
        f"| {cpu / runs * 1e3:.2f} ms | {StorageOps.writes(storage) / runs:.1f} "
        f"| {(written_after - written) / runs / 1024:.1f} KiB |",
        flush=True,
    )


async def memory(root: Path, runs: int) -> None:
    """Memory the control plane holds per run: queued in a group (waiting, no actor), and finished.

    Python's allocator keeps freed memory for reuse, so RSS moves in steps; the figure is what
    tracemalloc sees allocated and still held, beside the RSS growth.
    """
    sim = await make_sim(root, Script(hold=True))
    plane = sim.plane
    await plane.apply_group(PROJECT, group_doc("q", 1), "create")
    queued_names = [f"q-t{i:05d}" for i in range(runs)]
    plain_names = [f"f{i:05d}" for i in range(runs)]
    finished = terminal_count(sim)

    async def queue() -> None:
        for i in range(0, runs, 100):
            await plane.create_runs(PROJECT, run_list([run_doc(n, "q") for n in queued_names[i : i + 100]]))
        await settle(lambda: len(sim.run_actors.actors) == 1, "the group's one active run")

    async def finish_plain() -> None:
        await each(plain_names, lambda name: plane.create_run(PROJECT, run_doc(name)), 16)
        await settle(lambda: len(sim.run_actors.actors) == runs + 1, "every plain run's actor")
        actors = [actor for actor in sim.run_actors.actors.values() if actor.config.group is None]
        await each(actors, SimRunActor.running, 16)
        for actor in actors:
            actor.outcome.set_result(actor.succeeded(2))
        await settle(lambda: finished() == runs, "every plain run finished")

    print("| runs held | count | tracemalloc: held per run | RSS growth per run |\n| --- | --- | --- | --- |")
    for label, work in (("queued in a group (waiting, no actor)", queue), ("finished (plain)", finish_plain)):
        gc.collect()
        tracemalloc.start()
        rss = rss_bytes()
        await work()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        grown = rss_bytes() - rss
        print(
            f"| {label} | {runs} | {held / runs / 1024:.1f} KiB | {grown / runs / 1024:.1f} KiB |", flush=True
        )
    active = sum(1 for actor in sim.run_actors.actors.values() if actor.config.group == "q")
    print(f"\nthe group's members: {active} started (it never ends), {runs - active} queued throughout")


def _stop_everything_else() -> Awaitable[Any]:
    """The control plane's loops (retention, pool, metrics, supervisors) end with the phase."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    return asyncio.gather(*tasks, return_exceptions=True)


def _phase(coro: Callable[[Path], Awaitable[None]]) -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory(prefix="nodus-cp-sim-") as root:
            try:
                await coro(Path(root))
            finally:
                await _stop_everything_else()

    asyncio.run(scenario())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--commands", type=int, default=1, help="commands per run (model calls: one more)")
    parser.add_argument("--inflight", type=int, default=16, help="per-op: calls in flight at once")
    parser.add_argument("--clients", type=int, default=16, help="plain/group: concurrent creators")
    parser.add_argument("--max-active", type=int, default=50)
    parser.add_argument("--phases", default="per-op,plain,group,memory")
    args = parser.parse_args()
    phases = args.phases.split(",")
    script = Script(args.commands)
    print(
        f"# {args.runs} runs; each {script.calls} calls into the control plane "
        f"({script.reports} reports, {3 * args.commands + 2} reservations, 2 lookups) and its outcome\n"
    )
    if "per-op" in phases:
        print(f"## per operation ({args.inflight} in flight)\n")
        _phase(lambda root: per_op(root, args.runs, args.inflight, args.commands))
    if "plain" in phases or "group" in phases:
        print(
            "\n## end to end\n\n| flow | runs | wall | runs/s (admitted, reported, finished) "
            "| control plane calls/s | CPU per run | storage writes per run | bytes written per run |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |"
        )
    if "plain" in phases:
        _phase(lambda root: flow(root, args.runs, args.commands, args.clients, None))
    if "group" in phases:
        _phase(lambda root: flow(root, args.runs, args.commands, 4, args.max_active))
    if "memory" in phases:
        print("\n## memory\n")
        _phase(lambda root: memory(root, args.runs))


if __name__ == "__main__":
    main()
