"""A run's spending rules in one place: price a call, check it against the cap, hold credits.

The conversation asks three things before and after each routing or model call: what could
this call cost at its largest (`worst`), may it go ahead (`before_call`: the cap first, then
the project's credits, waiting for a grant if they ran out), and what did it cost (`bill`).
Charges are capped at what was checked, so the run's spend can never pass its cap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal

from .billing import RunBudget, billed, worst_case_cost
from .models.base import Usage
from .prices import PriceTable

__all__ = ["CapReached", "RunSpend"]


class CapReached(Exception):
    """The next call, at its largest, does not fit under what is left of the run's cap."""

    def __init__(self, needed: Decimal, remaining: Decimal, cap: Decimal, what: str):
        super().__init__(
            f"the {what} could cost up to ${needed}; ${remaining} of the ${cap} cap (perRunMaxCostUSD) "
            "is left, so the run makes no more calls"
        )
        self.needed, self.remaining, self.cap = needed, remaining, cap


@dataclass
class RunSpend:
    prices: PriceTable
    access: str  # "Nodus" (billed, capped, paid from credits) or "BYOK" (free, uncapped)
    budget: RunBudget
    reserve_credits: Callable[[Decimal], Awaitable[None]]

    def worst(self, model: str, input_tokens: int, max_output_tokens: int) -> Decimal:
        return billed(worst_case_cost(self.prices, model, input_tokens, max_output_tokens), self.access)

    def bill(self, model: str, usage: Usage, reserved: Decimal) -> Decimal:
        """What the call is charged: its billed cost, never more than was checked for it."""
        cost = billed(self.prices.cost(model, usage), self.access)
        return min(cost, reserved)

    async def before_call(self, checked: Decimal, reserved: Decimal, what: str) -> None:
        """Refuse a call whose worst case (``checked``) does not fit; hold ``reserved`` of credits."""
        if not self.budget.fits(checked):
            remaining = self.budget.remaining()
            assert remaining is not None and self.budget.cap is not None
            raise CapReached(checked, remaining, self.budget.cap, what)
        if self.access == "Nodus" and reserved > 0:
            await self.reserve_credits(reserved)

    def record(self, charged: Decimal) -> None:
        self.budget.spent += charged
