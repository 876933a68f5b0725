"""What a run's sandbox costs: its commands' CPU-seconds and the GiB-hours its workspace holds.

The rules (docs "What a run costs", decision 44):

* **CPU.** Each command (and each Python program process) is billed on the CPU time of its whole
  process tree, user + system, measured outside the sandbox (`sandbox.metered`: a cgroup per
  command, else ``wait4``), at ``sandbox.cpuSecondUSD`` of the price table.
* **Storage.** The kept workspace is billed per GiB-hour at ``sandbox.workspaceGiBHourUSD``: the
  most it held around a command, for the hours from the last storage charge (the sandbox's
  creation for the first) to the end of the command. A run parked for days holds its workspace
  all that time, so the first command after it pays for those hours.
* **Reserved before it accrues.** Before a command runs, its largest price is held against the
  project's Budget (`RunSpend.before_sandbox`): ``cpu_limit_seconds * cpuSecondUSD +
  quota_GiB * (hours since the last storage charge + the command's timeout in hours) *
  workspaceGiBHourUSD``; the charge recorded after it is ``min(actual, reserved)``, so a Budget
  is never passed by what a command did.
* **Exact, rounded up.** Decimals, each charge rounded up to a millionth of a dollar like model
  calls (`prices.round_up`).
* **Journaled, recomputed.** A charge is part of the step's recorded value (``cpuSeconds``,
  ``sandboxUSD``, ``storageThrough``, ...; `SandboxMeter.fields`), so a replay reads it back
  instead of charging again, and the control plane sums it from the journal
  (`journaled_sandbox_cost`), as it sums model cost. Sandbox compute is billed whatever the
  model access (BYOK too), is not paid from credits and not counted by ``perRunMaxCostUSD``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Any

from nodus_ray.money.prices import SandboxPrice, round_up
from nodus_ray.store.timestamps import format_timestamp, parse_timestamp

__all__ = [
    "CHARGE_KINDS",
    "GIB",
    "PROGRAM_HOLD_SECONDS",
    "SandboxCharge",
    "SandboxMeter",
    "cost_fields",
    "cpu_cost",
    "journaled_sandbox_cost",
    "reservation",
    "sandbox_cost_of",
    "storage_cost",
]

GIB = 1 << 30
_HOUR = Decimal(3600)
_PRECISION = 80
# A Python program process has no timeout: its storage is reserved for this long past the last
# charge (and a charge never passes its reservation, so a longer process is billed this much).
PROGRAM_HOLD_SECONDS = 3600.0
# Step kinds whose recorded value may carry a sandbox charge: a Claude run's command, a Python
# program's setup command, and a charge step of its own (a program process's CPU and storage).
# Only these are read: a program's own step values are the user's and could claim anything.
CHARGE_KINDS: frozenset[str] = frozenset({"command", "setup", "charge"})


def _decimal(value: float | int | Decimal) -> Decimal:
    if isinstance(value, Decimal):
        amount = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
        amount = Decimal(repr(value))  # the float's shortest text: 0.1 is 0.1, not 0.1000000000000000055
    else:
        amount = Decimal(value)
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"expected a finite number >= 0, got {value!r}")
    return amount


def cpu_cost(price: SandboxPrice, cpu_seconds: float | Decimal) -> Decimal:
    """``cpu_seconds`` at ``cpuSecondUSD``, rounded up to a millionth of a dollar."""
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        ctx.rounding = ROUND_CEILING
        return round_up(_decimal(cpu_seconds) * price.cpu_second)


def _storage_raw(price: SandboxPrice, size_bytes: int | Decimal, seconds: float | Decimal) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        ctx.rounding = ROUND_CEILING
        return _decimal(size_bytes) / GIB * _decimal(seconds) / _HOUR * price.workspace_gib_hour


def storage_cost(price: SandboxPrice, size_bytes: int, seconds: float | Decimal) -> Decimal:
    """``size_bytes`` held for ``seconds`` at ``workspaceGiBHourUSD``, rounded up to a microdollar."""
    return round_up(_storage_raw(price, size_bytes, seconds))


def reservation(
    price: SandboxPrice,
    *,
    cpu_limit_seconds: float,
    quota_bytes: int,
    held_seconds: float,
    timeout_seconds: float,
) -> Decimal:
    """The most one command can be charged: its CPU limit, and its workspace quota held from the
    last storage charge (``held_seconds`` ago) to the end of its timeout. An unbounded timeout
    (a program) counts as `PROGRAM_HOLD_SECONDS`."""
    timeout = timeout_seconds if math.isfinite(timeout_seconds) else PROGRAM_HOLD_SECONDS
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        ctx.rounding = ROUND_CEILING
        cpu = _decimal(cpu_limit_seconds) * price.cpu_second
        storage = _storage_raw(
            price, quota_bytes, _decimal(max(0.0, held_seconds)) + _decimal(max(0.0, timeout))
        )
        return round_up(cpu + storage)


@dataclass(frozen=True)
class SandboxCharge:
    """One charge as journaled: what was measured, what it cost, what was held for it."""

    cpu_seconds: float
    workspace_bytes: int
    storage_seconds: float
    through: datetime  # the storage is paid up to here; the next charge starts from it
    cpu_usd: Decimal
    storage_usd: Decimal
    reserved_usd: Decimal
    charged_usd: Decimal  # min(cpu_usd + storage_usd, reserved_usd)

    def fields(self) -> dict[str, Any]:
        """The keys a step's recorded value carries (camelCase, decimals as strings)."""
        return {
            "cpuSeconds": self.cpu_seconds,
            "workspaceBytes": self.workspace_bytes,
            "storageSeconds": round(self.storage_seconds, 3),
            "storageThrough": format_timestamp(self.through),
            "sandboxReservedUSD": str(self.reserved_usd),
            "sandboxUSD": str(self.charged_usd),
        }


def sandbox_cost_of(value: Any) -> Decimal:
    """The ``sandboxUSD`` a recorded value carries (0 when none, or not a decimal >= 0)."""
    if not isinstance(value, Mapping):
        return Decimal(0)
    raw = value.get("sandboxUSD")
    try:
        amount = Decimal(str(raw)) if raw is not None else Decimal(0)
    except ArithmeticError:
        return Decimal(0)
    return amount if amount.is_finite() and amount >= 0 else Decimal(0)


def journaled_sandbox_cost(records: Iterable[Any]) -> Decimal:
    """What a journal's sandbox charges add up to: each `CHARGE_KINDS` step's ``Completed``
    value's ``sandboxUSD``, once per step (a value a person resolved a step with is theirs and
    carries no charge)."""
    last: dict[str, Decimal] = {}
    for record in records:
        if record.kind not in CHARGE_KINDS or record.state != "Completed":
            continue
        payload = record.payload if isinstance(record.payload, Mapping) else {}
        last[record.step_id] = sandbox_cost_of(payload.get("result"))
    return sum(last.values(), Decimal(0))


@dataclass
class SandboxMeter:
    """A run's sandbox account: prices, what it has been charged, and where storage is paid to.

    ``since`` starts at the sandbox's creation (its journaled step's time) and moves to each
    charge's ``storageThrough``; `record` is called with every charge, live or replayed, so a
    replay rebuilds the same total and the same ``since``.
    """

    price: SandboxPrice
    since: datetime
    spent: Decimal = Decimal(0)

    def reserve(
        self, *, cpu_limit_seconds: float, quota_bytes: int, timeout_seconds: float, now: datetime
    ) -> Decimal:
        """The amount to hold before a command (`reservation`), from ``since`` to ``now`` + timeout."""
        return reservation(
            self.price,
            cpu_limit_seconds=cpu_limit_seconds,
            quota_bytes=quota_bytes,
            held_seconds=(now - self.since).total_seconds(),
            timeout_seconds=timeout_seconds,
        )

    def charge(
        self, *, cpu_seconds: float, workspace_bytes: int, until: datetime, reserved: Decimal
    ) -> SandboxCharge:
        """What a finished command is charged: its CPU and the storage from ``since`` to ``until``,
        never more than ``reserved``. Not recorded yet: `record` its `SandboxCharge.fields`."""
        held = max(0.0, (until - self.since).total_seconds())
        cpu = cpu_cost(self.price, cpu_seconds)
        storage = storage_cost(self.price, max(0, int(workspace_bytes)), held)
        return SandboxCharge(
            cpu_seconds=float(cpu_seconds),
            workspace_bytes=max(0, int(workspace_bytes)),
            storage_seconds=held,
            through=max(until, self.since),
            cpu_usd=cpu,
            storage_usd=storage,
            reserved_usd=reserved,
            charged_usd=min(cpu + storage, reserved),
        )

    def record(self, value: Mapping[str, Any]) -> Decimal:
        """Count a recorded charge (a step's value with `SandboxCharge.fields`); returns it."""
        charged = sandbox_cost_of(value)
        self.spent += charged
        through = value.get("storageThrough")
        if isinstance(through, str) and through:
            try:
                moment = parse_timestamp(through)
            except ValueError:
                return charged
            self.since = max(self.since, moment)
        return charged


def cost_fields(model_usd: Decimal, sandbox_usd: Decimal) -> dict[str, str]:
    """A run's ``status.cost`` figures: ``totalUSD`` and ``modelUSD`` the model spend (what the
    caps count), ``sandboxUSD`` the sandbox's, ``billedUSD`` both (what a project Budget counts)."""
    return {
        "totalUSD": str(model_usd),
        "modelUSD": str(model_usd),
        "sandboxUSD": str(sandbox_usd),
        "billedUSD": str(model_usd + sandbox_usd),
    }
