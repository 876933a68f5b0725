"""Sandbox billing (decision 44): prices, rounding, the reservation bound, CPU measured from
outside the sandbox, and a conversation's charges journaled, replayed and recomputed.

Expected figures are worked out from the published defaults ($0.00005 a CPU-second, $0.0002
a GiB-hour, each charge rounded up to a microdollar). CPU is compared between commands (a busy
loop against a sleep of the same length), never against the wall clock.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from nodus.schema_run import CostStatus
from nodus_ray.core.evaluation import final_record, plan_cases
from nodus_ray.durable.journal import Journal, JournalRecord
from nodus_ray.environments import GradingWorkspace
from nodus_ray.money.prices import DEFAULT_PRICE_TABLE, PriceTable, SandboxPrice
from nodus_ray.money.sandbox_billing import (
    GIB,
    PROGRAM_HOLD_SECONDS,
    SandboxMeter,
    cost_fields,
    cpu_cost,
    journaled_sandbox_cost,
    reservation,
    storage_cost,
)
from nodus_ray.money.spend import BudgetExceeded
from nodus_ray.sandbox import SandboxLimits, create_sandbox
from nodus_ray.sandbox.metered import MeteredPopen, cpu_seconds_of, open_cpu_group
from nodus_ray.sandbox.process import ProcessSandbox
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from tests.unit.test_control_support import make_plane, run_doc, until
from tests.unit.test_conversation import Rig, ScriptedProvider, bash, rig, run, text
from tests.unit.test_program_python import needs_bwrap, run_program
from tests.unit.test_wake_timers import python_agent

__all__ = ["rig"]  # the conversation tests' fixture, used here too

PRICE = DEFAULT_PRICE_TABLE.sandbox
# A fixed amount of work (some 0.15 CPU-seconds here), not a length of time: a loaded machine
# stretches its wall time, never the CPU it needs, so the figures compare on any load.
WORK = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"
BUSY = f"sh -c '{WORK}'"
IDLE = "sleep 0.3"  # asleep, whatever the load


# -- prices ------------------------------------------------------------------------------------


def test_the_default_sandbox_prices_are_decimals_in_the_table() -> None:
    assert PRICE == SandboxPrice(Decimal("0.00005"), Decimal("0.0002"))
    assert DEFAULT_PRICE_TABLE.to_dict()["sandbox"] == {
        "cpuSecondUSD": "0.00005",
        "workspaceGiBHourUSD": "0.0002",
    }


def test_the_prices_file_overrides_the_sandbox_section_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"sandbox": {"cpuSecondUSD": "0.0001"}}))
    table = PriceTable.load(path)
    assert table.sandbox == SandboxPrice(Decimal("0.0001"), Decimal("0.0002"))
    assert table.prices == DEFAULT_PRICE_TABLE.prices  # model prices untouched
    yaml_path = tmp_path / "prices.yaml"
    yaml_path.write_text("sandbox:\n  workspaceGiBHourUSD: 0.0003\n")
    assert PriceTable.load(yaml_path).sandbox.workspace_gib_hour == Decimal("0.0003")
    assert PriceTable.load(path).to_dict()["sandbox"]["cpuSecondUSD"] == "0.0001"


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"cpuSecondUSD": "-1"}, "sandbox.cpuSecondUSD"),
        ({"cpuSecondUSD": "abc"}, "sandbox.cpuSecondUSD"),
        ({"gpuSecondUSD": "1"}, "sandbox.gpuSecondUSD"),
        ("cheap", "sandbox"),
    ],
)
def test_a_bad_sandbox_price_is_refused_naming_the_field(tmp_path: Path, section: Any, named: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"sandbox": section}))
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        PriceTable.load(path)


# -- pricing and rounding ----------------------------------------------------------------------


def test_cpu_and_storage_are_priced_exactly_and_rounded_up_to_a_microdollar() -> None:
    assert cpu_cost(PRICE, 1.0) == Decimal("0.00005")
    assert cpu_cost(PRICE, 100) == Decimal("0.005")
    assert cpu_cost(PRICE, 0.0) == Decimal("0")
    # 0.001 CPU-s is $0.00000005: a bill is never short, so a millionth.
    assert cpu_cost(PRICE, 0.001) == Decimal("0.000001")
    assert cpu_cost(PRICE, 0.1) == Decimal("0.000005")  # the float's text, not its binary noise
    assert storage_cost(PRICE, GIB, 3600) == Decimal("0.0002")
    assert storage_cost(PRICE, GIB // 2, 1800) == Decimal("0.00005")
    assert storage_cost(PRICE, 4096, 60) == Decimal("0.000001")  # a tiny workspace: rounded up
    assert storage_cost(PRICE, 0, 3600) == Decimal("0")
    with pytest.raises(ValueError):
        cpu_cost(PRICE, -1.0)
    with pytest.raises(ValueError):
        cpu_cost(PRICE, float("nan"))


def test_the_reservation_is_the_cpu_limit_and_the_quota_for_the_hours_held() -> None:
    held = reservation(PRICE, cpu_limit_seconds=60, quota_bytes=GIB, held_seconds=1800, timeout_seconds=1800)
    assert held == Decimal("0.003") + Decimal("0.0002")  # 60 CPU-s, and 1 GiB for an hour
    # A program has no timeout: its storage is held for PROGRAM_HOLD_SECONDS past the last charge.
    unbounded = reservation(
        PRICE, cpu_limit_seconds=0, quota_bytes=GIB, held_seconds=0, timeout_seconds=float("inf")
    )
    assert unbounded == storage_cost(PRICE, GIB, PROGRAM_HOLD_SECONDS)


def test_a_charge_is_what_was_measured_and_never_above_its_reservation() -> None:
    since = datetime(2026, 12, 1, 12, tzinfo=UTC)
    meter = SandboxMeter(PRICE, since=since)
    until = since + timedelta(minutes=30)
    reserved = meter.reserve(cpu_limit_seconds=60, quota_bytes=GIB, timeout_seconds=120, now=since)
    charge = meter.charge(cpu_seconds=2.0, workspace_bytes=GIB // 4, until=until, reserved=reserved)
    assert charge.cpu_usd == Decimal("0.0001")
    assert charge.storage_usd == Decimal("0.000025")  # a quarter GiB for half an hour
    assert charge.charged_usd == Decimal("0.000125") <= reserved
    # What could not happen within the limits (more CPU, more disk, more time) is cut to what was held.
    over = meter.charge(cpu_seconds=10_000, workspace_bytes=50 * GIB, until=until, reserved=reserved)
    assert over.charged_usd == reserved
    rng = random.Random(44)
    for _ in range(200):
        limit, quota = rng.randint(1, 3600), rng.randint(0, 4 * GIB)
        held, timeout = rng.uniform(0, 86400), rng.uniform(1, 3600)
        at = since + timedelta(seconds=held)
        meter = SandboxMeter(PRICE, since=since)
        reserved = meter.reserve(cpu_limit_seconds=limit, quota_bytes=quota, timeout_seconds=timeout, now=at)
        # Within the limits, the actual charge fits the reservation by itself.
        cpu, size = rng.uniform(0, limit), rng.randint(0, quota)
        end = at + timedelta(seconds=rng.uniform(0, timeout))
        charge = meter.charge(cpu_seconds=cpu, workspace_bytes=size, until=end, reserved=reserved)
        assert charge.charged_usd == charge.cpu_usd + charge.storage_usd <= reserved
        wild = meter.charge(cpu_seconds=cpu * 50, workspace_bytes=size * 50, until=end, reserved=reserved)
        assert wild.charged_usd == min(wild.cpu_usd + wild.storage_usd, reserved) <= reserved


def test_recording_a_charge_moves_where_storage_is_paid_to_and_a_replay_rebuilds_it() -> None:
    since = datetime(2026, 12, 1, 12, tzinfo=UTC)
    meter = SandboxMeter(PRICE, since=since)
    first = meter.charge(
        cpu_seconds=1.0, workspace_bytes=GIB, until=since + timedelta(hours=1), reserved=Decimal(1)
    ).fields()
    assert meter.record(first) == Decimal("0.00025")  # 1 CPU-s and a GiB for an hour
    second = meter.charge(
        cpu_seconds=0.0, workspace_bytes=GIB, until=since + timedelta(hours=2), reserved=Decimal(1)
    ).fields()
    assert second["storageSeconds"] == 3600.0  # from the first charge on, not from the start
    meter.record(second)
    replayed = SandboxMeter(PRICE, since=since)
    for fields in (first, second):
        replayed.record(fields)
    assert (
        (replayed.spent, replayed.since)
        == (meter.spent, meter.since)
        == (Decimal("0.00045"), since + timedelta(hours=2))
    )


def _record(step: str, kind: str, state: str, result: dict[str, Any]) -> JournalRecord:
    return JournalRecord(0, step, kind, state, 1, {"result": result}, "0", datetime.now(UTC))


def test_the_journal_sum_counts_charges_once_and_only_where_a_charge_can_be() -> None:
    records = [
        _record("turn-1/command-1-1", "command", "Started", {}),
        _record("turn-1/command-1-1", "command", "Completed", {"sandboxUSD": "0.000125"}),
        _record("charge/process-1-1", "charge", "Completed", {"sandboxUSD": "0.01"}),
        _record("setup", "setup", "Completed", {"sandboxUSD": "0.000002"}),
        # A program's own step value is the user's: whatever it claims is no charge.
        _record("my-step", "step", "Completed", {"sandboxUSD": "5"}),
        # A person's resolution of an interrupted command carries none either, nor can a value lower the bill.
        _record("turn-1/command-1-2", "command", "Resolved", {"sandboxUSD": "1"}),
        _record("turn-1/command-1-3", "command", "Completed", {"sandboxUSD": "-1"}),
    ]
    assert journaled_sandbox_cost(records) == Decimal("0.010127")


def test_the_cost_figures_keep_total_the_model_spend() -> None:
    fields = cost_fields(Decimal("0.25"), Decimal("0.01"))
    assert fields == {"totalUSD": "0.25", "modelUSD": "0.25", "sandboxUSD": "0.01", "billedUSD": "0.26"}
    assert CostStatus.model_validate(fields).model_dump()["billedUSD"] == "0.26"
    # A status written before sandbox billing reads as model spend alone.
    assert CostStatus.model_validate({"totalUSD": "0.5"}).model_dump() == {
        "totalUSD": "0.5",
        "modelUSD": "0.5",
        "sandboxUSD": "0",
        "billedUSD": "0.5",
        "limitUSD": None,
    }


# -- measuring CPU -------------------------------------------------------------------------------


def test_a_busy_command_measures_far_more_cpu_than_a_sleeping_one(tmp_path: Path) -> None:
    sandbox = create_sandbox(tmp_path / "ws", SandboxLimits(timeout_seconds=30))
    try:
        busy, idle = sandbox.run(BUSY), sandbox.run(IDLE)
    finally:
        sandbox.delete()
    assert busy.exit_code == idle.exit_code == 0
    assert busy.cpu_seconds > 0.02
    assert idle.cpu_seconds * 4 < busy.cpu_seconds
    assert busy.to_dict()["cpu_seconds"] == busy.cpu_seconds  # journaled with the result


def test_the_process_fallback_measures_cpu_with_wait4(tmp_path: Path) -> None:
    sandbox = ProcessSandbox(tmp_path / "ws", SandboxLimits(timeout_seconds=30))
    try:
        busy, idle = sandbox.run(BUSY), sandbox.run(IDLE)
    finally:
        sandbox.delete()
    assert busy.cpu_seconds > 0.02 and idle.cpu_seconds * 4 < busy.cpu_seconds


def test_a_command_the_runner_kills_is_billed_the_cpu_it_burned(tmp_path: Path) -> None:
    if open_cpu_group() is None:
        pytest.skip("no cgroup for commands here: a killed command's tree is counted by wait4 alone")
    # The disk watch kills it once it has done its work and filled the workspace (no clock in
    # this); its tree dies with bubblewrap's namespace, unwaited, and is still counted.
    sandbox = create_sandbox(tmp_path / "ws", SandboxLimits(timeout_seconds=120, disk_bytes=1 << 20))
    try:
        killed = sandbox.run(f"{BUSY} & wait; head -c 4194304 /dev/zero > big; sleep 100")
        sandbox.run("rm -f big")
        idle = sandbox.run(IDLE)
    finally:
        sandbox.delete()
    assert (killed.limit, killed.exit_code, killed.timed_out) == ("disk", None, False)
    assert killed.cpu_seconds > 0.02 and idle.cpu_seconds * 4 < killed.cpu_seconds


def test_commands_measured_at_once_on_threads_each_get_their_own_figure(tmp_path: Path) -> None:
    async def both() -> tuple[float, float]:
        def one(argv: list[str]) -> float:
            proc = MeteredPopen(argv)
            proc.wait()
            return cpu_seconds_of(proc)

        busy, idle = await asyncio.gather(
            asyncio.to_thread(one, ["/bin/sh", "-c", WORK]), asyncio.to_thread(one, ["/bin/sleep", "0.3"])
        )
        return busy, idle

    busy, idle = asyncio.run(both())
    assert busy > 0.02 and idle * 4 < busy


# -- a conversation's charges ------------------------------------------------------------------


@dataclass
class Budget:
    """The run actor's ``reserve_budget`` as the control plane answers it."""

    room: Decimal = Decimal("100")
    held: list[Decimal] = field(default_factory=list)

    async def reserve(self, amount: Decimal) -> None:
        if amount > self.room:
            raise BudgetExceeded(amount)
        self.held.append(amount)


def test_a_command_is_held_then_charged_in_its_step_and_a_replay_charges_nothing_again(rig: Rig) -> None:
    budget = Budget()
    conversation = rig.conversation(ScriptedProvider(bash(BUSY), text("done")), access="BYOK", cap=None)
    conversation.spend.reserve_budget = budget.reserve
    assert run(conversation) == "done"

    command = next(r for r in rig.records() if r.kind == "command" and r.state == "Completed")
    recorded = command.payload["result"]
    charged = Decimal(recorded["sandboxUSD"])
    assert recorded["cpuSeconds"] > 0.02 and charged >= cpu_cost(PRICE, recorded["cpuSeconds"]) > 0
    limits = SandboxLimits(timeout_seconds=30)
    assert budget.held and budget.held[0] >= charged  # held before, at least what was charged
    assert budget.held[0] >= cpu_cost(PRICE, limits.cpu_seconds)  # the whole CPU limit was held
    assert Decimal(recorded["sandboxReservedUSD"]) == budget.held[0]
    # BYOK: the model spend is nothing, the sandbox is billed all the same.
    assert conversation.cost_usd == 0 and conversation.sandbox_usd == charged
    assert journaled_sandbox_cost(rig.records()) == charged

    replayed = rig.conversation(ScriptedProvider(), access="BYOK", cap=None)  # no model call left
    again = Budget()
    replayed.spend.reserve_budget = again.reserve
    assert run(replayed) == "done"
    assert replayed.sandbox_usd == charged and again.held == []  # nothing held or charged twice
    assert journaled_sandbox_cost(rig.records()) == charged


def test_a_budget_without_room_stops_the_command_before_it_is_journaled(rig: Rig) -> None:
    conversation = rig.conversation(
        ScriptedProvider(bash("touch ran"), text("done")), access="BYOK", cap=None
    )
    conversation.spend.reserve_budget = Budget(room=Decimal("0.000001")).reserve
    with pytest.raises(BudgetExceeded):
        run(conversation)
    assert not any(r.kind == "command" for r in rig.records())
    assert not (rig.workspace / "ran").exists()


# -- grading -------------------------------------------------------------------------------------


def test_grading_commands_add_up_their_cpu_and_the_case_record_keeps_the_charge(tmp_path: Path) -> None:
    root = tmp_path / "copy"
    root.mkdir(mode=0o700)
    workspace = GradingWorkspace(root)
    workspace.run(BUSY)
    first = workspace.cpu_seconds
    workspace.run(BUSY)
    assert first > 0.02 and workspace.cpu_seconds > first  # both commands counted
    case = plan_cases("g", ["t1"], 1)[0]
    usd = str(cpu_cost(PRICE, workspace.cpu_seconds))
    record = final_record(
        case, "Scored", verdict="pass", reward=1.0, grading_cpu_seconds=workspace.cpu_seconds, grading_usd=usd
    )
    assert record["gradingUSD"] == usd and Decimal(usd) > 0
    assert record["gradingCpuSeconds"] == workspace.cpu_seconds
    assert "gradingUSD" not in final_record(case, "RunFailed")  # nothing graded, nothing billed


# -- a Python program's processes -----------------------------------------------------------------


@needs_bwrap
def test_each_program_process_is_a_charge_of_its_own_and_replay_steps_around_them(tmp_path: Path) -> None:
    assert json.loads(run_program(tmp_path, {})) == {"a": 1, "b": 2}
    # A second actor replays the program's steps past the first process's charge (no NonDeterministic).
    assert json.loads(run_program(tmp_path, {}, attempt=2)) == {"a": 1, "b": 2}
    records = Journal(Storage(str(tmp_path / "store")), layout.journal_folder("p", "r")).load()
    charges = [r for r in records if r.kind == "charge"]
    assert [r.step_id for r in charges] == ["charge/process-1-1", "charge/process-2-1"]
    for charge in charges:
        result = charge.payload["result"]
        # The interpreter's start alone takes some CPU, and the charge is within what was held.
        assert result["cpuSeconds"] > 0
        assert Decimal(0) < Decimal(result["sandboxUSD"]) <= Decimal(result["sandboxReservedUSD"])
    assert journaled_sandbox_cost(records) == sum(
        (Decimal(r.payload["result"]["sandboxUSD"]) for r in charges), Decimal(0)
    )


# -- continue_as_new -------------------------------------------------------------------------------


def test_a_new_generation_carries_the_earlier_ones_sandbox_charges(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        await python_agent(plane)
        await plane.services.runs.create_run("demo", run_doc("r1", agent="py", input="first"))
        (actor,) = await until(lambda: plane.run_actors.of("r1"), what="the run's actor")
        old = Journal(plane.storage, layout.journal_generation_folder("demo", "r1", 0))
        old.load()
        await asyncio.to_thread(old.append, "ask-1", "step", "Completed", {"result": 1}, cost_usd="0.10")
        charge = {"result": {"sandboxUSD": "0.02", "cpuSeconds": 400.0}}
        await asyncio.to_thread(old.append, "charge/process-1-1", "charge", "Completed", charge)
        answer = await plane.services.generations.continue_as_new(
            "demo", "r1", actor.config.attempt, 0, "next"
        )
        assert (answer["priorUSD"], answer["priorSandboxUSD"]) == ("0.10", "0.02")
        cost = (await plane.services.runs.get_run("demo", "r1"))["status"]["cost"]
        assert (cost["priorUSD"], cost["priorSandboxUSD"]) == ("0.10", "0.02")
        assert Decimal(cost["billedUSD"]) == Decimal(cost["totalUSD"]) + Decimal(cost["sandboxUSD"])
        # The next actor starts with them, and the journal's figures are the whole run's.
        plane.run_actors.kill(actor)
        following = (await until(lambda: plane.run_actors.of("r1")[1:], what="the next actor"))[0]
        assert (following.config.prior_cost_usd, following.config.prior_sandbox_usd) == ("0.10", "0.02")
        new = Journal(plane.storage, layout.journal_generation_folder("demo", "r1", 1), first_seq=2)
        new.load()
        more = {"result": {"sandboxUSD": "0.005"}}
        await asyncio.to_thread(new.append, "turn-1/command-1-1", "command", "Completed", more)
        figures = await asyncio.to_thread(plane.services.supervisor._journaled_costs, ("demo", "r1"))
        assert figures == {
            "totalUSD": "0.10",
            "modelUSD": "0.10",
            "sandboxUSD": "0.025",
            "billedUSD": "0.125",
        }

    asyncio.run(scenario())
