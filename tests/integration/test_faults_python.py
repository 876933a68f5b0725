"""The fault-injection suite for durable Python agents: a program killed at any step (its actor,
its sandbox process, the whole cluster) resumes with no completed step executed twice.

The program below counts its side effects in its workspace: each ``tick`` step (``external``)
appends its index to ``counter.txt``, each ``add`` step (``pure``) appends ``add-<i>`` to
``pure.txt``, and a ``hold`` step appends ``held`` to ``held.txt`` each time it begins, then
waits for the file ``go`` the test creates. So a completed step run twice shows as a repeated
line, and a test knows when the program is inside a step (and how many times it got there)
without sleeping. Crash points (`nodus_ray.faults`) stop the run actor at a chosen step:
``step-started`` (an external step's Started written, its effect not begun),
``step-effect-done`` (the effect done, its end not written) and ``step-recorded`` (its
Completed written); the journal step ids are ``<name>-<n>``.

After each fault `audit_program` checks: the run ended Succeeded with its answer, every tick
line is there once, every step has one end in the journal, an external step started again only
after a person declared its attempt without effect, and the cost is the journal's and the
ledger's (`audit_money`, `audit_ledger`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from nodus_ray.store.timestamps import parse_timestamp

from .conftest import Server, unique, wait_for
from .kit import RUNS, V1, workspace_of
from .test_faults import TERMINAL, _journal, _reconnect, _run, audit_ledger, audit_money

AGENTS = "/v1/projects/default/agents"
POINTS = ("step-started", "step-effect-done", "step-recorded")

SOURCE = """
import os
import time

WORKSPACE = "/tmp/workspace"


def _append(name, line):
    with open(os.path.join(WORKSPACE, name), "a") as f:
        f.write(line + "\\n")


def hold():
    _append("held.txt", "held")
    while not os.path.exists(os.path.join(WORKSPACE, "go")):
        time.sleep(0.05)
    return "went"


def main(ctx, input):
    total = 0
    for i in range(1, int(input.get("ticks", 4)) + 1):

        def tick(i=i):
            _append("counter.txt", str(i))
            return i

        def add(i=i, total=total):
            _append("pure.txt", f"add-{i}")
            return total + i

        ctx.step("tick", tick, effect="external")
        total = ctx.step("add", add, effect="pure")
        if input.get("claude") == i:
            import anthropic

            anthropic.Anthropic().messages.create(
                model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": "Say hi"}]
            )
        if input.get("hold") == i:
            ctx.step("hold", hold, effect=input.get("hold_effect", "idempotent"))
        if input.get("sleep") == i:
            ctx.sleep(input["seconds"])
        if input.get("wait") == i:
            ctx.wait_for_message("go")
        if input.get("child") == i:
            ctx.gather([ctx.spawn({"ticks": 1, "wait": 1}, "kid")])
    return {"total": total}
"""


@pytest.fixture(autouse=True)
def _clean_points(server: Server) -> Iterator[None]:
    """No crash point of these tests stays armed, fired or released for the next test (of this
    file or the other fault file): a stale fired file would make ``server.fired`` pass unearned."""

    def clean() -> None:
        for point in POINTS:
            for path in [server.faults / point, *server.faults.glob(f".{point}.*")]:
                path.unlink(missing_ok=True)

    clean()
    yield
    clean()


# -- the program and its runs ----------------------------------------------------------------------


def _agent(server: Server) -> str:
    name = unique("pyfault")
    with server.http() as http:
        uploaded = http.post("/v1/projects/default/agentsources", json={"files": {"main.py": SOURCE}})
        assert uploaded.status_code == 201, uploaded.text
        put = http.put(
            f"{AGENTS}/{name}",
            json={
                "apiVersion": V1,
                "kind": "Agent",
                "metadata": {"name": name},
                "spec": {"source": uploaded.json(), "entrypoint": "main:main", "perRunMaxCostUSD": "0.10"},
            },
        )
        assert put.status_code == 201, put.text
    return name


def _start(server: Server, name: str, input: dict[str, Any], agent: str | None = None) -> str:
    with server.http() as http:
        created = http.post(
            RUNS,
            json={
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": {"agent": agent or _agent(server), "input": json.dumps(input)},
            },
        )
        assert created.status_code == 201, created.text
    return name


def _lines(server: Server, name: str, file: str) -> list[str]:
    path = workspace_of(server, name) / file
    return path.read_text().splitlines() if path.exists() else []


def _state(server: Server, name: str, phase: str, reason: str | None = None, timeout: float = 120) -> Any:
    def reached() -> dict[str, Any] | None:
        run = _run(server, name)
        status = run["status"]
        assert status["phase"] not in TERMINAL or status["phase"] == phase, (name, status)
        return run if status["phase"] == phase and reason in (None, status.get("reason")) else None

    return wait_for(reached, timeout=timeout, interval=0.1, message=f"{name} to be {phase} {reason or ''}")


def settle_program(server: Server, name: str, timeout: float = 180) -> list[str]:
    """Wait for the run to end; an external ``tick-<i>`` left uncertain by a crash is resolved the
    way an operator would: by looking for its line ``<i>`` in the counter. The decisions made."""
    decisions: list[str] = []

    def done() -> bool:
        run = _run(server, name)
        status = run["status"]
        if status["phase"] == "Waiting" and status.get("reason") == "NeedsResolution":
            step = status["step"]
            assert step.startswith("tick-"), status
            index = step.removeprefix("tick-")
            decision: dict[str, Any] = {
                "step": step,
                "revision": run["metadata"]["resourceVersion"],
                "evidence": "counter.txt inspected by the test",
            }
            if index in _lines(server, name, "counter.txt"):
                decision |= {"decision": "Completed", "result": int(index)}
            else:
                decision |= {"decision": "NoEffect"}
            with server.http() as http:
                resolved = http.post(f"{RUNS}/{name}/resolve", json=decision)
            if resolved.status_code == 200:
                decisions.append(f"{step}:{decision['decision']}")
            return False
        return status["phase"] in TERMINAL

    wait_for(done, timeout=timeout, interval=0.1, message=f"run {name} to finish")
    return decisions


def audit_program(server: Server, name: str, ticks: int) -> dict[str, Any]:
    """The run succeeded, each tick's effect happened once, each step ended once in the journal,
    and its cost is its journal's and the ledger's."""
    run = _run(server, name)
    assert run["status"]["phase"] == "Succeeded", (name, run["status"])
    with server.http() as http:
        answer = http.get(f"{RUNS}/{name}/answer").json()["answer"]
    assert json.loads(answer) == {"total": ticks * (ticks + 1) // 2}, answer
    assert _lines(server, name, "counter.txt") == [str(i) for i in range(1, ticks + 1)], (
        f"{name}: an external step ran other than once"
    )
    records = _journal(server, name)
    steps = [r for r in records if r.kind == "step"]
    ids = {r.step_id for r in steps}
    assert {f"tick-{i}" for i in range(1, ticks + 1)} | {f"add-{i}" for i in range(1, ticks + 1)} <= ids
    for step_id in ids:
        states = [(r.state, r.attempt) for r in steps if r.step_id == step_id]
        ends = [s for s, _ in states if s in ("Completed", "Resolved", "Failed")]
        assert ends == [states[-1][0]] and ends[0] != "Failed", f"{name} {step_id}: one end: {states}"
        started = [attempt for state, attempt in states if state == "Started"]
        assert started == sorted(set(started)), f"{name} {step_id}: one Started per attempt: {states}"
        for attempt in started[:-1]:  # an external step runs again only once declared without effect
            assert ("NoEffect", attempt) in states, f"{name} {step_id}: {states}"
    audit_money(server, name, records)
    audit_ledger(server)
    return run


def _states(server: Server, name: str, step_id: str) -> list[tuple[str, int]]:
    return [(r.state, r.attempt) for r in _journal(server, name) if r.step_id == step_id]


def _context(name: str, step_id: str) -> str:
    """What `crash_point` matches for a step of the run: ``{journal prefix}/{step id} node=...``."""
    return f"agentruns/{name}/journal/{step_id} node="


# -- the run actor killed at a step -----------------------------------------------------------------


def test_an_actor_killed_after_a_step_is_recorded_replays_it_and_runs_nothing_twice(server: Server) -> None:
    name = unique("pyrec")
    server.arm("step-recorded", _context(name, "tick-3"))
    _start(server, name, {"ticks": 5, "claude": 1})
    assert settle_program(server, name) == [], "nothing was left uncertain"
    assert server.fired("step-recorded")
    assert (server.fired_context("step-recorded") or "").startswith(f"projects/default/agentruns/{name}/")
    run = audit_program(server, name, ticks=5)
    assert run["status"]["attempts"] >= 2, "a second actor replayed the program"
    assert _lines(server, name, "pure.txt") == [f"add-{i}" for i in range(1, 6)], "no pure step ran twice"
    assert _states(server, name, "tick-3") == [("Started", 1), ("Completed", 1)]
    model = [(r.state, r.attempt) for r in _journal(server, name) if r.kind == "model"]
    assert model == [("Completed", 1)], "the model call was replayed, not made again"
    assert len(run["status"]["turns"]) == 1, "its turn is counted once"
    assert Decimal(run["status"]["cost"]["totalUSD"]) > 0, "the model call was billed"


def test_an_actor_killed_between_a_model_call_and_its_record_calls_again_and_bills_once(
    server: Server,
) -> None:
    """A call on the server's key is safe to repeat: made again by the next actor, recorded, turned
    and billed once, and the credits the lost actor held for it are not kept."""
    name = unique("pymodel")
    server.arm("step-effect-done", _context(name, "model-1"))
    _start(server, name, {"ticks": 3, "claude": 2})
    assert settle_program(server, name) == []
    assert server.fired("step-effect-done")
    run = audit_program(server, name, ticks=3)  # the ledger balances and holds nothing back
    assert run["status"]["attempts"] >= 2
    assert _states(server, name, "model-1") == [("Completed", 1)]
    assert len(run["status"]["turns"]) == 1
    assert Decimal(run["status"]["cost"]["totalUSD"]) == Decimal(run["status"]["turns"][0]["costUSD"]) > 0


def test_an_actor_killed_after_an_external_step_started_waits_for_a_person_and_runs_it_once(
    server: Server,
) -> None:
    name = unique("pystart")
    server.arm("step-started", _context(name, "tick-2"))
    _start(server, name, {"ticks": 4})
    parked = _state(server, name, "Waiting", "NeedsResolution")
    assert parked["status"]["step"] == "tick-2", parked["status"]
    assert server.fired("step-started")
    assert _lines(server, name, "counter.txt") == ["1"], "the crash came before the effect"
    assert settle_program(server, name) == ["tick-2:NoEffect"]
    audit_program(server, name, ticks=4)
    assert _states(server, name, "tick-2") == [
        ("Started", 1),
        ("NeedsResolution", 1),
        ("NoEffect", 1),
        ("Started", 2),
        ("Completed", 2),
    ]


def test_a_person_who_finds_the_effect_done_records_it_and_the_step_is_not_run_again(server: Server) -> None:
    """Killed after the effect and before its Completed: the line is in the counter, the person
    records the step Completed with its result, and the replay returns that result."""
    name = unique("pydone")
    server.arm("step-effect-done", _context(name, "tick-3"))
    _start(server, name, {"ticks": 4})
    _state(server, name, "Waiting", "NeedsResolution")
    assert _lines(server, name, "counter.txt") == ["1", "2", "3"]
    assert settle_program(server, name) == ["tick-3:Completed"]
    audit_program(server, name, ticks=4)
    assert [s for s, _ in _states(server, name, "tick-3")] == ["Started", "NeedsResolution", "Resolved"]


def test_an_actor_killed_after_a_pure_steps_effect_runs_that_step_again_and_nothing_before_it(
    server: Server,
) -> None:
    name = unique("pypure")
    server.arm("step-effect-done", _context(name, "add-2"))
    _start(server, name, {"ticks": 4})
    assert settle_program(server, name) == [], "a pure step needs nobody"
    assert server.fired("step-effect-done")
    run = audit_program(server, name, ticks=4)
    assert run["status"]["attempts"] >= 2
    assert _lines(server, name, "pure.txt") == ["add-1", "add-2", "add-2", "add-3", "add-4"], (
        "the cut pure step ran again, the completed one before it did not"
    )
    assert [s for s, _ in _states(server, name, "add-2")] == ["Completed"]


# -- the sandbox process killed ---------------------------------------------------------------------


def _program_processes(workspace: Path) -> list[psutil.Process]:
    """The run's program processes: the bubblewrap started for the run's workspace with the
    bootstrap as its command, and the interpreter inside it (``python -m nodus._runtime.bootstrap``)."""
    found: list[psutil.Process] = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if str(workspace) in cmdline and any("nodus._runtime.bootstrap" in arg for arg in cmdline):
            found.append(process)
    return found


def _interpreter(workspace: Path) -> psutil.Process | None:
    for sandbox in _program_processes(workspace):
        try:
            for child in sandbox.children(recursive=True):
                if child.cmdline()[1:3] == ["-m", "nodus._runtime.bootstrap"]:
                    return child
        except psutil.NoSuchProcess:
            continue
    return None


def test_the_sandbox_process_killed_mid_step_starts_again_and_runs_nothing_twice(server: Server) -> None:
    name = _start(server, unique("pyproc"), {"ticks": 4, "hold": 2, "claude": 1})
    workspace = workspace_of(server, name)
    wait_for(
        lambda: _lines(server, name, "held.txt") == ["held"], timeout=120, message="the program in its step"
    )
    program = wait_for(lambda: _interpreter(workspace), timeout=30, message="the program's interpreter")
    program.kill()  # SIGKILL from outside: an operator, the OOM killer
    program.wait(timeout=30)
    wait_for(
        lambda: _lines(server, name, "held.txt") == ["held", "held"],
        timeout=120,
        message="the program started again, back in its step",
    )
    again = wait_for(lambda: _interpreter(workspace), timeout=30, message="the new interpreter")
    assert again.pid != program.pid
    (workspace / "go").touch()
    assert settle_program(server, name) == []
    run = audit_program(server, name, ticks=4)
    assert run["status"]["attempts"] == 1, "the same actor started the program again"
    assert _lines(server, name, "pure.txt") == [f"add-{i}" for i in range(1, 5)], "no pure step ran twice"
    assert len(run["status"]["turns"]) == 1, "the replayed model call is one turn, billed once"
    assert [s for s, _ in _states(server, name, "model-1")] == ["Completed"]
    wait_for(lambda: not _program_processes(workspace), timeout=30, message="no program process left")


def test_the_sandbox_process_killed_mid_external_step_waits_for_a_person(server: Server) -> None:
    """Its effect may have happened: the program started again does not repeat it blindly."""
    name = _start(server, unique("pyprocx"), {"ticks": 2, "hold": 1, "hold_effect": "external"})
    workspace = workspace_of(server, name)
    wait_for(lambda: _lines(server, name, "held.txt") == ["held"], timeout=120, message="the external step")
    program = wait_for(lambda: _interpreter(workspace), timeout=30, message="the program's interpreter")
    program.kill()
    parked = _state(server, name, "Waiting", "NeedsResolution")
    assert parked["status"]["step"] == "hold-1", parked["status"]
    assert _lines(server, name, "held.txt") == ["held"], "not run again unasked"
    wait_for(lambda: not _program_processes(workspace), timeout=30, message="no process while it waits")
    (workspace / "go").touch()
    with server.http() as http:
        resolved = http.post(
            f"{RUNS}/{name}/resolve",
            json={
                "step": "hold-1",
                "decision": "NoEffect",
                "revision": parked["metadata"]["resourceVersion"],
            },
        )
        assert resolved.status_code == 200, resolved.text
    assert settle_program(server, name) == []
    audit_program(server, name, ticks=2)
    assert _lines(server, name, "held.txt") == ["held", "held"], "declared without effect: run again, once"
    assert _states(server, name, "hold-1") == [
        ("Started", 1),
        ("NeedsResolution", 1),
        ("NoEffect", 1),
        ("Started", 2),
        ("Completed", 2),
    ]


def test_a_program_killed_again_and_again_without_progress_fails_saying_so(server: Server) -> None:
    """Started again at most three times in a row with no newly completed step: the fourth kill
    fails the run ProgramFailed, naming the signal and the count, and leaves no process."""
    name = _start(server, unique("pykill"), {"ticks": 2, "hold": 1})
    workspace = workspace_of(server, name)
    killed: set[int] = set()
    for kills in range(1, 5):
        wait_for(
            lambda k=kills: _lines(server, name, "held.txt") == ["held"] * k,
            timeout=120,
            message=f"the program in its step, start {kills}",
        )
        program = wait_for(
            lambda: (p := _interpreter(workspace)) is not None and p.pid not in killed and p,
            timeout=30,
            message="a new interpreter",
        )
        killed.add(program.pid)
        program.kill()
        program.wait(timeout=30)
    run = _state(server, name, "Failed", "ProgramFailed", timeout=120)
    message = run["status"]["message"]
    assert "SIGKILL" in message and "4 times in a row" in message, message
    assert run["status"]["attempts"] == 1
    assert _lines(server, name, "counter.txt") == ["1"], "the completed step never ran again"
    assert _lines(server, name, "held.txt") == ["held"] * 4
    wait_for(lambda: not _program_processes(workspace), timeout=30, message="no program process left")
    audit_money(server, name)


# -- waiting holds nothing --------------------------------------------------------------------------


def _holds_nothing(server: Server, name: str) -> bool:
    """No live actor of the run and no process of its program."""
    from ray.util.state import list_actors

    alive = list_actors(filters=[("state", "=", "ALIVE")], limit=10000, detail=True)
    actors = [a for a in alive if f"run=default/{name}," in (getattr(a, "repr_name", "") or "")]
    return not actors and not _program_processes(workspace_of(server, name))


def test_parked_programs_hold_no_actor_and_no_process_and_a_cancelled_parent_cancels_its_child(
    server: Server, ray_driver: Any
) -> None:
    agent = _agent(server)
    sleeper = _start(server, unique("pysleep"), {"ticks": 1, "sleep": 1, "seconds": 3600}, agent)
    waiter = _start(server, unique("pywait"), {"ticks": 1, "wait": 1}, agent)
    parent = _start(server, unique("pyparent"), {"ticks": 1, "child": 1}, agent)
    child = f"{parent}-kid"
    assert _state(server, sleeper, "Waiting", "Sleeping")["status"].get("wakeAt")
    assert _state(server, waiter, "Waiting", "AwaitingMessage")["status"]["waitingFor"]["message"] == "go"
    assert _state(server, parent, "Waiting", "AwaitingChildren")["status"]["waitingFor"]["children"] == [
        child
    ]
    _state(server, child, "Waiting", "AwaitingMessage")
    for name in (sleeper, waiter, parent, child):
        wait_for(lambda n=name: _holds_nothing(server, n), timeout=30, message=f"{name} to hold nothing")
        assert _run(server, name)["status"]["phase"] == "Waiting", "released while it waits"
        assert _lines(server, name, "counter.txt") == ["1"]

    with server.http() as http:
        assert http.post(f"{RUNS}/{waiter}/messages", json={"payload": "yes", "name": "go"}).status_code in (
            200,
            201,
            202,
        )
        for name in (sleeper, parent):
            cancelled = http.post(f"{RUNS}/{name}/cancel")
            assert cancelled.status_code in (200, 202), cancelled.text
    assert settle_program(server, waiter) == []
    audit_program(server, waiter, ticks=1)
    for name in (sleeper, parent, child):
        _state(server, name, "Cancelled", timeout=60)
    assert "parent" in (_run(server, child)["status"].get("message") or ""), _run(server, child)["status"]
    for name in (sleeper, parent, child):
        assert _holds_nothing(server, name)
    audit_ledger(server)


# -- the whole cluster ------------------------------------------------------------------------------


def test_ray_stop_force_mid_program_then_nodus_up_finishes_it_and_wakes_the_sleeper_on_time(
    server: Server, ray_driver: Any
) -> None:
    """`ray stop --force` with one program inside a step, one asleep and one waiting for a
    message: after `nodus up` the first is replayed and finishes (nobody resolves anything), the
    second wakes at the wake time it journaled before the stop, the third still waits and goes
    on when its message comes; every counted line is there once."""
    agent = _agent(server)
    held = _start(server, unique("pyheld"), {"ticks": 3, "hold": 2}, agent)
    sleeper = _start(server, unique("pysleeper"), {"ticks": 2, "sleep": 1, "seconds": 40}, agent)
    waiter = _start(server, unique("pywaiter"), {"ticks": 2, "wait": 2}, agent)
    _state(server, waiter, "Waiting", "AwaitingMessage")
    wait_for(
        lambda: _lines(server, held, "held.txt") == ["held"], timeout=120, message="a program in its step"
    )
    wake_at = _state(server, sleeper, "Waiting", "Sleeping")["status"]["wakeAt"]
    held_workspace = workspace_of(server, held)
    assert _program_processes(held_workspace)

    assert server.kill_cluster() > 0
    with pytest.raises(httpx.HTTPError):
        with server.http() as http:
            http.get("/readyz", timeout=2)
    # The program dies with its actor: nothing of it goes on running steps while nobody serves it.
    wait_for(
        lambda: not _program_processes(held_workspace), timeout=30, message="the program to die with Ray"
    )
    up = server.up()
    assert up.returncode == 0, up.stdout + up.stderr
    _reconnect(server, ray_driver)

    sleeping = _run(server, sleeper)["status"]
    assert sleeping["wakeAt"] == wake_at, "the wake time is the journaled one"
    if (parse_timestamp(wake_at) - datetime.now(UTC)).total_seconds() > 3:
        assert (sleeping["phase"], sleeping.get("reason")) == ("Waiting", "Sleeping"), "not woken early"
    wait_for(
        lambda: _lines(server, held, "held.txt") == ["held", "held"],
        timeout=180,
        message="the held program replayed after the restart",
    )
    (held_workspace / "go").touch()
    assert settle_program(server, held) == [], "nobody resolves anything"
    run = audit_program(server, held, ticks=3)
    assert run["status"]["attempts"] >= 2

    assert settle_program(server, sleeper, timeout=180) == []
    woke = audit_program(server, sleeper, ticks=2)
    assert parse_timestamp(woke["status"]["finishedAt"]) >= parse_timestamp(wake_at), "woken at its time"
    assert woke["status"]["attempts"] >= 2

    waiting = _run(server, waiter)["status"]
    assert (waiting["phase"], waiting.get("reason")) == ("Waiting", "AwaitingMessage"), "still waiting"
    with server.http() as http:
        sent = http.post(f"{RUNS}/{waiter}/messages", json={"payload": "yes", "name": "go"})
        assert sent.status_code in (200, 201, 202), sent.text
    assert settle_program(server, waiter) == []
    audit_program(server, waiter, ticks=2)
