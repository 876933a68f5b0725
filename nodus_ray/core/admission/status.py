"""A group's status from its ledger: phase, reason, message, counts, blocked reasons and cost.

The group is Running until it is sealed and every run is terminal, then Succeeded, or Failed
with ``RunsFailed`` when a run failed or was cancelled because a dependency failed. After a
group cancel the phase is Cancelling until every run is terminal, then Cancelled.
"""

from __future__ import annotations

from decimal import Decimal

from nodus_ray.core.admission.errors import _usd
from nodus_ray.core.admission.ledger import _Ledger, _Plan
from nodus_ray.core.admission.model import (
    ACTIVE,
    AWAITING_MESSAGE,
    CANCELLED,
    FAILED,
    NEEDS_RESOLUTION,
    QUEUED,
    RATE_LIMITED,
    RUNS_FAILED,
    SUCCEEDED,
    WAITING,
    GroupLimits,
    GroupStatus,
)

__all__ = ["_group_status"]


def _group_status(
    plan: _Plan, ledger: _Ledger, limits: GroupLimits, *, sealed: bool, cancelled: bool, total: int
) -> GroupStatus:
    """The group's status: its phase, the message that explains it, counts and cost."""
    counts = {
        state.lower(): ledger.counts[state]
        for state in (QUEUED, ACTIVE, WAITING, SUCCEEDED, FAILED, CANCELLED)
    }
    counts["total"] = total
    unfinished = ledger.unfinished()
    failed = counts["failed"]
    dependency_failed = ledger.dependency_failed

    reason: str | None = None
    message: str | None = None
    if cancelled:
        if unfinished:
            phase = "Cancelling"
            message = f"waiting for {unfinished} unfinished run{_s(unfinished)} to stop"
        else:
            phase = "Cancelled"
            message = f"cancelled; {counts['succeeded']} of {total} runs had succeeded"
    elif sealed and not unfinished:
        if failed or dependency_failed:
            phase, reason = "Failed", RUNS_FAILED
            parts = []
            if failed:
                parts.append(f"{failed} run{_s(failed)} failed")
            if dependency_failed:
                parts.append(
                    f"{dependency_failed} run{_s(dependency_failed)} "
                    f"{'was' if dependency_failed == 1 else 'were'} cancelled because a dependency failed"
                )
            message = " and ".join(parts)
        else:
            phase = "Succeeded"
            message = f"{counts['succeeded']} of {total} runs succeeded" if total else "sealed with no runs"
    else:
        phase = "Running"
        message = (
            _running_message(
                plan,
                ledger.spent,
                limits,
                sealed=sealed,
                total=total,
                unfinished=unfinished,
                reserved=ledger.reserved,
            )
            or _person_message(ledger.waiting[NEEDS_RESOLUTION])
            or _idle_message(ledger.waiting[AWAITING_MESSAGE], unfinished)
        )
    return GroupStatus(
        phase=phase,
        reason=reason,
        message=message,
        counts=counts,
        blocked_reasons={
            **plan.blocked,
            NEEDS_RESOLUTION: ledger.waiting[NEEDS_RESOLUTION],
            # present while members wait for the rate limiter (a passing state, unlike the rest)
            **({RATE_LIMITED: ledger.waiting[RATE_LIMITED]} if ledger.waiting[RATE_LIMITED] else {}),
        },
        waiting_reasons=dict(sorted(ledger.waiting.items())),
        # A running sum that came back to zero reads "0.00"; the API says "0".
        cost_total=ledger.spent or Decimal(0),
        cost_limit=limits.max_cost,
        reserved=ledger.reserved or Decimal(0),
    )


def _running_message(
    plan: _Plan,
    spent: Decimal,
    limits: GroupLimits,
    *,
    sealed: bool,
    total: int,
    unfinished: int,
    reserved: Decimal = Decimal(0),
) -> str | None:
    """What a Running group's status says: why it is stuck on its cap, or that it awaits a seal."""
    limit = limits.max_cost
    if plan.busy == 0 and limit is not None and plan.stuck is not None:
        # Nothing runs and nothing can start: only a larger cap (or smaller run caps) helps.
        stuck = plan.stuck
        if limit < stuck.cap:
            return (
                f"maxCostUSD ${_usd(limit)} is below a run's cap ${_usd(stuck.cap)}: "
                "raise the cap or lower perRunMaxCostUSD"
            )
        if reserved:  # keep-alive runs waiting for a message hold what they may still spend
            return (
                f"the group has spent ${_usd(spent)} of its maxCostUSD ${_usd(limit)} and its waiting "
                f"keep-alive runs hold ${_usd(reserved)}; the ${_usd(limit - spent - reserved)} left is "
                f"below a run's cap ${_usd(stuck.cap)}: raise the cap, or cancel runs that wait"
            )
        return (
            f"the group has spent ${_usd(spent)} of its maxCostUSD ${_usd(limit)}; the "
            f"${_usd(limit - spent)} left is below a run's cap ${_usd(stuck.cap)}: raise the cap"
        )
    if not sealed and total and not unfinished:
        return "every run has finished; the group finishes once it is sealed"
    return None


def _person_message(waiting: int) -> str | None:
    """What a Running group says while runs wait for a person: until someone resolves each
    one's interrupted step, the group cannot finish (and each holds a maxActive slot)."""
    if not waiting:
        return None
    return (
        f"{waiting} run{_s(waiting)} {'waits' if waiting == 1 else 'wait'} for a person: an interrupted "
        "command may have reached outside its sandbox; resolve the step its status names "
        "(`nodus agentrun resolve`)"
    )


def _idle_message(idle: int, unfinished: int) -> str | None:
    """What a Running group says when all that is left are keep-alive runs waiting for a
    message: they hold no maxActive slot but keep the group Running (and their reservations)
    until they end (a cancel, their deadline)."""
    if not idle or idle != unfinished:
        return None
    return (
        f"{idle} keep-alive run{_s(idle)} {'waits' if idle == 1 else 'wait'} for a message; the group "
        "finishes once they end: send them messages, cancel them, or let their deadline pass"
    )


def _s(count: int) -> str:
    return "" if count == 1 else "s"
