"""The final record of one evaluation case, from how its run ended and what its grader said.

`EvaluationService` decides when a case is graded and holds its grading against the Budget;
what record each way of ending comes to (unscored, timed out, cancelled, scored, a failed
grader, and its billed grading compute) is pure, so it is kept here, apart from the service's
orchestration, and reads the same after a restart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from nodus.lifecycle import RunPhase
from nodus_ray.core.evaluation import Case, final_record
from nodus_ray.money.prices import PriceTable
from nodus_ray.money.sandbox_billing import cpu_cost
from nodus_ray.store.timestamps import parse_timestamp, utc_now

__all__ = [
    "GRADING_HOLD_CPU_SECONDS",
    "cancelled_record",
    "graded_record",
    "seconds_left",
    "timeout_record",
    "ungradable_record",
]

# What a case's grading is held at against the project's Budget: this many CPU-seconds at the
# price table's cpuSecondUSD. Its charge is its measured CPU, at most that.
GRADING_HOLD_CPU_SECONDS = 60.0


def seconds_left(group: dict[str, Any]) -> float:
    """How long until the evaluation's deadline (negative once it passed)."""
    deadline = parse_timestamp(group["status"]["evaluation"]["deadlineAt"])
    return (deadline - datetime.now(UTC)).total_seconds()


def cancelled_record(case: Case) -> dict[str, Any]:
    """The case of a cancelled group: unscored, since grading stopped."""
    return final_record(case, "GradingCancelled", evidence="the group was cancelled", at=utc_now())


def timeout_record(case: Case, evidence: str) -> dict[str, Any]:
    """The case could not be graded before the evaluation's deadline; the evidence says why."""
    return final_record(case, "EvaluationTimeout", at=utc_now(), evidence=evidence)


def ungradable_record(case: Case, group: dict[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a case whose run did not succeed, or whose group was cancelled; None when
    it is to be graded."""
    phase = status["phase"]
    if phase != RunPhase.SUCCEEDED:
        state = "RunFailed" if phase == RunPhase.FAILED else "RunCancelled"
        return final_record(
            case, state, reason=status.get("reason"), evidence=status.get("message") or "", at=utc_now()
        )
    if group["spec"].get("state") == "Cancelled":
        return cancelled_record(case)
    return None


def graded_record(case: Case, outcome: dict[str, Any], held: Decimal, prices: PriceTable) -> dict[str, Any]:
    """The grader's answer as the case's record, billed its measured CPU, never more than held."""
    cpu = float(outcome.get("cpuSeconds") or 0.0)
    usd = str(min(cpu_cost(prices.sandbox, cpu), held))  # never more than was held
    if outcome["outcome"] == "scored":
        return final_record(
            case,
            "Scored",
            verdict=outcome["verdict"],
            reward=outcome["reward"],
            evidence=outcome["evidence"],
            seconds=outcome["seconds"],
            at=utc_now(),
            grading_cpu_seconds=cpu,
            grading_usd=usd,
        )
    return final_record(
        case,
        "GraderFailed",
        evidence=outcome["evidence"],
        seconds=outcome.get("seconds"),
        at=utc_now(),
        grading_cpu_seconds=cpu,
        grading_usd=usd,
    )
