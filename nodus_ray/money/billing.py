"""What a call is billed, and the per-run cap that no run can spend past.

The product's rules (docs "What a run costs"):

* On Nodus's Claude (access ``Nodus``) every model call and every routing call is billed at its
  provider cost divided by :data:`NODUS_MARGIN` (0.875), rounded up to a millionth of a dollar.
  On the user's own key (``BYOK``) Nodus charges nothing and no cap applies, so the price
  table does not decide which models a user's key may call: a BYOK call on a model the table
  lacks is made, billed zero, and its list cost (:func:`list_cost`) is None ("no list price").
* Before every call the run checks that the call *at its largest* still fits under
  ``perRunMaxCostUSD`` minus what the run has spent; when it does not, no call is made (the run
  waits with ``MaxCostReached``). "At its largest" is the whole conversation as input
  (:func:`max_input_tokens`, an upper bound computed without any API), ``maxTokens`` of output,
  every input token at the dearest input rate (:func:`worst_case_cost`).
* At the start of a turn the routing call precedes the model call, and the router has not yet
  chosen the model, so the check is: billed worst case of the router call plus the largest
  billed worst case among the models the router may choose. Both calls are then charged
  against their own reservations with :meth:`RunBudget.charge`.

Why the spend can never pass the cap: the check admits a call only when ``spent + reserved <=
cap``, and :meth:`RunBudget.charge` records at most the reservation (and never more than the
cap leaves), so even a provider that reports more usage than the bound cannot push ``spent``
over ``cap``. When the bound holds (it should: see :func:`max_input_tokens`), the charge is
exactly the billed actual cost, because cost and billing are monotone in the token counts.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Any

from nodus_ray.models.base import Usage
from nodus_ray.money.prices import MILLION, PriceTable, round_up

__all__ = [
    "ACCESS_BYOK",
    "ACCESS_NODUS",
    "NODUS_MARGIN",
    "PER_BLOCK_OVERHEAD_TOKENS",
    "PER_MESSAGE_OVERHEAD_TOKENS",
    "PER_REQUEST_OVERHEAD_TOKENS",
    "PER_TOOL_OVERHEAD_TOKENS",
    "CapExceeded",
    "RunBudget",
    "billed",
    "billed_cost",
    "billed_worst_case",
    "list_cost",
    "max_input_tokens",
    "worst_case_cost",
]

# Nodus keeps 12.5% of what a user pays: billed = cost / 0.875.
NODUS_MARGIN = Decimal("0.875")
ACCESS_NODUS = "Nodus"
ACCESS_BYOK = "BYOK"

# Tokens the API adds around the text it is given, none of which appear in the request's JSON.
# Generous on purpose: an undercount here is a run that can spend past its cap.
# - per request: the turn framing plus the tool-use system prompt Anthropic adds when tools are
#   present (a few hundred tokens, per Anthropic's pricing notes);
PER_REQUEST_OVERHEAD_TOKENS = 1024
# - per message: role markers and turn separators;
PER_MESSAGE_OVERHEAD_TOKENS = 16
# - per content block (text, tool_use, tool_result and the blocks nested in a tool_result):
#   block delimiters, tool-call ids and names as the model sees them;
PER_BLOCK_OVERHEAD_TOKENS = 16
# - per tool definition: the framing the tool-use prompt puts around each definition.
PER_TOOL_OVERHEAD_TOKENS = 64

_PRECISION = 80


def billed(raw: Decimal, access: str) -> Decimal:
    """What the user is billed for a call whose provider cost is ``raw``.

    ``Nodus``: ``raw / 0.875`` rounded up to a millionth of a dollar (exact: the division is done
    with ceiling rounding at 80 digits, then ceiled to the microdollar, which equals the true
    ceiling). ``BYOK``: zero, because the user's Anthropic account pays the provider directly.
    """
    if not isinstance(raw, Decimal) or not raw.is_finite() or raw < 0:
        raise ValueError(f"raw cost must be a finite Decimal >= 0, got {raw!r}")
    if access == ACCESS_BYOK:
        return Decimal(0)
    if access != ACCESS_NODUS:
        raise ValueError(f"access must be {ACCESS_NODUS!r} or {ACCESS_BYOK!r}, got {access!r}")
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        ctx.rounding = ROUND_CEILING
        return round_up(raw / NODUS_MARGIN)


def _count_blocks(messages: list[dict[str, Any]]) -> int:
    blocks = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            blocks += 1  # a plain string is one text block
            continue
        for block in content:
            blocks += 1
            nested = block.get("content") if isinstance(block, dict) else None
            if isinstance(nested, list):
                blocks += len(nested)
    return blocks


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def max_input_tokens(system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """An upper bound of a call's input tokens, computed without calling any API.

    Why it bounds: the tokenizer splits the UTF-8 bytes of the text the model reads, and every
    token covers at least one byte, so a text of *n* bytes is at most *n* tokens. The text here is
    the JSON of system, messages and tools, indented like a pretty-printer would (JSON escaping
    and structure only ever add bytes over the strings themselves, and the indentation covers an
    API that renders tool schemas and tool inputs as indented JSON). Claude's tokenizer is not
    public; should it normalise text first (many tokenizers apply NFKC, which can expand one
    character into up to 18), the bytes of the NFKC form are counted instead when larger.
    What the API adds on its own (framing, the tool-use prompt) is not in the JSON, so fixed
    overheads are added: :data:`PER_REQUEST_OVERHEAD_TOKENS` per request,
    :data:`PER_MESSAGE_OVERHEAD_TOKENS` per message, :data:`PER_BLOCK_OVERHEAD_TOKENS` per
    content block and :data:`PER_TOOL_OVERHEAD_TOKENS` per tool.

    It is conservative: English text averages 3-4 bytes per token, so a cap is reached about
    that many times earlier than the real cost would reach it. It is never low, and that is
    what the cap needs. The bound covers ``input_tokens + cache_creation_input_tokens +
    cache_read_input_tokens`` of the call (Anthropic reports the three apart).
    """
    text = json.dumps(
        {"system": system or "", "messages": messages or [], "tools": tools or []},
        ensure_ascii=False,
        indent=2,
        sort_keys=True,
        default=str,
    )
    size = _utf8_len(text)
    if not text.isascii():  # ASCII is NFKC-stable; skip the pass for the common case
        size = max(size, _utf8_len(unicodedata.normalize("NFKC", text)))
    return (
        size
        + PER_REQUEST_OVERHEAD_TOKENS
        + PER_MESSAGE_OVERHEAD_TOKENS * len(messages or [])
        + PER_BLOCK_OVERHEAD_TOKENS * _count_blocks(messages or [])
        + PER_TOOL_OVERHEAD_TOKENS * len(tools or [])
    )


def worst_case_cost(prices: PriceTable, model: str, input_tokens: int, max_output_tokens: int) -> Decimal:
    """The raw provider cost of a call at its largest, rounded up to a millionth of a dollar.

    Every input token is priced at the dearest input rate (plain, cache write or cache read):
    the split between them is only known after the call. Output is ``max_output_tokens``, the
    most the API lets the model write. Raises ``UnpricedModel`` for an unpriced model, so an
    unpriced call is refused before it is made.
    """
    if not isinstance(input_tokens, int) or not isinstance(max_output_tokens, int):
        raise ValueError("token counts must be integers")
    if input_tokens < 0 or max_output_tokens < 0:
        raise ValueError(f"token counts must be >= 0, got {input_tokens} and {max_output_tokens}")
    price = prices.price(model)
    rate = max(price.input, price.cache_write, price.cache_read)
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        ctx.rounding = ROUND_CEILING
        return round_up((Decimal(input_tokens) * rate + Decimal(max_output_tokens) * price.output) / MILLION)


class CapExceeded(Exception):
    """The next call, at its largest, does not fit under what is left of the run's cap.

    No call was made. ``reason`` is the run's ``status.reason`` (``MaxCostReached``); amounts are
    billed USD.
    """

    reason = "MaxCostReached"

    def __init__(self, needed: Decimal, remaining: Decimal, cap: Decimal):
        super().__init__(
            f"the next call may cost up to ${needed} but only ${remaining} of the run's ${cap} cap "
            "(perRunMaxCostUSD) is left, so the run makes no more calls"
        )
        self.needed = needed
        self.remaining = remaining
        self.cap = cap

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling between Ray workers
        return (type(self), (self.needed, self.remaining, self.cap))


def _amount(value: Decimal, name: str) -> Decimal:
    if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
        raise ValueError(f"{name} must be a finite Decimal >= 0, got {value!r}")
    return value


@dataclass
class RunBudget:
    """A run's cap and what it has spent, both billed USD (after the margin).

    ``cap`` is None on the user's own key: nothing is charged and nothing is refused. The budget
    is plain data so a replayed run rebuilds it from its recorded charges.
    """

    cap: Decimal | None
    spent: Decimal = Decimal(0)

    def __post_init__(self) -> None:
        if self.cap is not None:
            _amount(self.cap, "cap")
        _amount(self.spent, "spent")
        if self.cap is not None and self.spent > self.cap:
            raise ValueError(f"spent {self.spent} is over the cap {self.cap}")

    def remaining(self) -> Decimal | None:
        """What is left under the cap; None when there is no cap."""
        return None if self.cap is None else self.cap - self.spent

    def fits(self, amount: Decimal) -> bool:
        """Whether a call that may cost up to ``amount`` (billed) may be made now."""
        _amount(amount, "amount")
        return self.cap is None or self.spent + amount <= self.cap

    def require(self, amount: Decimal) -> None:
        """:meth:`fits`, or raise :class:`CapExceeded` (for callers that stop by exception)."""
        if not self.fits(amount):
            assert self.cap is not None
            raise CapExceeded(amount, self.cap - self.spent, self.cap)

    def charge(self, amount: Decimal, reserved: Decimal) -> Decimal:
        """Record a finished call billed ``amount`` that was admitted with ``reserved``.

        Charges ``min(amount, reserved)``, and never more than the cap leaves, so a provider that
        reports more usage than the bound cannot push ``spent`` over ``cap`` (the difference is
        Nodus's loss, and a bug in the bound worth an alert). Returns what was charged; record
        that, not ``amount``, so a replay rebuilds the same ``spent``.
        """
        _amount(amount, "amount")
        _amount(reserved, "reserved")
        charged = min(amount, reserved)
        if self.cap is not None:
            charged = min(charged, self.cap - self.spent)
        self.spent += charged
        return charged


def _check_access(access: str) -> None:
    if access not in (ACCESS_NODUS, ACCESS_BYOK):
        raise ValueError(f"access must be {ACCESS_NODUS!r} or {ACCESS_BYOK!r}, got {access!r}")


def billed_worst_case(
    prices: PriceTable, access: str, model: str, input_tokens: int, max_output_tokens: int
) -> Decimal:
    """What a call could be billed at its largest: the billed :func:`worst_case_cost`.

    ``BYOK``: zero without looking the model up, so a model the table lacks is no refusal on the
    user's own key (the caps and the worst-case checks skip BYOK: nothing is billed). ``Nodus``
    raises ``UnpricedModel`` for an unpriced model, so that call is refused before it is made.
    """
    _check_access(access)
    if access == ACCESS_BYOK:
        return Decimal(0)
    return billed(worst_case_cost(prices, model, input_tokens, max_output_tokens), access)


def billed_cost(prices: PriceTable, access: str, model: str, usage: Usage) -> Decimal:
    """What a finished call is billed: its list cost over the margin (Nodus), zero (BYOK, whether
    or not the table prices the model)."""
    _check_access(access)
    if access == ACCESS_BYOK:
        return Decimal(0)
    return billed(prices.cost(model, usage), access)


def list_cost(prices: PriceTable, model: str, usage: Usage) -> Decimal | None:
    """What the call costs at the table's list prices (the provider's price, no margin), or None
    when the table has no price for ``model``: what a BYOK run shows for the calls its user's
    Anthropic account pays, so the figure is never a made-up zero."""
    return prices.cost(model, usage) if prices.has(model) else None
