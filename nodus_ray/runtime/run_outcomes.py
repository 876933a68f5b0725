"""How a run's program ended, as the outcome its actor answers (`RunOutcome`), and its cost.

The run actor drives the program; turning the way it stopped (an answer, a failure, a park on
the cap, the credits, the Budget, a message, a resolution) into the status fields the control
plane merges is a separate, pure concern: it reads only the run's config and the program's
turns and cost, so it lives here, testable without an actor, and the actor stays the sequence
of steps it runs.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from nodus.contract import ANSWER_PREVIEW_BYTES
from nodus.lifecycle import RunPhase, RunReason
from nodus_ray.control.client import RunOutcome
from nodus_ray.durable.steps import NeedsResolution
from nodus_ray.money.sandbox_billing import cost_fields
from nodus_ray.money.spend import BudgetExceeded, CapExceeded, CreditsExhausted
from nodus_ray.runtime.conversation import AwaitingMessage, Conversation, RunFailure
from nodus_ray.runtime.list_costs import list_cost_fields
from nodus_ray.runtime.program.ends import Parked
from nodus_ray.runtime.run_config import RunConfig
from nodus_ray.runtime.waiting import needs_resolution_message
from nodus_ray.sandbox.snapshots import WorkspaceLost
from nodus_ray.store.timestamps import utc_now

if TYPE_CHECKING:  # a program's run only: loaded then (`program.ends`)
    from nodus_ray.runtime.program.python_program import PythonProgram

__all__ = ["RUN_STOPS", "answered_outcome", "run_cost", "run_outcome", "stopped_outcome"]

# The ways a program stops short of an answer that end this actor's run with an outcome (a
# failure, or Waiting on what resuming needs); anything else is the actor's own fault.
RUN_STOPS = (
    RunFailure,
    WorkspaceLost,
    CapExceeded,
    CreditsExhausted,
    BudgetExceeded,
    Parked,
    AwaitingMessage,
    NeedsResolution,
)


def run_cost(config: RunConfig, conversation: Conversation | PythonProgram) -> dict[str, str | None]:
    """``status.cost``: the model spend, and the sandbox's (earlier generations' included);
    a BYOK run's list cost too (`list_costs`: shown, never billed)."""
    own = getattr(conversation, "sandbox_usd", Decimal(0))  # a program with no sandbox account: none
    sandbox = Decimal(config.prior_sandbox_usd) + own
    access = str((config.agent_spec.get("model") or {}).get("access") or "Nodus")
    return {**cost_fields(conversation.cost_usd, sandbox), **list_cost_fields(conversation.turns, access)}


def run_outcome(
    config: RunConfig,
    phase: RunPhase,
    reason: str,
    message: str | None,
    conversation: Conversation | PythonProgram,
    *,
    answer: str | None = None,
    step: str | None = None,
    read_seq: int | None = None,
    credits_needed: str | None = None,
    budget_needed: str | None = None,
    wake_at: str | None = None,
    waiting_for: dict[str, Any] | None = None,
) -> RunOutcome:
    """The outcome with the run's turns and cost, and what resuming a Waiting run needs."""
    fields: dict[str, Any] = {
        "turns": [turn.to_status() for turn in conversation.turns],
        "cost": run_cost(config, conversation),
    }
    if phase != RunPhase.WAITING:
        fields["finishedAt"] = utc_now()
    if step is not None:
        fields["step"] = step
    if read_seq is not None:
        fields["messages"] = {"read": read_seq}
    if credits_needed is not None:
        fields["creditsNeededUSD"] = credits_needed
    if budget_needed is not None:
        fields["budgetNeededUSD"] = budget_needed
    if wake_at is not None:
        fields["wakeAt"] = wake_at
    if waiting_for is not None:
        fields["waitingFor"] = waiting_for
    if answer is not None:
        encoded = answer.encode("utf-8")
        preview = encoded[:ANSWER_PREVIEW_BYTES].decode("utf-8", errors="ignore")
        fields["answer"] = {
            "preview": preview,
            "bytes": len(encoded),
            "truncated": len(encoded) > ANSWER_PREVIEW_BYTES,
        }
    return RunOutcome(phase=phase, reason=str(reason), message=message, **fields)


def answered_outcome(
    config: RunConfig, answer: str, conversation: Conversation | PythonProgram
) -> RunOutcome:
    """Succeeded with the answer: Completed, or MaxTokensReached when the model cut it."""
    cut = getattr(conversation, "stop_reason", None) == "max_tokens"
    reason = RunReason.MAX_TOKENS_REACHED if cut else RunReason.COMPLETED
    message = "the answer was cut at maxTokens" if cut else None
    return run_outcome(config, RunPhase.SUCCEEDED, reason, message, conversation, answer=answer)


def stopped_outcome(
    config: RunConfig,
    stop: Exception,
    conversation: Conversation | PythonProgram,
    allowed_hosts: list[str],
) -> RunOutcome:
    """The outcome of one of `RUN_STOPS`: Failed, or Waiting with what resuming needs."""
    waiting = RunPhase.WAITING
    if isinstance(stop, RunFailure):
        return run_outcome(config, RunPhase.FAILED, stop.reason, stop.message, conversation)
    if isinstance(stop, WorkspaceLost):
        return run_outcome(config, RunPhase.FAILED, RunReason.WORKSPACE_LOST, str(stop), conversation)
    if isinstance(stop, CapExceeded):
        return run_outcome(config, waiting, RunReason.MAX_COST_REACHED, str(stop), conversation)
    if isinstance(stop, CreditsExhausted):
        message = f"{stop}; it continues when credits are added"
        return run_outcome(
            config,
            waiting,
            RunReason.INSUFFICIENT_CREDITS,
            message,
            conversation,
            credits_needed=str(stop.needed),
        )
    if isinstance(stop, BudgetExceeded):
        message = f"{stop}; it continues when the Budget is raised or its next period begins"
        return run_outcome(
            config, waiting, RunReason.BUDGET_EXCEEDED, message, conversation, budget_needed=str(stop.needed)
        )
    if isinstance(stop, Parked):
        return run_outcome(
            config,
            waiting,
            stop.reason,
            stop.message,
            conversation,
            wake_at=stop.wake_at,
            waiting_for=stop.waiting_for,
        )
    if isinstance(stop, AwaitingMessage):
        return run_outcome(
            config,
            waiting,
            RunReason.AWAITING_MESSAGE,
            f"turn {stop.turn} is answered; the run reads the next message sent to it",
            conversation,
            answer=getattr(conversation, "answer", None),
            read_seq=getattr(conversation, "read_seq", None),
        )
    if isinstance(stop, NeedsResolution):
        message = needs_resolution_message(stop, config.name, allowed_hosts)
        return run_outcome(
            config, waiting, RunReason.NEEDS_RESOLUTION, message, conversation, step=stop.step_id
        )
    raise stop  # not a way a run stops: the actor's own fault, as before
