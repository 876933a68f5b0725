"""Durations as nodus spells them, in one place: ``2h``, ``30m``, ``1h30m`` in the documents."""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["parse_duration"]

_DURATION = re.compile(r"^(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$", re.ASCII)


def parse_duration(value: str) -> timedelta:
    """``"2h"``, ``"30m"``, ``"90s"`` or ``"1h30m"``; the units of the product documents."""
    match = _DURATION.match(value) if isinstance(value, str) else None
    if not value or not match or not any(match.groups()):
        raise ValueError(f'{value!r} is not a duration such as "30m", "2h" or "1h30m"')
    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    try:
        return timedelta(hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:  # "99999999999999999999h": a refusal, not a crash
        raise ValueError(f"{value!r} is longer than any duration nodus takes") from None
