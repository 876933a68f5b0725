"""Billing a run's sandbox work as it happens: hold before, charge after, record in the step.

The glue between the programs that run commands (`conversation.Conversation`, a Python
program's setup and process in `program.python_program`) and `money.sandbox_billing`: the
run's `SandboxMeter` starts at its ``sandbox`` step (the workspace's creation), each command
holds its largest price against the project's Budget first (`RunSpend.before_sandbox`), and
its charge goes into the step's recorded value, where replay and the control plane read it.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from nodus_ray.durable.steps import Steps
from nodus_ray.money.sandbox_billing import CHARGE_KINDS, SandboxMeter
from nodus_ray.money.spend import RunSpend
from nodus_ray.sandbox import CommandResult, Sandbox, SandboxLimits
from nodus_ray.sandbox.disk_usage import disk_usage
from nodus_ray.sandbox.metered import cpu_seconds_of

logger = logging.getLogger(__name__)

__all__ = [
    "charge_fields",
    "charge_process",
    "command_charge",
    "hold",
    "journal_meter",
    "limits_of",
    "open_meter",
]


def open_meter(spend: RunSpend, steps: Steps) -> SandboxMeter:
    """The run's meter: storage is paid from its ``sandbox`` step's time (now, if none yet)."""
    record = steps.recorded("sandbox")
    since = record.at if record is not None else datetime.now(UTC)
    return SandboxMeter(spend.prices.sandbox, since=since)


def journal_meter(spend: RunSpend, steps: Steps) -> SandboxMeter:
    """`open_meter` with every charge the journal holds already counted (a Python program's:
    its earlier processes' charges are not steps its replay asks for again)."""
    meter = open_meter(spend, steps)
    for record in steps.journal.records:
        if record.kind in CHARGE_KINDS and record.state == "Completed" and isinstance(record.payload, dict):
            result = record.payload.get("result")
            if isinstance(result, dict):
                meter.record(result)
    return meter


def limits_of(sandbox: Sandbox | None) -> SandboxLimits:
    """The sandbox's per-command limits (its CPU limit and disk quota bound the reservation)."""
    limits = getattr(sandbox, "limits", None)
    return limits if isinstance(limits, SandboxLimits) else SandboxLimits()


async def hold(
    spend: RunSpend,
    meter: SandboxMeter,
    limits: SandboxLimits,
    *,
    timeout_seconds: float | None = None,
    cpu_limit_seconds: float | None = None,
    standing: bool = False,
) -> Decimal:
    """Reserve the next command's largest price against the project's Budget; returns it.

    Raises `spend.BudgetExceeded` (from `RunSpend.before_sandbox`) when it does not fit: the
    command's step is not journaled then, so the resumed run comes back to it and holds again.
    """
    reserved = meter.reserve(
        cpu_limit_seconds=limits.cpu_seconds if cpu_limit_seconds is None else cpu_limit_seconds,
        quota_bytes=limits.disk_bytes,
        timeout_seconds=limits.timeout_seconds if timeout_seconds is None else timeout_seconds,
        now=datetime.now(UTC),
    )
    if standing:  # a process that outlives the steps it makes: later reservations keep it
        await spend.hold_standing(reserved)
        return reserved
    before_sandbox = getattr(spend, "before_sandbox", None)
    if before_sandbox is not None:
        await before_sandbox(reserved)
    return reserved


def charge_fields(
    meter: SandboxMeter, *, cpu_seconds: float, workspace_bytes: int, reserved: Decimal
) -> dict[str, Any]:
    """A charge for work that ended now: its CPU, the storage since the last charge, at most
    ``reserved`` (`SandboxCharge.fields`, for the step's recorded value)."""
    charge = meter.charge(
        cpu_seconds=cpu_seconds, workspace_bytes=workspace_bytes, until=datetime.now(UTC), reserved=reserved
    )
    return charge.fields()


async def charge_process(
    steps: Steps,
    meter: SandboxMeter,
    proc: subprocess.Popen[bytes],
    workspace: Path,
    reserved: Decimal,
    step_id: str,
) -> None:
    """Journal an ended program process's CPU and the workspace's storage since the last charge
    as a step of its own (kind ``charge``, `Steps.record_charge`), at most ``reserved``.

    Best effort once the process is gone: a charge that cannot be written (a newer actor fenced
    this one) is logged, never the run's end; the reservation bounded it either way.
    """
    # A program's run only (a Claude run's process never loads the program's wire protocol).
    from nodus_ray.sandbox.program import release_program, stop_program

    try:
        await asyncio.to_thread(stop_program, proc)  # reaped (it is, by now, as a rule)
        cpu = cpu_seconds_of(proc)
        await asyncio.to_thread(release_program, proc)
        size = await asyncio.to_thread(disk_usage, workspace)
        fields = charge_fields(meter, cpu_seconds=cpu, workspace_bytes=size, reserved=reserved)
        summary = f"program process: {cpu:.3f} CPU-s, ${fields['sandboxUSD']}"
        if await steps.record_charge(step_id, fields, summary):
            meter.record(fields)
    except Exception:  # noqa: BLE001 - the charge is lost, not the run
        logger.warning("could not record the sandbox charge %s", step_id, exc_info=True)


def command_charge(meter: SandboxMeter, result: CommandResult, reserved: Decimal) -> dict[str, Any]:
    """What a finished command adds to its recorded value (`charge_fields` of what it measured)."""
    return charge_fields(
        meter, cpu_seconds=result.cpu_seconds, workspace_bytes=result.workspace_bytes, reserved=reserved
    )
