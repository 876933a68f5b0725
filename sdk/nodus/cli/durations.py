"""Durations on the command line: ``--timeout=2m`` in, ``AGE 5m`` out."""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = ["parse_timeout", "format_age"]

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_timeout(text: str) -> float:
    """Seconds from ``"30s"``, ``"2m"``, ``"1h30m"``, ``"1.5s"``, ``"500ms"`` or a bare ``"90"``.

    Units follow kubectl's ``--timeout``; a bare number counts as seconds because that is what
    people type in scripts. Raises `ValueError` naming the value.
    """
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return float(value)
    total, position = 0.0, 0
    while position < len(value):
        match = _PART.match(value, position)
        if match is None:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if not value or position != len(value):
        raise ValueError(f"{text!r} is not a duration such as 30s, 2m or 1h30m")
    return total


def format_age(timestamp: str | None, now: datetime | None = None) -> str:
    """kubectl's AGE column: ``45s``, ``12m``, ``3h``, ``5d``; ``<unknown>`` without a timestamp."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:  # kubectl keeps the smaller unit below two of the larger
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
