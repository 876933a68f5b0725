"""What every resource schema shares: the API version, names, dollar amounts, the metadata, and
the two model bases (strict specs, open server-written status).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from .contract import ANSWER_PREVIEW_BYTES, API_VERSION, FAMILIES, MAX_INPUT_BYTES
from .selectors import validate_labels

__all__ = [
    "API_VERSION",
    "FAMILIES",
    "MAX_INPUT_BYTES",
    "ANSWER_PREVIEW_BYTES",
    "DNS_LABEL",
    "validate_dns_label",
    "DnsLabel",
    "UsdAmount",
    "Family",
    "StrictModel",
    "OpenModel",
    "ObjectMeta",
]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DECIMAL = re.compile(r"^\d{1,7}(\.\d{1,6})?$")


def validate_dns_label(value: str) -> str:
    """A name as Kubernetes spells one: lower-case letters, digits and '-', at most 63."""
    if not isinstance(value, str) or not DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return value


def _validate_usd(value: str) -> str:
    if not isinstance(value, str) or not _DECIMAL.match(value):
        raise ValueError(f'{value!r} is not a decimal amount of dollars such as "0.50"')
    try:
        amount = Decimal(value)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise ValueError(f"{value!r} is not a decimal") from exc
    if amount <= 0:
        raise ValueError("must be more than 0")
    return value


DnsLabel = Annotated[str, AfterValidator(validate_dns_label)]
UsdAmount = Annotated[str, AfterValidator(_validate_usd)]
Family = Literal["haiku", "sonnet", "opus", "fable"]


class StrictModel(BaseModel):
    """What a user writes (specs, metadata): an unknown field is refused, never dropped.

    Numbers and booleans of a spec are ``StrictInt``/``StrictBool``: ``"yes"`` is not true and
    ``"5"`` is not 5 (nor is ``true`` 1), and a string field takes no number.
    """

    # defer_build: a model's validator is built the first time it validates, not when its class
    # is defined, so a process that imports the schemas for one or two models (a run actor)
    # does not build them all (issue 19).
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, validate_assignment=False, defer_build=True
    )


class OpenModel(BaseModel):
    """Server-written parts (status) stay readable by older clients when fields are added."""

    model_config = ConfigDict(extra="allow", defer_build=True)


class ObjectMeta(StrictModel):
    name: DnsLabel
    project: str | None = None
    uid: str | None = None
    generation: StrictInt | None = None
    resourceVersion: StrictInt | None = None  # the server's count of writes (a run's, for resolve)
    creationTimestamp: str | None = None
    # Kubernetes' label rules, so every label can be named by a selector (`selectors`).
    labels: Annotated[dict[str, str], AfterValidator(validate_labels)] = Field(default_factory=dict)
