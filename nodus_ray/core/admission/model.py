"""What admission talks about: run states and reasons, the group's limits, a member, a decision
and the group's status. Plain data; the rules are in :mod:`.state`."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from nodus_ray.core.admission.errors import _check_int, _check_money, _usd

__all__ = ["GroupLimits", "Member", "GroupStatus", "Decision"]

QUEUED = "Queued"
ACTIVE = "Active"
WAITING = "Waiting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
CANCELLED = "Cancelled"

_STATES = frozenset({QUEUED, ACTIVE, WAITING, SUCCEEDED, FAILED, CANCELLED})
_STARTED = frozenset({ACTIVE, WAITING})
_TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})

DEPENDENCY_WAIT = "DependencyWait"
GROUP_WAIT = "GroupWait"
MAX_ACTIVE_REACHED = "MaxActiveReached"
MAX_COST_REACHED = "MaxCostReached"
# A started run waiting for a person to decide an interrupted step (counted in blockedReasons
# beside the reasons queued runs wait for: it holds the group back until someone resolves it).
NEEDS_RESOLUTION = "NeedsResolution"
# A started run whose next model call waits for the cluster-wide rate limiter (it keeps its
# actor and its maxActive slot): counted in blockedReasons too, so a slow group says why.
RATE_LIMITED = "RateLimited"
# A keep-alive run that answered and waits for its next message: it holds no maxActive slot
# (it does no work), only its cost reservation. When a message comes it waits Waiting /
# ``GroupWait`` for a free slot, and is resumed before any queued run starts (decision 48).
AWAITING_MESSAGE = "AwaitingMessage"
# Waiting runs with these reasons hold no maxActive slot (each still holds its reservation).
_IDLE_REASONS = frozenset({AWAITING_MESSAGE, GROUP_WAIT})
DEPENDENCY_FAILED = "DependencyFailed"
DEPENDENCY_CANCELLED = "DependencyCancelled"
GROUP_CANCELLED = "GroupCancelled"
RUNS_FAILED = "RunsFailed"

MAX_ACTIVE_MIN, MAX_ACTIVE_MAX = 1, 1000


@dataclass(frozen=True)
class GroupLimits:
    """The group's limits: ``spec.limits.maxActive``, ``spec.limits.maxPending``, ``spec.maxCostUSD``.

    ``max_cost`` None means the group has no cost cap (each run still has its own).
    """

    max_active: int = 10
    max_pending: int = 10000
    max_cost: Decimal | None = None

    def __post_init__(self) -> None:
        _check_int(self.max_active, MAX_ACTIVE_MIN, MAX_ACTIVE_MAX, "spec.limits.maxActive", "maxActive")
        _check_int(self.max_pending, 1, None, "spec.limits.maxPending", "maxPending")
        if self.max_cost is not None:
            _check_money(self.max_cost, "spec.maxCostUSD", "maxCostUSD")


@dataclass
class Member:
    """One run of the group as admission sees it.

    ``cap`` is the run's own cap (the agent's perRunMaxCostUSD, copied when the run was created);
    ``Decimal(0)`` for a BYOK run, which Nodus does not charge and which therefore reserves
    nothing. ``state`` is Queued (admission's), Active or Waiting (started, unfinished) or a
    terminal state; ``reason`` says why (GroupWait/DependencyWait while queued, the cancel
    reason once cancelled). ``spent`` is the run's model spend so far.
    """

    key: str
    run: str
    cap: Decimal
    depends_on: tuple[str, ...] = ()
    state: str = QUEUED
    reason: str | None = None
    spent: Decimal = Decimal(0)

    @property
    def reservation(self) -> Decimal:
        """What a started, unfinished run may still spend: its cap minus its spend (never below 0)."""
        return max(self.cap - self.spent, Decimal(0)) if self.state in _STARTED else Decimal(0)


@dataclass(frozen=True)
class GroupStatus:
    """The group's ``status``: phase, counts, why queued runs wait (how many for each reason),
    and the cost. Each queued run's own reason is `Admission.queued_reasons`.

    ``blocked_reasons`` also counts, as ``NeedsResolution``, the started runs that wait for a
    person to resolve an interrupted step: nothing but a person moves them (or the group) on.
    ``waiting_reasons`` splits ``counts["waiting"]`` by each run's own reason (only reasons
    with runs), so a stuck group says which of its runs wait for what.
    """

    phase: str
    reason: str | None
    message: str | None
    counts: dict[str, int]
    blocked_reasons: dict[str, int]
    cost_total: Decimal
    cost_limit: Decimal | None
    reserved: Decimal
    waiting_reasons: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The API's camelCase shape, money as strings (JSON numbers would be floats)."""
        return {
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "counts": dict(self.counts),
            "blockedReasons": dict(self.blocked_reasons),
            "waitingReasons": dict(self.waiting_reasons),
            "cost": {
                "totalUSD": _usd(self.cost_total),
                "limitUSD": None if self.cost_limit is None else _usd(self.cost_limit),
                "reservedUSD": _usd(self.reserved),
            },
        }


@dataclass(frozen=True)
class Decision:
    """What the supervisor must do now, and the group's status after it.

    ``start``: run names to start, in admission (creation) order; each is already Active and its
    cap reserved. ``cancel``: ``(run name, reason)`` with reason DependencyFailed,
    DependencyCancelled or GroupCancelled. A queued run in ``cancel`` is already Cancelled here
    (the supervisor writes its phase); a started one stays Active/Waiting until it reports a
    terminal state.
    """

    start: list[str]
    cancel: list[tuple[str, str]]
    status: GroupStatus
