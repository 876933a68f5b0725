"""The AgentGroup: runs of one agent under one limit and one cost cap, and the evaluation an
evaluation group runs and grades (document 002).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictBool, StrictInt, model_validator

from .durations import parse_duration
from .schema_common import API_VERSION, DnsLabel, ObjectMeta, OpenModel, StrictModel, UsdAmount

__all__ = [
    "GroupPhase",
    "GROUP_TERMINAL_PHASES",
    "MAX_PENDING_LIMIT",
    "GroupLimitsSpec",
    "MAX_EVALUATION_CASES",
    "EvaluationSpec",
    "AgentGroupSpec",
    "GroupCounts",
    "GroupCost",
    "UNSCORED_STATES",
    "CASE_STATES",
    "EvaluationEstimate",
    "EvaluationStatistics",
    "EvaluationStatus",
    "AgentGroupStatus",
    "AgentGroup",
]

GroupPhase = Literal["Running", "Cancelling", "Succeeded", "Failed", "Cancelled"]
GROUP_TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "Cancelled"})

MAX_PENDING_LIMIT = 10000


class GroupLimitsSpec(StrictModel):
    maxActive: StrictInt = Field(default=10, ge=1, le=1000)
    maxPending: StrictInt = Field(default=10000, ge=1, le=MAX_PENDING_LIMIT)


MAX_EVALUATION_CASES = 100
_ENVIRONMENT_REF = re.compile(
    r"^(?P<owner>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)"
    r"(@(?P<version>[0-9A-Za-z][0-9A-Za-z.+-]*))?$"
)
_EVALUATION_TIMEOUT = (timedelta(minutes=1), timedelta(hours=24))


def _validate_environment_ref(value: str) -> str:
    match = _ENVIRONMENT_REF.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f'{value[:80]!r} is not an Environment reference such as "nodus/arithmetic-v2@2.0.0" '
            "(owner/name@version)"
        )
    if match.group("version") is None:
        raise ValueError(
            f'{value!r} names no version; an evaluation pins one, e.g. "{value}@2.0.0" '
            "(`nodus get environments` lists the versions)"
        )
    return value


def _validate_evaluation_timeout(value: str) -> str:
    duration = parse_duration(value)
    low, high = _EVALUATION_TIMEOUT
    if duration < low or duration > high:
        raise ValueError(f"{value!r} is outside 1m to 24h")
    return value


class EvaluationSpec(StrictModel):
    """A versioned Environment's fixed task batch, run by the group and graded (document 002).

    ``timeout`` counts from the group's creation and covers queueing and funding waits: it is
    every member's absolute deadline, and grading stops at it too.
    """

    environment: Annotated[str, AfterValidator(_validate_environment_ref)]
    split: str = Field(default="test", min_length=1, max_length=63)
    tasks: StrictInt = Field(ge=1, le=MAX_EVALUATION_CASES)
    repetitions: StrictInt = Field(default=1, ge=1, le=MAX_EVALUATION_CASES)
    seed: StrictInt = Field(default=0, ge=0, le=2**63 - 1)
    timeout: Annotated[str, AfterValidator(_validate_evaluation_timeout)] = "30m"

    @model_validator(mode="after")
    def _bounded_batch(self) -> EvaluationSpec:
        if self.tasks * self.repetitions > MAX_EVALUATION_CASES:
            raise ValueError(
                f"tasks x repetitions is {self.tasks * self.repetitions}; an evaluation runs at most "
                f"{MAX_EVALUATION_CASES} cases"
            )
        return self


class AgentGroupSpec(StrictModel):
    """Runs of one agent under one concurrency limit and one cost cap.

    ``sealed`` and ``state: Cancelled`` are one-way: once set they cannot be unset, and
    ``maxCostUSD`` can only grow; the control plane enforces both on every update.
    """

    agent: DnsLabel
    limits: GroupLimitsSpec = Field(default_factory=GroupLimitsSpec)
    maxCostUSD: UsdAmount | None = None
    sealed: StrictBool = False
    state: Literal["Running", "Cancelled"] = "Running"
    evaluation: EvaluationSpec | None = None


class GroupCounts(OpenModel):
    queued: int = 0
    active: int = 0
    waiting: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    total: int = 0


class GroupCost(OpenModel):
    """``totalUSD``: the members' model spend (what ``maxCostUSD`` caps); ``gradingUSD``: the
    grader's sandbox compute, billed to the group; ``sandboxUSD``: the members' sandbox compute
    and the grading (decision 44)."""

    totalUSD: str = "0"
    limitUSD: str | None = None
    reservedUSD: str = "0"
    gradingUSD: str = "0"
    sandboxUSD: str = "0"


# A case's evaluation state. Pending: its run has not finished; Grading: the grader has its
# answer; Scored: a verdict and a reward. The rest are unscored, each for its own reason, and
# left out of the pass rate and the mean reward (a failure is not a zero reward).
UNSCORED_STATES: tuple[str, ...] = (
    "RunFailed",
    "RunCancelled",
    "MissingAnswer",
    "GraderFailed",
    "EvaluationTimeout",
    "GradingCancelled",
)
CASE_STATES: tuple[str, ...] = ("Pending", "Grading", "Scored", *UNSCORED_STATES)


class EvaluationEstimate(OpenModel):
    """A mean over scored cases with its standard error and 95% interval (decision 60).

    ``standardError`` and ``ci95`` are None below two clusters (tasks, or cases without
    repetitions); ``clusteredBy`` is ``"task"`` when the evaluation has repetitions; ``n`` counts
    the scored cases and ``tasks`` the tasks among them.
    """

    value: float
    standardError: float | None = None
    ci95: list[float] | None = None
    n: int
    clusteredBy: Literal["task"] | None = None
    tasks: int | None = None


class EvaluationStatistics(OpenModel):
    """``status.evaluation.statistics``: error bars, and pass@k / pass^k keyed by k ("1", "2", ...)."""

    passRate: EvaluationEstimate
    meanReward: EvaluationEstimate
    passAtK: dict[str, float] = Field(default_factory=dict)
    passHatK: dict[str, float] = Field(default_factory=dict)


class EvaluationStatus(OpenModel):
    """What the evaluation found so far; rates are over scored cases only (None before the first)."""

    environment: str
    version: str
    imageDigest: str | None = None
    split: str
    seed: int
    tasks: int
    repetitions: int
    cases: int
    deadlineAt: str | None = None
    scored: int = 0
    unscored: int = 0
    pending: int = 0
    passed: int = 0
    passRate: float | None = None
    meanReward: float | None = None
    unscoredReasons: dict[str, int] = Field(default_factory=dict)
    grading: dict[str, Any] = Field(default_factory=dict)
    statistics: EvaluationStatistics | None = None  # None until a case is scored


class AgentGroupStatus(OpenModel):
    phase: GroupPhase = "Running"
    reason: str | None = None
    message: str | None = None
    counts: GroupCounts = Field(default_factory=GroupCounts)
    # Why runs do not move on: queued runs by what they wait for (DependencyWait,
    # MaxActiveReached, MaxCostReached), and NeedsResolution: started runs that wait for a
    # person to resolve an interrupted step.
    blockedReasons: dict[str, int] = Field(
        default_factory=lambda: {
            "DependencyWait": 0,
            "MaxActiveReached": 0,
            "MaxCostReached": 0,
            "NeedsResolution": 0,
        }
    )
    # counts.waiting split by each run's own reason (NeedsResolution, AwaitingMessage,
    # InsufficientCredits, MaxCostReached); only the reasons some run waits for.
    waitingReasons: dict[str, int] = Field(default_factory=dict)
    cost: GroupCost = Field(default_factory=GroupCost)
    agentRevision: int | None = None
    finishedAt: str | None = None
    evaluation: EvaluationStatus | None = None
    # When an evaluation's per-case records lost their evidence (NODUS_PAYLOAD_RETENTION after
    # the group ended): its results then answer PayloadExpired; the counts above remain.
    payloadsExpiredAt: str | None = None


class AgentGroup(StrictModel):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["AgentGroup"] = "AgentGroup"
    metadata: ObjectMeta
    spec: AgentGroupSpec
    status: AgentGroupStatus | None = None
