"""What each model costs: a dated price table, in USD per million tokens, as exact decimals.

Every model and routing call a run makes is billed from this table, so three rules hold:

* **No price, no call.** A model id missing from the table raises :class:`UnpricedModel`; it is
  never billed as zero, because a silent zero is free Claude for the user and a loss for the
  operator that nobody sees until the invoice. That holds for Nodus access, which bills the
  table; on the user's own key (BYOK) nothing is billed, so any model may be called there and
  an unpriced one simply shows no list cost (`money.billing.list_cost`).
* **Decimals, never floats.** Prices and costs are :class:`~decimal.Decimal`; a raw call cost is
  rounded *up* (``ROUND_CEILING``) to a millionth of a dollar, so a bill is never short by a
  float's rounding and two replicas computing the same cost get the same digits.
* **Dated and overridable.** The table carries the date its prices took effect (shown to users
  with ``GET /v1/prices``); the operator merges their own file over the defaults with
  ``NODUS_PRICES`` when list prices change, without a release.

Defaults (effective 2026-11-01), USD per million tokens::

    model                 input   output  cache write  cache read
    claude-haiku-5-5       1        5       1.25         0.10
    claude-sonnet-5-5      3       15       3.75         0.30
    claude-opus-5-5       15       75      18.75         1.50
    claude-fable-5-5      30      150      37.50         3.00
    offline-<family>      one tenth of the Claude model of the same family
    nodus-jev-router       0.10     0       0            0

The offline models (see :mod:`nodus_ray.models.offline`) are priced on purpose: small but
nonzero, one tenth of their Claude family, so a laptop with no key shows every cost rule
(margin, rounding, per-run and group caps) with the same code path as Claude, and a run can
never look free because it ran offline. The router ("jev") is a priced step too: it is billed on
its input (the prompt) at a small rate, and writes at most :data:`ROUTER_MAX_OUTPUT_TOKENS`
output tokens (the family name), priced at 0.

Override file (JSON, or YAML for any other suffix; path in ``NODUS_PRICES``)::

    {"effective": "2026-12-01",
     "prices": {"claude-sonnet-5-5": {"input": "3", "output": "15",
                                      "cacheWrite": "3.75", "cacheRead": "0.30"},
                "claude-old-model": null},
     "familyModels": {"sonnet": "claude-sonnet-5-5"}}

A model already in the table may give only the fields that change; a new model gives all four;
``null`` removes a model (its calls are then refused). ``effective`` is optional and keeps the
default date when absent, so set it whenever a price changes. Write prices as strings ("0.30"):
numbers are read from their literal text, but strings say "exact" to the next reader.

Sandbox compute (:class:`SandboxPrice`, billed by :mod:`nodus_ray.money.sandbox_billing`, whatever
the model access) has its own section, merged field by field the same way::

    {"sandbox": {"cpuSecondUSD": "0.00005", "workspaceGiBHourUSD": "0.0002"}}

The defaults are list prices in the range of hosted sandboxes: a CPU-second at $0.00005
($0.18 a CPU-hour) and a GiB of kept workspace for an hour at $0.0002 (about $0.15 a GiB-month).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_CEILING, Decimal, InvalidOperation, localcontext
from pathlib import Path
from typing import Any

import yaml

from nodus_ray.models.base import Usage
from nodus_ray.models.catalog import CLAUDE_FAMILY_MODELS, FAMILIES, OFFLINE_MODELS

__all__ = [
    "DEFAULT_PRICE_TABLE",
    "MICRODOLLAR",
    "MILLION",
    "ROUTER_MAX_OUTPUT_TOKENS",
    "ROUTER_MODEL",
    "ModelPrice",
    "PriceTable",
    "SandboxPrice",
    "UnpricedModel",
    "round_up",
]

MILLION = Decimal(1_000_000)
# Costs are exact to a millionth of a dollar (the unit caps are written in: "0.50", up to 6 places).
MICRODOLLAR = Decimal("0.000001")
ROUTER_MODEL = "nodus-jev-router"
# The router answers with a family name; 8 tokens is more than "sonnet" needs, and bounds its call.
ROUTER_MAX_OUTPUT_TOKENS = 8

# Enough digits that no product or sum of token counts and prices is ever rounded before the final
# ceiling to a microdollar (token counts < 1e18, prices with any sane number of places).
_PRECISION = 80
_FIELDS = {"input": "input", "output": "output", "cacheWrite": "cache_write", "cacheRead": "cache_read"}
_FAMILIES = FAMILIES
_OFFLINE_FRACTION = Decimal("0.1")


def round_up(amount: Decimal) -> Decimal:
    """``amount`` rounded up to a millionth of a dollar: a bill may be a hair high, never short."""
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        ctx.rounding = ROUND_CEILING
        return (+amount).quantize(MICRODOLLAR, rounding=ROUND_CEILING)


class UnpricedModel(Exception):
    """A call was about to be billed on a model the price table does not know.

    Raised instead of billing zero; the caller makes no call. ``model`` is the id that was asked.
    """

    def __init__(self, model: str, effective: date):
        super().__init__(
            f"model {model!r} has no price in the price table (effective {effective.isoformat()}); "
            "add it with NODUS_PRICES"
        )
        self.model = model
        self.effective = effective

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (Ray ships exceptions between workers)
        return (type(self), (self.model, self.effective))


@dataclass(frozen=True)
class ModelPrice:
    """One model's list prices, USD per million tokens: input, output, cache write, cache read."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal

    def __post_init__(self) -> None:
        for name in ("input", "output", "cache_write", "cache_read"):
            value = getattr(self, name)
            if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
                raise ValueError(f"{name} must be a finite Decimal >= 0, got {value!r}")

    def scaled(self, factor: Decimal) -> ModelPrice:
        """Every price times ``factor`` (how the offline prices derive from Claude's)."""
        with localcontext() as ctx:
            ctx.prec = _PRECISION
            return ModelPrice(*((getattr(self, name) * factor).normalize() for name in _FIELDS.values()))

    def to_dict(self) -> dict[str, str]:
        return {key: _decimal_text(getattr(self, name)) for key, name in _FIELDS.items()}


_SANDBOX_FIELDS = {"cpuSecondUSD": "cpu_second", "workspaceGiBHourUSD": "workspace_gib_hour"}


@dataclass(frozen=True)
class SandboxPrice:
    """Sandbox compute list prices, USD: one CPU-second of a command, one GiB of kept workspace
    for one hour. Billed on every run, the user's own model key or not (Nodus runs the sandbox)."""

    cpu_second: Decimal = Decimal("0.00005")
    workspace_gib_hour: Decimal = Decimal("0.0002")

    def __post_init__(self) -> None:
        for name in _SANDBOX_FIELDS.values():
            value = getattr(self, name)
            if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
                raise ValueError(f"{name} must be a finite Decimal >= 0, got {value!r}")

    def to_dict(self) -> dict[str, str]:
        return {key: _decimal_text(getattr(self, name)) for key, name in _SANDBOX_FIELDS.items()}


@dataclass(frozen=True)
class PriceTable:
    """The prices in effect since ``effective``, and which Claude model serves each family.

    The mappings are copied into plain dicts on construction (plain so the table pickles into
    Ray workers); treat them as read-only.
    """

    effective: date
    prices: Mapping[str, ModelPrice]
    family_models: Mapping[str, str] = field(default_factory=dict)
    sandbox: SandboxPrice = field(default_factory=SandboxPrice)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prices", dict(self.prices))
        object.__setattr__(self, "family_models", dict(self.family_models))
        for family, model in self.family_models.items():
            if model not in self.prices:
                # A family that routes to an unpriced model would fail every call of every turn.
                raise ValueError(f"familyModels.{family}: model {model!r} has no price")

    def price(self, model: str) -> ModelPrice:
        """The model's prices; :class:`UnpricedModel` when it has none (never a zero price)."""
        try:
            return self.prices[model]
        except (KeyError, TypeError):
            raise UnpricedModel(model, self.effective) from None

    def has(self, model: str) -> bool:
        return model in self.prices

    def cost(self, model: str, usage: Usage) -> Decimal:
        """The raw provider cost of one call, rounded up to a millionth of a dollar.

        Anthropic reports ``input_tokens`` *excluding* cache tokens, so the four counts are
        disjoint and each is priced at its own rate. The sum is rounded once, at the end.
        """
        price = self.price(model)
        counts = (
            (usage.input_tokens, price.input),
            (usage.output_tokens, price.output),
            (usage.cache_creation_input_tokens, price.cache_write),
            (usage.cache_read_input_tokens, price.cache_read),
        )
        for tokens, _ in counts:
            if not isinstance(tokens, int) or tokens < 0:
                raise ValueError(f"usage token counts must be integers >= 0, got {usage!r}")
        with localcontext() as ctx:
            ctx.prec = _PRECISION
            ctx.rounding = ROUND_CEILING
            total = sum((Decimal(tokens) * rate for tokens, rate in counts), Decimal(0))
            return round_up(total / MILLION)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, decimals as strings; the same shape :meth:`load` reads (it round-trips)."""
        return {
            "effective": self.effective.isoformat(),
            "currency": "USD",
            "unit": "per million tokens",
            "prices": {model: price.to_dict() for model, price in sorted(self.prices.items())},
            "familyModels": dict(self.family_models),
            "sandbox": self.sandbox.to_dict(),
        }

    @classmethod
    def load(cls, override: str | os.PathLike[str] | None = None) -> PriceTable:
        """The defaults, with the operator's file merged over them.

        ``override`` is a path to a JSON file (``.json``) or a YAML file (any other suffix), the
        server's ``NODUS_PRICES`` as `settings.ServerSettings` read it; None is the defaults
        alone. A file that cannot be read or has a wrong field raises ``ValueError`` naming the
        file and the field, so a server refuses to start with prices it would misread.
        """
        if override is None:
            return DEFAULT_PRICE_TABLE
        path = Path(override)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"price file {path}: cannot read it: {exc}") from None
        is_json = path.suffix.lower() == ".json"
        try:
            data = _parse(text, json_file=is_json)
        except (ValueError, yaml.YAMLError) as exc:
            raise ValueError(f"price file {path}: not valid {'JSON' if is_json else 'YAML'}: {exc}") from None
        try:
            return _merge(DEFAULT_PRICE_TABLE, data)
        except ValueError as exc:
            raise ValueError(f"price file {path}: {exc}") from None


# --------------------------------------------------------------------------------------------
# Reading an override file


class _ExactLoader(yaml.SafeLoader):
    """YAML with floats kept as their literal text, so ``0.30`` becomes Decimal("0.30") exactly."""


_ExactLoader.add_constructor(
    "tag:yaml.org,2002:float",
    lambda loader, node: str(loader.construct_scalar(node)),  # type: ignore[arg-type]
)


def _parse(text: str, *, json_file: bool) -> Any:
    if json_file:
        return json.loads(text, parse_float=str, parse_constant=str)  # floats keep their digits
    return yaml.load(text, Loader=_ExactLoader)


def _decimal_field(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, Decimal)):
        raise ValueError(f'{where}: expected a decimal string such as "0.30", got {value!r}')
    try:
        amount = Decimal(value.strip() if isinstance(value, str) else value)
    except InvalidOperation:
        raise ValueError(f"{where}: {value!r} is not a decimal number") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{where}: {value!r} must be a finite number >= 0 (USD per million tokens)")
    return amount


def _merge(base: PriceTable, data: Any) -> PriceTable:
    """``base`` with ``data`` (the parsed file) merged over it; ValueError names the bad field."""
    if data is None:
        return base  # an empty file changes nothing
    if not isinstance(data, dict):
        raise ValueError(
            f"expected a mapping with effective, prices and familyModels, got {type(data).__name__}"
        )
    unknown = sorted(set(data) - {"effective", "prices", "familyModels", "sandbox", "currency", "unit"})
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (expected effective, prices, familyModels, sandbox)")
    if data.get("currency", "USD") != "USD":
        raise ValueError(f"currency: only USD is supported, got {data['currency']!r}")
    if data.get("unit", "per million tokens") != "per million tokens":
        raise ValueError(f"unit: prices are per million tokens, got {data['unit']!r}")

    effective = base.effective
    if "effective" in data:
        raw = data["effective"]
        if isinstance(raw, date):  # YAML reads an unquoted 2026-12-01 as a date
            effective = raw
        else:
            try:
                effective = date.fromisoformat(str(raw))
            except ValueError:
                raise ValueError(f'effective: {raw!r} is not a date such as "2026-12-01"') from None

    prices = dict(base.prices)
    given = data.get("prices") or {}
    if not isinstance(given, dict):
        raise ValueError("prices: expected a mapping of model id to prices")
    for model, entry in given.items():
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"prices: {model!r} is not a model id")
        where = f"prices.{model}"
        if entry is None:
            prices.pop(model, None)
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping with input, output, cacheWrite, cacheRead")
        extra = sorted(set(entry) - set(_FIELDS))
        if extra:
            raise ValueError(f"{where}.{extra[0]}: unknown field (expected {', '.join(_FIELDS)})")
        current = prices.get(model)
        values: dict[str, Decimal] = {}
        for key, name in _FIELDS.items():
            if key in entry:
                values[name] = _decimal_field(entry[key], f"{where}.{key}")
            elif current is not None:
                values[name] = getattr(current, name)
            else:
                raise ValueError(f"{where}.{key}: missing (a new model needs all of {', '.join(_FIELDS)})")
        prices[model] = ModelPrice(**values)

    family_models = dict(base.family_models)
    given_families = data.get("familyModels") or {}
    if not isinstance(given_families, dict):
        raise ValueError("familyModels: expected a mapping of family to model id")
    for family, model in given_families.items():
        if family not in _FAMILIES:
            raise ValueError(
                f"familyModels.{family}: unknown family (expected one of {', '.join(_FAMILIES)})"
            )
        if not isinstance(model, str) or not model:
            raise ValueError(f"familyModels.{family}: expected a model id, got {model!r}")
        family_models[family] = model
    for family, model in family_models.items():
        if model not in prices:
            raise ValueError(f"familyModels.{family}: model {model!r} has no price")
    sandbox = _merge_sandbox(base.sandbox, data.get("sandbox"))
    return PriceTable(effective=effective, prices=prices, family_models=family_models, sandbox=sandbox)


def _merge_sandbox(base: SandboxPrice, given: Any) -> SandboxPrice:
    """The file's ``sandbox`` section over ``base``: only the fields it gives change."""
    if given is None:
        return base
    if not isinstance(given, dict):
        raise ValueError("sandbox: expected a mapping with cpuSecondUSD and workspaceGiBHourUSD")
    extra = sorted(set(given) - set(_SANDBOX_FIELDS))
    if extra:
        raise ValueError(f"sandbox.{extra[0]}: unknown field (expected {', '.join(_SANDBOX_FIELDS)})")
    values = {
        name: _decimal_field(given[key], f"sandbox.{key}") if key in given else getattr(base, name)
        for key, name in _SANDBOX_FIELDS.items()
    }
    return SandboxPrice(**values)


def _decimal_text(value: Decimal) -> str:
    """Plain notation ("10", not "1E+1"), so every client parses it."""
    return format(value, "f")


# --------------------------------------------------------------------------------------------
# The defaults


def _price(input: str, output: str, cache_write: str, cache_read: str) -> ModelPrice:
    return ModelPrice(Decimal(input), Decimal(output), Decimal(cache_write), Decimal(cache_read))


def _default_table() -> PriceTable:
    family_prices = {
        "haiku": _price("1", "5", "1.25", "0.10"),
        "sonnet": _price("3", "15", "3.75", "0.30"),
        "opus": _price("15", "75", "18.75", "1.50"),
        "fable": _price("30", "150", "37.50", "3.00"),
    }
    claude = {family: (CLAUDE_FAMILY_MODELS[family], price) for family, price in family_prices.items()}
    prices: dict[str, ModelPrice] = {model: price for model, price in claude.values()}
    for family, (_, price) in claude.items():
        prices[OFFLINE_MODELS[family]] = price.scaled(_OFFLINE_FRACTION)
    prices[ROUTER_MODEL] = _price("0.10", "0", "0", "0")
    return PriceTable(
        effective=date(2026, 11, 1),
        prices=prices,
        family_models={family: model for family, (model, _) in claude.items()},
    )


DEFAULT_PRICE_TABLE: PriceTable = _default_table()
