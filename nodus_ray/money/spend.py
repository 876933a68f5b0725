"""A run's spending rules in one place: price a call, check it against the cap, hold credits
and the project's Budget.

The conversation asks three things before and after each routing or model call: what could
this call cost at its largest (`worst`), may it go ahead (`before_call`: the cap first, then
the project's credits, waiting for a grant if they ran out, then the project's Budget), and
what did it cost (`price`). A charge is never more than the worst case checked for it nor than
the cap leaves, so the run's spend cannot pass its cap.

Sandbox work is held against the Budget too (`before_sandbox`, called before each command with
the command's largest price): the Budget counts everything billed, model and sandbox, and is
never passed because every charge was held against it before it could accrue.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal

from nodus_ray.models.base import Usage
from nodus_ray.money.billing import CapExceeded, RunBudget, billed_cost, billed_worst_case
from nodus_ray.money.prices import PriceTable

__all__ = ["BudgetExceeded", "CapExceeded", "CreditsExhausted", "RunSpend"]


class CreditsExhausted(Exception):  # noqa: N818 - a state the run waits in, not an error
    """The project's credits cannot hold the next call's worst case: the run waits for more.

    Raised before the call's step is journaled, so a run resumed later arrives at the same call
    and checks again.
    """

    def __init__(self, needed: Decimal):
        super().__init__(f"the next call may cost up to ${needed}, more than the project's credits")
        self.needed = needed


class BudgetExceeded(Exception):  # noqa: N818 - a state the run waits in, not an error
    """The project's Budget cannot hold the next call's or command's largest price: the run
    waits (parked, no actor) until the Budget is raised or a new period begins.

    Raised before the step is journaled, so a run resumed later arrives at the same step and
    reserves again.
    """

    def __init__(self, needed: Decimal):
        super().__init__(f"the next step may cost up to ${needed}, more than the project's Budget has left")
        self.needed = needed


async def _no_budget(amount: Decimal) -> None:
    """The default: nothing to hold (tests and benchmarks without a control plane)."""


@dataclass
class RunSpend:
    prices: PriceTable
    access: str  # "Nodus" (billed, capped, paid from credits) or "BYOK" (free, uncapped)
    budget: RunBudget
    reserve_credits: Callable[[Decimal], Awaitable[None]]
    # Holds an amount against the project's Budget, or raises BudgetExceeded (the run actor's
    # `_reserve_budget`); one reservation per run, each replacing the one before.
    reserve_budget: Callable[[Decimal], Awaitable[None]] = _no_budget
    # A sandbox hold that stays outstanding while later steps reserve: a Python program's
    # process runs (and spends CPU) across the model calls it makes. The Budget keeps one
    # reservation per run, each replacing the one before, so every later reservation includes
    # it until the process's charge is recorded (`hold_standing` / `release_standing`).
    standing: Decimal = Decimal(0)

    def worst(self, model: str, input_tokens: int, max_output_tokens: int) -> Decimal:
        # BYOK: zero, with no price needed (the user's key may call any model; nothing is billed)
        return billed_worst_case(self.prices, self.access, model, input_tokens, max_output_tokens)

    def price(self, model: str, usage: Usage, reserved: Decimal) -> Decimal:
        """What a finished call is charged: its billed cost, within what was checked and what is left."""
        charged = min(billed_cost(self.prices, self.access, model, usage), reserved)
        remaining = self.budget.remaining()
        return charged if remaining is None else max(Decimal(0), min(charged, remaining))

    async def before_call(self, checked: Decimal, reserved: Decimal) -> None:
        """Refuse a call whose worst case (``checked``) does not fit; hold ``reserved`` of credits
        and of the project's Budget (Nodus access only: a BYOK call bills nothing)."""
        self.budget.require(checked)
        if self.access == "Nodus" and reserved > 0:
            await self.reserve_credits(reserved)
            await self.reserve_budget(reserved + self.standing)

    async def before_sandbox(self, amount: Decimal) -> None:
        """Hold a command's largest sandbox price against the project's Budget (any access:
        sandbox compute is billed with BYOK too); raises `BudgetExceeded` when it does not fit."""
        if amount > 0:
            await self.reserve_budget(amount + self.standing)

    async def hold_standing(self, amount: Decimal) -> None:
        """Hold a long-lived process's largest sandbox price, kept in every later reservation
        until `release_standing`; raises `BudgetExceeded` when it does not fit."""
        self.standing = Decimal(0)
        await self.before_sandbox(amount)
        self.standing = amount

    def release_standing(self) -> None:
        """The process ended and its charge is recorded: later reservations no longer carry it."""
        self.standing = Decimal(0)

    def record(self, charged: Decimal) -> None:
        """Add a charge (live, or read back from the journal on replay)."""
        self.budget.spent += charged
