"""A run's spending rules in one place: price a call, check it against the cap, hold credits.

The conversation asks three things before and after each routing or model call: what could
this call cost at its largest (`worst`), may it go ahead (`before_call`: the cap first, then
the project's credits, waiting for a grant if they ran out), and what did it cost (`price`).
A charge is never more than the worst case checked for it nor than the cap leaves, so the
run's spend cannot pass its cap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal

from nodus_ray.models.base import Usage
from nodus_ray.money.billing import CapExceeded, RunBudget, billed, worst_case_cost
from nodus_ray.money.prices import PriceTable

__all__ = ["CapExceeded", "CreditsExhausted", "RunSpend"]


class CreditsExhausted(Exception):  # noqa: N818 - a state the run waits in, not an error
    """The project's credits cannot hold the next call's worst case: the run waits for more.

    Raised before the call's step is journaled, so a run resumed later arrives at the same call
    and checks again.
    """

    def __init__(self, needed: Decimal):
        super().__init__(f"the next call may cost up to ${needed}, more than the project's credits")
        self.needed = needed


@dataclass
class RunSpend:
    prices: PriceTable
    access: str  # "Nodus" (billed, capped, paid from credits) or "BYOK" (free, uncapped)
    budget: RunBudget
    reserve_credits: Callable[[Decimal], Awaitable[None]]

    def worst(self, model: str, input_tokens: int, max_output_tokens: int) -> Decimal:
        return billed(worst_case_cost(self.prices, model, input_tokens, max_output_tokens), self.access)

    def price(self, model: str, usage: Usage, reserved: Decimal) -> Decimal:
        """What a finished call is charged: its billed cost, within what was checked and what is left."""
        charged = min(billed(self.prices.cost(model, usage), self.access), reserved)
        remaining = self.budget.remaining()
        return charged if remaining is None else max(Decimal(0), min(charged, remaining))

    async def before_call(self, checked: Decimal, reserved: Decimal) -> None:
        """Refuse a call whose worst case (``checked``) does not fit; hold ``reserved`` of credits."""
        self.budget.require(checked)
        if self.access == "Nodus" and reserved > 0:
            await self.reserve_credits(reserved)

    def record(self, charged: Decimal) -> None:
        """Add a charge (live, or read back from the journal on replay)."""
        self.budget.spent += charged
