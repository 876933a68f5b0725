"""Which model serves each family: the catalogue the providers and the price table share.

It lives apart from both so that neither imports the other: the price table prices these
models (``money.prices``), the providers call them (``models.anthropic_provider``,
``models.offline``). An operator's price file may map a family to another model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["FAMILIES", "CLAUDE_FAMILY_MODELS", "OFFLINE_MODELS", "family_of_model"]

FAMILIES: Final = ("haiku", "sonnet", "opus", "fable")

# The Claude model each family is routed to by default.
CLAUDE_FAMILY_MODELS: Final[dict[str, str]] = {
    "haiku": "claude-haiku-5-5",
    "sonnet": "claude-sonnet-5-5",
    "opus": "claude-opus-5-5",
    "fable": "claude-fable-5-5",
}

# Model ids say they are offline, so nobody mistakes a recorded offline run for Claude.
OFFLINE_MODELS: Final[dict[str, str]] = {family: f"offline-{family}" for family in FAMILIES}


def family_of_model(model: str, family_models: Mapping[str, str]) -> str | None:
    """The family a model id belongs to, for a run that pins a model: the family it serves
    (``family_models``, the price table's), else the family its id names (``claude-sonnet-4-5``
    is a sonnet: a BYOK agent may pin a model the table does not know), else None."""
    for family, served in family_models.items():
        if served == model:
            return family
    name = model.lower()
    for family in FAMILIES:
        if family in name:
            return family
    return None
