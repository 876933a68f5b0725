"""Durable Python agents: overhead per step and replay time, beside DBOS and LangGraph.

The same workflow on three durable-execution systems, in the same run on the same machine:
a program of N trivial steps (each returns ``i + 1``), then, for the replay, the same program
stopped after its N steps and resumed by a fresh executor that must return the recorded
results without running the steps again.

* **nodus-ray**: a real service of its own (``nodus up`` on a temporary home, storage and Ray
  head, `support.temporary_service`), the Python SDK, an Agent whose source is a program of
  ``@agent.step`` functions, each run in its bubblewrap sandbox. Wall is the program's own:
  from its entrypoint's start to the end of its steps, which a last step (``elapsed``, in
  every size, so it cancels out) returns as part of the run's result; so the fixed cost of
  a run (actor, sandbox, interpreter) is left out as it is for the in-process baselines, and
  printed apart (``status.startedAt -> finishedAt``). Also the journal's steady state: the
  record times of ``inc-1 .. inc-N`` (``nodus agentrun steps``) over N - 1. Replay: a run
  that parks (``ctx.sleep``) after its N steps; a timer wakes it, a new actor and sandbox run
  the program again from the start, every step returns its journaled result, and ``elapsed``
  (first run in that attempt) says how long the attempt took to get past them. The whole
  wake (``status.wakeAt -> finishedAt``) is printed apart.
* **DBOS** (``dbos``, SQLite system database): ``@DBOS.workflow`` calling a ``@DBOS.step`` N
  times. Replay: a child process runs the workflow and dies (``os._exit``) after the N steps;
  this process recovers it (``DBOS._recover_pending_workflows``, what ``DBOS.launch`` does at
  start), and each step returns its recorded output from the database.
* **LangGraph** with its SQLite checkpointer (``langgraph-checkpoint-sqlite``): a graph whose
  ``inc`` node loops N times, one super-step (and one checkpoint, ``durability="sync"``, so it
  is written before the next step as in the two others) per step. Replay: a child process dies
  in the node after the N steps; this process invokes the graph again on the same
  ``thread_id``, which resumes from the last checkpoint (LangGraph does not run the program
  again: it loads the state, so its replay reads one checkpoint, not N results).

Per step is ``(wall(N) - wall(0)) / N`` everywhere, the median of ``--repeats`` runs of each
size (the 0- and 3-step ones run five times as often: they are short and noisy). DBOS and LangGraph are installed into this interpreter (``python -m pip install``) when
missing. Each baseline runs in a child process of its own (``--baseline NAME``), so their
threads and global state never meet this process's.

    .venv/bin/python benchmarks/python_agents.py
    .venv/bin/python benchmarks/python_agents.py --skip-nodus     # the baselines alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

__all__ = ["main"]

BASELINE_PACKAGES = ("dbos", "langgraph", "langgraph-checkpoint-sqlite")
SIZES = (0, 3, 1000)
REPLAY_SIZES = (0, 1000)
SMALL_REPEATS = 5  # the 0- and 3-step programs run this many times as often as the 1,000-step one

# The nodus program: the Agent's whole source. Its one step is the trivial body of every system.
PROGRAM = '''"""The benchmark's program: N trivial steps, then (when asked) a durable sleep.

`elapsed` is a step too, so it runs once, in the attempt that first reaches it: after a wake,
it measures that attempt from its entrypoint's start, through the replay of every recorded step.
"""

import time

import nodus

agent = nodus.Agent("bench-python-agents")


@agent.step(effect="pure")
def inc(i: int) -> int:
    return i + 1


@agent.step(effect="pure")
def elapsed(began: float) -> float:
    return time.perf_counter() - began


@agent.entrypoint
def main(ctx: nodus.RunContext, input: dict) -> dict:
    began = time.perf_counter()
    acc = 0
    for _ in range(input["steps"]):
        acc = inc(acc)
    if input.get("park"):
        ctx.sleep(input["park"])
    return {"acc": acc, "seconds": elapsed(began)}
'''


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def _sizes(turn: int) -> tuple[int, ...]:
    """The sizes of one round: the small ones every round, the large one every SMALL_REPEATS-th."""
    return SIZES if turn % SMALL_REPEATS == 0 else tuple(n for n in SIZES if n < max(SIZES))


def _per_step(walls: dict[int, float], n: int) -> float:
    return (walls[n] - walls[0]) / n


# -- installing the baselines -------------------------------------------------------------------


def _ensure_baselines() -> dict[str, str]:
    """Install DBOS and LangGraph into this interpreter when missing; return their versions."""
    from importlib import metadata

    missing = []
    for package in BASELINE_PACKAGES:
        try:
            metadata.version(package)
        except metadata.PackageNotFoundError:
            missing.append(package)
    if missing:
        print(f"installing {' '.join(missing)} into {sys.prefix}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *missing], check=True)
    return {package: metadata.version(package) for package in BASELINE_PACKAGES}


def _run_baseline(name: str, workdir: Path, repeats: int) -> dict[str, Any]:
    """One baseline in a child process of its own; it prints its figures as one JSON line."""
    out = subprocess.run(
        [sys.executable, __file__, "--baseline", name, "--workdir", str(workdir), "--repeats", str(repeats)],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if out.returncode != 0:
        sys.exit(f"{name} baseline failed:\n{out.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def _crash_child(name: str, workdir: Path, steps: int, key: str) -> None:
    """A child that runs the workflow and dies after its steps (``BENCH_CRASH``)."""
    env = {**os.environ, "BENCH_CRASH": "1"}
    subprocess.run(
        [sys.executable, __file__, "--baseline", name, "--workdir", str(workdir), "--crash", str(steps), key],
        env=env,
        capture_output=True,
        check=True,
        timeout=600,
    )


# -- DBOS ---------------------------------------------------------------------------------------


def _dbos(workdir: Path, repeats: int, crash: tuple[int, str] | None) -> dict[str, Any]:
    import logging

    from dbos import DBOS, SetWorkflowID

    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(
        config={
            "name": "nodus-bench",
            "system_database_url": f"sqlite:///{workdir / 'dbos.sqlite'}",
            "log_level": "WARNING",
        }
    )

    executed: list[int] = []  # the steps this process ran (a replay must run none)

    @DBOS.step()
    def inc(i: int) -> int:
        executed.append(i)
        return i + 1

    marks: list[float] = []  # when the workflow's body began and ended, in this process

    @DBOS.workflow()
    def program(steps: int) -> int:
        marks.append(time.perf_counter())
        acc = 0
        for _ in range(steps):
            acc = inc(acc)
        if os.environ.get("BENCH_CRASH"):
            os._exit(0)  # the process dies after its steps: what recovery replays
        marks.append(time.perf_counter())
        return acc

    DBOS.launch()
    if crash is not None:
        steps, key = crash
        with SetWorkflowID(key):
            program(steps)
        raise AssertionError("the crash child returned")

    walls: dict[int, list[float]] = {n: [] for n in SIZES}
    for turn in range(repeats * SMALL_REPEATS):
        for n in _sizes(turn):

            def once(n: int = n) -> int:
                with SetWorkflowID(str(uuid.uuid4())):
                    return program(n)

            wall, value = _timed(once)
            assert value == n, (value, n)
            walls[n].append(wall)
    replays: dict[int, list[float]] = {n: [] for n in REPLAY_SIZES}
    recoveries: dict[int, list[float]] = {n: [] for n in REPLAY_SIZES}
    for _ in range(repeats):
        for n in REPLAY_SIZES:
            key = str(uuid.uuid4())
            _crash_child("dbos", workdir, n, key)
            assert DBOS.get_workflow_status(key).status == "PENDING"  # type: ignore[union-attr]
            executed.clear()

            def recover(key: str = key) -> Any:
                (handle,) = [h for h in DBOS._recover_pending_workflows(["local"]) if h.workflow_id == key]
                return handle.get_result()

            wall, value = _timed(recover)
            assert value == n and not executed, (value, n, len(executed))  # recorded, not run again
            # Recovery goes through DBOS's internal queue and a polled result (about 1 s of
            # latency whatever the journal holds); the replay itself is the workflow's own run.
            replays[n].append(marks[-1] - marks[-2])
            recoveries[n].append(wall)
    DBOS.destroy()
    return {
        "walls": {n: _median(v) for n, v in walls.items()},
        "replays": {n: _median(v) for n, v in replays.items()},
    }


# -- LangGraph ----------------------------------------------------------------------------------


class _GraphState(TypedDict):
    """The LangGraph workflow's state (at module level: LangGraph reads the nodes' type hints)."""

    steps: int
    acc: int


def _langgraph(workdir: Path, repeats: int, crash: tuple[int, str] | None) -> dict[str, Any]:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    executed: list[int] = []  # the steps this process ran (a replay must run none)

    def inc(state: _GraphState) -> dict[str, int]:
        executed.append(state["acc"])
        return {"acc": state["acc"] + 1}

    def done(state: _GraphState) -> dict[str, int]:
        if os.environ.get("BENCH_CRASH"):
            os._exit(0)  # the process dies after its steps: what the next invoke resumes
        return {}

    def route(state: _GraphState) -> str:
        return "inc" if state["acc"] < state["steps"] else "done"

    builder = StateGraph(_GraphState)
    builder.add_node("inc", inc)
    builder.add_node("done", done)
    builder.add_conditional_edges(START, route, ["inc", "done"])
    builder.add_conditional_edges("inc", route, ["inc", "done"])
    builder.add_edge("done", END)
    connection = sqlite3.connect(workdir / "langgraph.sqlite", check_same_thread=False)
    graph = builder.compile(checkpointer=SqliteSaver(connection))

    def config(key: str, steps: int) -> Any:
        return {"configurable": {"thread_id": key}, "recursion_limit": steps + 10}

    if crash is not None:
        steps, key = crash
        graph.invoke({"steps": steps, "acc": 0}, config(key, steps), durability="sync")
        raise AssertionError("the crash child returned")

    walls: dict[int, list[float]] = {n: [] for n in SIZES}
    for turn in range(repeats * SMALL_REPEATS):
        for n in _sizes(turn):
            key = str(uuid.uuid4())

            def first(n: int = n, key: str = key) -> Any:
                return graph.invoke({"steps": n, "acc": 0}, config(key, n), durability="sync")

            wall, value = _timed(first)
            assert value["acc"] == n, (value, n)
            walls[n].append(wall)
    replays: dict[int, list[float]] = {n: [] for n in REPLAY_SIZES}
    for _ in range(repeats):
        for n in REPLAY_SIZES:
            key = str(uuid.uuid4())
            _crash_child("langgraph", workdir, n, key)
            executed.clear()

            def resume(n: int = n, key: str = key) -> Any:
                return graph.invoke(None, config(key, n), durability="sync")  # from the last checkpoint

            wall, value = _timed(resume)
            assert value["acc"] == n and not executed, (value, n, len(executed))  # recorded, not run again
            replays[n].append(wall)
    connection.close()
    return {
        "walls": {n: _median(v) for n, v in walls.items()},
        "replays": {n: _median(v) for n, v in replays.items()},
    }


BASELINES: dict[str, Callable[[Path, int, tuple[int, str] | None], dict[str, Any]]] = {
    "dbos": _dbos,
    "langgraph": _langgraph,
}


# -- nodus-ray ----------------------------------------------------------------------------------


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _nodus(repeats: int) -> dict[str, Any]:
    """The workflow on a nodus service of its own, through the SDK; figures from the runs' status."""
    from support import NODUS, api_port, auth_headers, temporary_service, wait_until

    import nodus

    # A short prefix: Ray's socket paths under the temp dir must stay within the 107 bytes of a Unix socket.
    with temporary_service("nodus-bench-py-", NODUS_INITIAL_CREDITS="100") as env:
        port = api_port(env)
        up = subprocess.run(
            [NODUS, "up", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if up.returncode != 0:
            sys.exit(f"nodus up failed: {up.stderr}")
        token = auth_headers(env)["Authorization"].removeprefix("Bearer ")
        client = nodus.Client(f"http://127.0.0.1:{port}", token=token, timeout=120)
        agent = nodus.Agent(
            "bench-python-agents",
            source={"bench_program.py": PROGRAM},
            entrypoint="bench_program:main",
            client=client,
        )
        agent.deploy()

        def status(name: str) -> dict[str, Any]:
            got: dict[str, Any] = client.get("agentruns", name)["status"]
            return got

        def finished(name: str) -> dict[str, Any]:
            def done() -> dict[str, Any] | None:
                now = status(name)
                return now if now.get("phase") in ("Succeeded", "Failed", "Cancelled") else None

            now: dict[str, Any] = wait_until(done, 900, f"run {name} to finish", interval=0.2)
            if now["phase"] != "Succeeded":
                sys.exit(f"run {name} {now['phase']}: {now.get('reason')}: {now.get('message')}")
            return now

        def returned(run: nodus.AgentRun, n: int) -> float:
            value = json.loads(run.result())  # the answer is the return value's JSON
            assert value["acc"] == n, (value, n)
            return float(value["seconds"])

        walls: dict[int, list[float]] = {n: [] for n in SIZES}
        runs: dict[int, list[float]] = {n: [] for n in SIZES}
        steady: dict[int, list[float]] = {n: [] for n in SIZES if n > 1}
        for turn in range(repeats * SMALL_REPEATS):
            for n in _sizes(turn):
                run = agent.submit({"steps": n})
                now = finished(run.name)
                walls[n].append(returned(run, n))
                runs[n].append((_at(now["finishedAt"]) - _at(now["startedAt"])).total_seconds())
                if n in steady:  # the journal's record times of inc-1 .. inc-N
                    marks = [_at(s["finishedAt"]) for s in client.run_steps(run.name) if s["kind"] == "step"]
                    assert len(marks) == n + 1, (len(marks), n)  # inc-1 .. inc-N, elapsed-1
                    steady[n].append((marks[-2] - marks[0]).total_seconds() / (n - 1))
                run.delete()
        replays: dict[int, list[float]] = {n: [] for n in REPLAY_SIZES}
        wakes: dict[int, list[float]] = {n: [] for n in REPLAY_SIZES}
        for _ in range(repeats):
            for n in REPLAY_SIZES:
                run = agent.submit({"steps": n, "park": "5s"})  # past the park's own work
                sleeping = wait_until(
                    lambda name=run.name: (s := status(name)).get("reason") == "Sleeping" and s,
                    900,
                    f"run {run.name} to park",
                    interval=0.1,
                )
                now = finished(run.name)
                replays[n].append(returned(run, n))
                wakes[n].append((_at(now["finishedAt"]) - _at(sleeping["wakeAt"])).total_seconds())
                run.delete()
        return {
            "walls": {n: _median(v) for n, v in walls.items()},
            "runs": {n: _median(v) for n, v in runs.items()},
            "steady": {n: _median(v) for n, v in steady.items()},
            "replays": {n: _median(v) for n, v in replays.items()},
            "wakes": {n: _median(v) for n, v in wakes.items()},
        }


# -- the report ---------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms" if seconds < 0.01 else f"{seconds * 1000:.1f} ms"


def _row(system: str, figures: dict[str, Any], extra: str = "-") -> str:
    walls, replays = figures["walls"], figures["replays"]
    big = max(SIZES)
    net_replay = replays[big] - replays[0]
    return (
        f"| {time.strftime('%Y-%m-%d')} | {system} "
        f"| {' / '.join(_ms(walls[n]) for n in SIZES)} "
        f"| {_ms(_per_step(walls, 3))} | {_ms(_per_step(walls, big))} | {extra} "
        f"| {_ms(replays[big])} / {_ms(replays[0])} | {_ms(net_replay)} ({_ms(net_replay / big)} a step) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each size; the median counts")
    parser.add_argument("--skip-nodus", action="store_true", help="the baselines alone")
    parser.add_argument("--skip-baselines", action="store_true", help="nodus-ray alone")
    parser.add_argument("--baseline", choices=sorted(BASELINES), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--crash", nargs=2, metavar=("STEPS", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.baseline:  # a child process: one baseline, its figures as one JSON line
        crash = (int(args.crash[0]), args.crash[1]) if args.crash else None
        figures = BASELINES[args.baseline](args.workdir, args.repeats, crash)
        print(json.dumps({key: {str(n): v for n, v in value.items()} for key, value in figures.items()}))
        return

    rows: list[str] = []
    if not args.skip_nodus:
        figures = _nodus(args.repeats)
        rows.append(_row("nodus-ray", figures, " / ".join(_ms(v) for v in figures["steady"].values())))
        wakes, big = figures["wakes"], max(REPLAY_SIZES)
        rows.append(  # the wake as a whole: the timer, a new actor and sandbox, the journal's load, the replay
            f"| {time.strftime('%Y-%m-%d')} | nodus-ray, the whole wake (status wakeAt -> finishedAt) "
            f"| - | - | - | - | {_ms(wakes[big])} / {_ms(wakes[0])} | {_ms(wakes[big] - wakes[0])} "
            f"({_ms((wakes[big] - wakes[0]) / big)} a step) |"
        )
        walls = ", ".join(f"{n} steps {_ms(v)}" for n, v in figures["runs"].items())
        print(f"nodus-ray: a whole run, status startedAt -> finishedAt: {walls}", file=sys.stderr)
    if not args.skip_baselines:
        versions = _ensure_baselines()
        labels = {
            "dbos": f"DBOS {versions['dbos']} (SQLite)",
            "langgraph": f"LangGraph {versions['langgraph']} (SqliteSaver, durability=sync)",
        }
        for name in sorted(BASELINES):
            with tempfile.TemporaryDirectory(prefix=f"nodus-bench-{name}-") as workdir:
                raw = _run_baseline(name, Path(workdir), args.repeats)
                figures = {key: {int(n): v for n, v in value.items()} for key, value in raw.items()}
                rows.append(_row(labels[name], figures))
                if "recoveries" in figures:  # DBOS: the whole recovery, its queue and polling included
                    walls = ", ".join(f"{n} steps {_ms(v)}" for n, v in figures["recoveries"].items())
                    print(
                        f"{name}: recovery wall (queue and polled result included): {walls}", file=sys.stderr
                    )
    print(
        "| date | system | wall: 0 / 3 / 1,000 steps | per step, 3-step | per step, 1,000-step "
        "| per step, journal steady state (3 / 1,000) | replay: 1,000 / 0 steps | replay of 1,000 recorded steps |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
