"""What a BYOK run's model calls would cost at list price: shown, never billed.

On the user's own key (``BYOK``) Nodus bills nothing: the user's Anthropic account pays the
provider. The run still says what its calls cost at the price table's list prices (the
provider's price, no Nodus margin), so a user sees what their key is spending:

* each of its turns carries ``listCostUSD``: its model calls at list price (routing is Nodus's
  own, free on BYOK, and not counted);
* ``status.cost.listUSD`` is the run's sum, with ``status.cost.listNote`` saying why when it is
  null: a call was made on a model the table has no price for (a BYOK agent may name any model,
  `control.agents`), and a made-up zero would be worse than no figure.

The figures are worked out from each call's recorded usage with the table the actor has, the
same live and on replay. A run on Nodus access has neither field (its ``totalUSD`` is the bill).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from nodus_ray.models.base import Usage
from nodus_ray.money.billing import ACCESS_BYOK, list_cost
from nodus_ray.money.prices import PriceTable
from nodus_ray.runtime.turn_record import TurnRecord

__all__ = ["add_list_cost", "list_cost_fields", "unpriced_note"]


def unpriced_note(models: Sequence[str]) -> str:
    """The words ``status.cost.listNote`` says when the list cost cannot be given."""
    names = ", ".join(repr(model) for model in dict.fromkeys(models))
    plural = "s have" if len(set(models)) > 1 else " has"
    return (
        f"model{plural} no list price in the price table ({names}): the run's list cost is not "
        "known; nothing is billed on your own key (BYOK)"
    )


def add_list_cost(turn: TurnRecord, prices: PriceTable, access: str, model: str, usage: Usage) -> None:
    """Add one model call of ``turn`` to its list cost (BYOK only; a Nodus turn is left as is).

    A call on an unpriced model makes the turn's figure None for good: part of it is unknown.
    """
    if access != ACCESS_BYOK:
        return
    cost = list_cost(prices, model, usage)
    unpriced = list(turn.unpricedModels or [])
    if cost is None:
        unpriced.append(model)
    if unpriced:
        turn.listCostUSD = None
        turn.unpricedModels = list(dict.fromkeys(unpriced))
        return
    turn.listCostUSD = str(Decimal(turn.listCostUSD or "0") + (cost or Decimal(0)))


def list_cost_fields(turns: Sequence[TurnRecord], access: str) -> dict[str, Any]:
    """The ``status.cost`` fields of a BYOK run's list cost; ``{}`` on Nodus access."""
    if access != ACCESS_BYOK:
        return {}
    unpriced = [model for turn in turns for model in turn.unpricedModels or []]
    if unpriced:
        return {"listUSD": None, "listNote": unpriced_note(unpriced)}
    total = sum((Decimal(turn.listCostUSD or "0") for turn in turns), Decimal(0))
    return {"listUSD": str(total), "listNote": None}
