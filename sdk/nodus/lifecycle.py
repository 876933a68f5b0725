"""The lifecycles of an AgentRun and an AgentGroup: phases, reasons and the allowed transitions.

One module owns them so that the engine, the control plane, Serve and the SDK spell a phase
one way and agree on which phase may follow which. The enums are ``StrEnum``: a member *is*
its string, so the wire (JSON, the stored resources, the API documents) keeps exactly the
words of the product documents, and ``RunPhase.RUNNING == "Running"`` holds.

A reason is an open set on the wire: a run refused before it starts carries the refusing
error's code (``SecretNotFound``, ...), so ``status.reason`` stays a string. The enums list
the reasons nodus itself writes.

Every change of phase goes through :func:`check_run_transition` / :func:`check_group_transition`
(or :func:`run_transition`, which also builds the status patch); an illegal change raises
:class:`IllegalTransition` instead of silently reviving a finished run. The tables below are
what the engine does today (control plane, supervision, run actor, group admission); a change
to the lifecycle is a change to these tables first.

This module is pure (no Ray, no I/O, no clock) and imports nothing from nodus.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

__all__ = [
    "RunPhase",
    "GroupPhase",
    "RunReason",
    "GroupReason",
    "BlockedReason",
    "RUN_PHASES",
    "GROUP_PHASES",
    "RUN_TERMINAL_PHASES",
    "GROUP_TERMINAL_PHASES",
    "PARKED_REASONS",
    "WAITING_FIELDS",
    "RUN_TRANSITIONS",
    "RUN_RETRY_TRANSITIONS",
    "RUN_QUEUE_TRANSITIONS",
    "GROUP_TRANSITIONS",
    "IllegalTransition",
    "check_run_transition",
    "check_group_transition",
    "run_transition",
    "retry_transition",
    "queue_transition",
    "is_terminal",
    "is_parked",
]


class RunPhase(StrEnum):
    """``status.phase`` of an AgentRun."""

    PENDING = "Pending"  # created; queued in its group, or waiting for its actor to start
    RUNNING = "Running"
    WAITING = "Waiting"  # parked: see PARKED_REASONS
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class GroupPhase(StrEnum):
    """``status.phase`` of an AgentGroup."""

    RUNNING = "Running"
    CANCELLING = "Cancelling"  # cancelled; unfinished runs (or cases being graded) still stopping
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class RunReason(StrEnum):
    """``status.reason`` values of an AgentRun that nodus writes, grouped by the phase they go with."""

    # Pending: queued in a group (GroupWait also: Waiting, a keep-alive member a message came to,
    # until its group has a free maxActive slot)
    DEPENDENCY_WAIT = "DependencyWait"
    GROUP_WAIT = "GroupWait"
    # Pending: its Agent's spec.maxWorkers runs hold an actor; it starts when one parks or ends
    MAX_WORKERS_REACHED = "MaxWorkersReached"
    # Waiting
    AWAITING_MESSAGE = "AwaitingMessage"
    SLEEPING = "Sleeping"  # a Python program's ctx.sleep: a timer starts it again (status.wakeAt)
    AWAITING_CHILDREN = "AwaitingChildren"  # ctx.gather/map on children that have not ended
    SUSPENDED = "Suspended"  # AgentRun.suspend(): parked until resume()
    NEEDS_RESOLUTION = "NeedsResolution"
    MAX_COST_REACHED = "MaxCostReached"
    INSUFFICIENT_CREDITS = "InsufficientCredits"
    # the project's Budget (kind Budget) cannot hold the next call's or command's worst case; the
    # run goes on when the budget is raised or a new period starts
    BUDGET_EXCEEDED = "BudgetExceeded"
    # the cluster-wide rate limiter holds the run's next model call back (NODUS_RATE_LIMITS); the
    # run keeps its actor (not parked) and goes back to Running when the call is sent
    RATE_LIMITED = "RateLimited"
    # Succeeded
    COMPLETED = "Completed"
    MAX_TOKENS_REACHED = "MaxTokensReached"
    # Failed
    MODEL_ERROR = "ModelError"
    MODEL_UNAVAILABLE = "ModelUnavailable"
    MODEL_REFUSED = "ModelRefused"
    MODEL_AUTHENTICATION_FAILED = "ModelAuthenticationFailed"
    MODEL_REQUEST_INVALID = "ModelRequestInvalid"
    MAX_TOOL_CALLS_REACHED = "MaxToolCallsReached"
    WORKSPACE_LOST = "WorkspaceLost"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    RUNNER_LOST = "RunnerLost"
    INTERNAL_ERROR = "InternalError"
    PROGRAM_FAILED = "ProgramFailed"  # a Python program raised (status.message: the exception)
    SANDBOX_UNAVAILABLE = "SandboxUnavailable"  # a Python program on a node without bubblewrap
    IMAGE_PULL_FAILED = "ImagePullFailed"  # spec.image could not be resolved, pulled or unpacked
    STEP_CANCELLED = "StepCancelled"
    NON_DETERMINISTIC = "NonDeterministic"  # replay met a recorded step the program no longer asks for
    # Cancelled
    CANCELLED = "Cancelled"  # on request, or because the run was deleted
    DEPENDENCY_FAILED = "DependencyFailed"
    DEPENDENCY_CANCELLED = "DependencyCancelled"
    GROUP_CANCELLED = "GroupCancelled"


class GroupReason(StrEnum):
    """``status.reason`` values of an AgentGroup."""

    RUNS_FAILED = "RunsFailed"
    GROUP_CANCELLED = "GroupCancelled"  # an evaluation group that was cancelled
    NO_CASES_SCORED = "NoCasesScored"  # an evaluation with nothing scored
    EVALUATED = "Evaluated"  # an evaluation with at least one case scored


class BlockedReason(StrEnum):
    """Keys of a group's ``status.blockedReasons``: why its queued runs have not started, and
    how many started runs wait for a person to resolve an interrupted step."""

    DEPENDENCY_WAIT = "DependencyWait"
    MAX_ACTIVE_REACHED = "MaxActiveReached"
    MAX_COST_REACHED = "MaxCostReached"
    BUDGET_EXCEEDED = "BudgetExceeded"  # the project's Budget has no room: the group admits nothing
    NEEDS_RESOLUTION = "NeedsResolution"
    RATE_LIMITED = "RateLimited"  # started members waiting for the rate limiter (they keep their slot)


RUN_PHASES: tuple[RunPhase, ...] = tuple(RunPhase)
GROUP_PHASES: tuple[GroupPhase, ...] = tuple(GroupPhase)

RUN_TERMINAL_PHASES: frozenset[RunPhase] = frozenset(
    {RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED}
)
GROUP_TERMINAL_PHASES: frozenset[GroupPhase] = frozenset(
    {GroupPhase.SUCCEEDED, GroupPhase.FAILED, GroupPhase.CANCELLED}
)

# Waiting runs that hold no actor: the supervision gives the actor back (``actorName`` None)
# when a run parks for any of these, and nothing moves the run on but a person (a message,
# credits, a resolution, a cancel) or its deadline. A run waiting for credits is one of them:
# it continues in a new actor, which replays its journal, when credits are added.
PARKED_REASONS: frozenset[RunReason] = frozenset(
    {
        RunReason.NEEDS_RESOLUTION,
        RunReason.MAX_COST_REACHED,
        RunReason.AWAITING_MESSAGE,
        RunReason.INSUFFICIENT_CREDITS,
        RunReason.BUDGET_EXCEEDED,
        RunReason.SLEEPING,
        RunReason.AWAITING_CHILDREN,
        RunReason.SUSPENDED,
        # a keep-alive group member a message came to, waiting for a free maxActive slot of its
        # group to read it (Waiting / GroupWait; queued runs are Pending / GroupWait)
        RunReason.GROUP_WAIT,
    }
)

# Status fields that describe what a parked (Waiting) run waits for; gone when it leaves Waiting.
WAITING_FIELDS: tuple[str, ...] = ("wakeAt", "waitingFor")

_P, _R, _W = RunPhase.PENDING, RunPhase.RUNNING, RunPhase.WAITING
_S, _F, _C = RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED

# from -> the phases it may become. A finished run never changes phase again. Who does each:
# Pending -> Pending      a queued run's reason changes, or it is admitted (reason cleared)
# Pending -> Running      its actor starts the program
# Pending -> Failed       refused before it starts (a missing secret), its actor lost or not
#                         startable, or its deadline passed while queued
# Running -> Running      a replacement actor starts the program again (replay)
# Running -> Waiting      the program parked (a message, a resolution, the cap, credits, a
#                         timer, children), or the run was suspended; or its next model call
#                         waits for the rate limiter (RateLimited: it keeps its actor)
# Running -> Succeeded / Failed    the program ended
# Waiting -> Running      a message, credits, a resolution, a wake timer, a child's end or a
#                         resume arrived, or the rate limiter let its call go
#                         (suspending a parked run changes its reason only, not its phase)
# Waiting -> Failed       the deadline passed while parked, or a step was resolved Cancelled
# * -> Cancelled          on request, on delete, or by its group (dependency, group cancel)
RUN_TRANSITIONS: Mapping[RunPhase, frozenset[RunPhase]] = {
    _P: frozenset({_P, _R, _F, _C}),
    _R: frozenset({_R, _W, _S, _F, _C}),
    _W: frozenset({_R, _F, _C}),
    _S: frozenset(),
    _F: frozenset(),
    _C: frozenset(),
}

# The one way out of a finished phase, and only for `retry` (AgentRun.retry()): a Failed run
# runs again from its journal (completed steps kept). It is a table of its own, so that no
# report, outcome or status merge (which check RUN_TRANSITIONS) can ever revive a finished run.
RUN_RETRY_TRANSITIONS: Mapping[RunPhase, frozenset[RunPhase]] = {_F: frozenset({_R})}

# The one way back to Pending, and only for the Agent's worker queue (`queue_transition`): a run
# woken, resumed or retried (Running, no actor yet) while its Agent is at spec.maxWorkers waits
# for a worker. A table of its own too: no report or outcome moves a Running run back.
RUN_QUEUE_TRANSITIONS: Mapping[RunPhase, frozenset[RunPhase]] = {_R: frozenset({_P})}

# Running -> Running: counts, cost, messages change; Running -> Cancelling when cancelled with
# runs (or cases) unfinished; Cancelling -> Cancelled once they stopped; a sealed group ends.
GROUP_TRANSITIONS: Mapping[GroupPhase, frozenset[GroupPhase]] = {
    GroupPhase.RUNNING: frozenset(
        {
            GroupPhase.RUNNING,
            GroupPhase.CANCELLING,
            GroupPhase.SUCCEEDED,
            GroupPhase.FAILED,
            GroupPhase.CANCELLED,
        }
    ),
    GroupPhase.CANCELLING: frozenset({GroupPhase.CANCELLING, GroupPhase.CANCELLED}),
    GroupPhase.SUCCEEDED: frozenset(),
    GroupPhase.FAILED: frozenset(),
    GroupPhase.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    """A phase change the lifecycle does not allow (a bug in the caller, never a user error)."""

    def __init__(self, kind: str, frm: str, to: str):
        super().__init__(f"{kind} cannot go from phase {frm!r} to {to!r}")
        self.kind = kind
        self.frm = frm
        self.to = to


def _run_phase(kind: str, value: str, frm: str, to: str) -> RunPhase:
    try:
        return RunPhase(value)
    except ValueError:
        raise IllegalTransition(kind, frm, to) from None


def check_run_transition(frm: str, to: str) -> RunPhase:
    """``to`` as a :class:`RunPhase` when an AgentRun may go from ``frm`` to it, else raise."""
    source, target = _run_phase("AgentRun", frm, frm, to), _run_phase("AgentRun", to, frm, to)
    if target not in RUN_TRANSITIONS[source]:
        raise IllegalTransition("AgentRun", frm, to)
    return target


def check_group_transition(frm: str, to: str) -> GroupPhase:
    """``to`` as a :class:`GroupPhase` when an AgentGroup may go from ``frm`` to it, else raise."""
    try:
        source, target = GroupPhase(frm), GroupPhase(to)
    except ValueError:
        raise IllegalTransition("AgentGroup", frm, to) from None
    if target not in GROUP_TRANSITIONS[source]:
        raise IllegalTransition("AgentGroup", frm, to)
    return target


def run_transition(
    status: Mapping[str, Any], to: str, reason: str | None, message: str | None = None
) -> dict[str, Any]:
    """The status patch that moves a run whose status is ``status`` to ``to`` for ``reason``.

    Raises :class:`IllegalTransition` when the lifecycle does not allow it. The patch holds
    ``phase``, ``reason`` and ``message`` (plain strings, as stored); the caller adds the rest
    (``finishedAt``, ``answer``, ...) and merges it.
    """
    frm = str(status.get("phase") or RunPhase.PENDING)
    target = check_run_transition(frm, to)
    return _patch(status, frm, target, reason, message)


def retry_transition(status: Mapping[str, Any], message: str | None = None) -> dict[str, Any]:
    """The patch that moves a Failed run back to Running for a retry (and only for one: see
    :data:`RUN_RETRY_TRANSITIONS`); raises :class:`IllegalTransition` for any other phase."""
    frm = str(status.get("phase") or RunPhase.PENDING)
    source = _run_phase("AgentRun", frm, frm, RunPhase.RUNNING)
    if RunPhase.RUNNING not in RUN_RETRY_TRANSITIONS.get(source, frozenset()):
        raise IllegalTransition("AgentRun", frm, RunPhase.RUNNING)
    return _patch(status, frm, RunPhase.RUNNING, None, message)


def queue_transition(status: Mapping[str, Any], message: str | None = None) -> dict[str, Any]:
    """The patch that moves a Running run with no actor back to Pending ``MaxWorkersReached``
    (see :data:`RUN_QUEUE_TRANSITIONS`); raises :class:`IllegalTransition` for any other phase."""
    frm = str(status.get("phase") or RunPhase.PENDING)
    source = _run_phase("AgentRun", frm, frm, RunPhase.PENDING)
    if RunPhase.PENDING not in RUN_QUEUE_TRANSITIONS.get(source, frozenset()):
        raise IllegalTransition("AgentRun", frm, RunPhase.PENDING)
    return _patch(status, frm, RunPhase.PENDING, RunReason.MAX_WORKERS_REACHED, message)


def _patch(
    status: Mapping[str, Any], frm: str, target: RunPhase, reason: str | None, message: str | None
) -> dict[str, Any]:
    patch: dict[str, Any] = {
        "phase": target.value,
        "reason": None if reason is None else str(reason),
        "message": message,
    }
    if frm == RunPhase.WAITING and target != RunPhase.WAITING:
        # What a parked program waited for (its timer, a message, its children) is over once it
        # leaves Waiting: cleared, only when set, so other runs' statuses stay as they were.
        patch.update({field: None for field in WAITING_FIELDS if status.get(field) is not None})
    return patch


def is_terminal(phase: str) -> bool:
    """True for a finished run's or group's phase (Succeeded, Failed, Cancelled)."""
    return phase in RUN_TERMINAL_PHASES


def is_parked(phase: str, reason: str | None) -> bool:
    """True for a Waiting run that holds no actor (see :data:`PARKED_REASONS`)."""
    return phase == RunPhase.WAITING and reason in PARKED_REASONS
