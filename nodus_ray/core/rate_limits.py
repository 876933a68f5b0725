"""The operator's rate limits per Anthropic key and model family (``NODUS_RATE_LIMITS``).

Anthropic limits each key's requests, input tokens and output tokens per minute, per model
class; cached input read back (``cache_read_input_tokens``) does not count toward the input
limit. The operator writes what their keys are allowed, once, at ``nodus up``; the cluster-wide
limiter (`runtime.rate_limiter`) admits every model call against it before it is sent.

The variable holds entries ``KEY/FAMILY=rpm:N,itpm:N,otpm:N`` separated by ``;`` (or
newlines), or the same as JSON (``{"KEY": {"FAMILY": {"rpm": N, ...}}}``):

* ``KEY`` is ``default`` (every key, each with its own budget of that size) or a key's
  fingerprint (`key_fingerprint`: the first 16 hex digits of the SHA-256 of the key; never the
  key itself). ``FAMILY`` is a model family (haiku, sonnet, ...), or ``*`` for any family. A bare
  ``FAMILY=...`` means ``default/FAMILY``.
* Each entry gives at least one of ``rpm`` (requests), ``itpm`` (uncached input tokens),
  ``otpm`` (output tokens), each a positive number per minute.

The most specific entry wins: the key's own family, the key's ``*``, ``default``'s family,
``default``'s ``*``. A call with no entry is not limited. A value that is not a positive number
is refused here with one error naming the variable, the entry and the field.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RATE_LIMITS_ENV",
    "ANY_FAMILY",
    "DEFAULT_KEY",
    "RateLimit",
    "RateLimitTable",
    "key_fingerprint",
]

RATE_LIMITS_ENV = "NODUS_RATE_LIMITS"
ANY_FAMILY = "*"
DEFAULT_KEY = "default"
_FIELDS = ("rpm", "itpm", "otpm")
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
_FAMILY = re.compile(r"^(\*|[a-z0-9][a-z0-9._-]{0,62})$")


def key_fingerprint(api_key: str) -> str:
    """A key's identity that can be shown and stored: 16 hex digits of its SHA-256.

    ``printf %s "$KEY" | sha256sum | cut -c1-16`` computes the same. The key is stripped first,
    as the provider strips it (a key read from a file often ends with a newline).
    """
    return hashlib.sha256(api_key.strip().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RateLimit:
    """Per-minute budgets of one key and family; None is "not limited" for that budget."""

    rpm: float | None = None
    itpm: float | None = None
    otpm: float | None = None

    def to_dict(self) -> dict[str, float]:
        return {name: value for name in _FIELDS if (value := getattr(self, name)) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RateLimit:
        return cls(**{name: float(data[name]) for name in _FIELDS if data.get(name) is not None})

    def describe(self) -> str:
        return ",".join(f"{name}:{value:g}" for name, value in self.to_dict().items())


@dataclass(frozen=True)
class RateLimitTable:
    """Every configured limit by ``(key, family)``; `for_call` picks the one a call obeys."""

    entries: tuple[tuple[str, str, RateLimit], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.entries

    def applies_to(self, fingerprint: str) -> bool:
        """Whether any entry limits calls on this key (its own, or ``default``'s)."""
        return any(key in (fingerprint, DEFAULT_KEY) for key, _, _ in self.entries)

    def for_call(self, fingerprint: str, family: str) -> RateLimit | None:
        """The most specific limit for this key and family, or None (the call is not limited)."""
        table = {(key, fam): limit for key, fam, limit in self.entries}
        for key in (fingerprint, DEFAULT_KEY):
            for fam in (family, ANY_FAMILY):
                if (key, fam) in table:
                    return table[(key, fam)]
        return None

    @classmethod
    def parse(cls, text: str | None, variable: str = RATE_LIMITS_ENV) -> RateLimitTable:
        """The table ``text`` describes (see the module docstring); ValueError naming the entry."""
        raw = (text or "").strip()
        if not raw:
            return cls()
        if raw.startswith("{"):
            return cls(tuple(_parse_json(raw, variable)))
        entries: list[tuple[str, str, RateLimit]] = []
        for part in re.split(r"[;\n]", raw):
            part = part.strip()
            if not part:
                continue
            selector, sep, budgets = part.partition("=")
            if not sep:
                raise ValueError(
                    f"{variable}: entry {part!r} must be KEY/FAMILY=rpm:N,itpm:N,otpm:N "
                    "(KEY default or a key fingerprint, FAMILY a model family or *)"
                )
            key, family = _selector(selector.strip(), variable)
            values: dict[str, object] = {}
            for item in budgets.split(","):
                name, colon, value = item.strip().partition(":")
                values[name.strip()] = value.strip() if colon else None
            entries.append((key, family, _limit(values, f"{key}/{family}", variable)))
        return cls(tuple(_unique(entries, variable)))

    def to_text(self) -> str:
        """The table in the ``KEY/FAMILY=...`` form: how it travels to the run actors."""
        return ";".join(f"{key}/{family}={limit.describe()}" for key, family, limit in self.entries)


def _selector(selector: str, variable: str) -> tuple[str, str]:
    key, slash, family = selector.partition("/")
    if not slash:
        key, family = DEFAULT_KEY, selector
    return _check_key(key.strip(), variable), _check_family(family.strip(), key, variable)


def _check_key(key: str, variable: str) -> str:
    if key != DEFAULT_KEY and not _FINGERPRINT.match(key):
        # Not echoed: what was written may be a key pasted by mistake.
        raise ValueError(
            f"{variable}: a key of {len(key)} characters is neither 'default' nor a key fingerprint "
            '(16 lowercase hex digits: printf %s "$KEY" | sha256sum | cut -c1-16); never write the key itself'
        )
    return key


def _check_family(family: str, key: str, variable: str) -> str:
    family = family.lower()
    if not _FAMILY.match(family):
        raise ValueError(f"{variable}: key {key!r} has family {family!r}: a model family (sonnet, ...) or *")
    return family


def _limit(values: dict[str, object], where: str, variable: str) -> RateLimit:
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{variable}: {where}: unknown field {unknown[0]!r} (expected rpm, itpm, otpm)")
    if not values:
        raise ValueError(f"{variable}: {where}: give at least one of rpm, itpm, otpm")
    checked: dict[str, float] = {}
    for name, value in values.items():
        number: float | None
        try:
            number = None if isinstance(value, bool) or value is None else float(str(value))
        except ValueError:
            number = None
        if number is None or not math.isfinite(number) or number <= 0:
            raise ValueError(
                f"{variable}: {where}: {name} must be a positive number per minute, not {value!r}"
            )
        checked[name] = number
    return RateLimit(**checked)


def _parse_json(raw: str, variable: str) -> list[tuple[str, str, RateLimit]]:
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"{variable}: not valid JSON ({error})") from None
    if not isinstance(document, dict):
        raise ValueError(f'{variable}: JSON must be an object {{"KEY": {{"FAMILY": {{"rpm": N}}}}}}')
    entries: list[tuple[str, str, RateLimit]] = []
    for key, families in document.items():
        key = _check_key(str(key).strip(), variable)
        if not isinstance(families, dict):
            raise ValueError(f"{variable}: key {key!r} must map families to limits")
        for family, budgets in families.items():
            family = _check_family(str(family).strip(), key, variable)
            if not isinstance(budgets, dict):
                raise ValueError(f"{variable}: {key}/{family} must be an object of rpm, itpm, otpm")
            entries.append((key, family, _limit(dict(budgets), f"{key}/{family}", variable)))
    return _unique(entries, variable)


def _unique(entries: list[tuple[str, str, RateLimit]], variable: str) -> list[tuple[str, str, RateLimit]]:
    seen: set[tuple[str, str]] = set()
    for key, family, _ in entries:
        if (key, family) in seen:
            raise ValueError(f"{variable}: {key}/{family} is given twice")
        seen.add((key, family))
    return entries
