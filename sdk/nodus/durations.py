"""Durations, parsed in one place: ``2h``, ``30m``, ``1h30m`` in documents, ``--timeout=500ms`` on
the command line.

One grammar, a run of ``<number><unit>`` parts (`_parts`), read in two dialects:

- `parse_duration`, the documents' (``spec.deadline``, ``evaluation.timeout``, a token's
  ``expiresIn``; the SDK, the CLI and the engine all read them with it): whole hours, minutes
  and seconds, in that order, each at most once, as a `timedelta`.
- `parse_timeout`, the command line's ``--timeout``, as kubectl takes it: also ``ms``,
  fractions (``1.5s``), parts in any order, and a bare number as seconds (what people type in
  scripts), as float seconds.

Each keeps its own refusal text, since users and tests read them; `format_duration` writes a
`timedelta` back in the documents' dialect.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["parse_duration", "parse_timeout", "format_duration"]

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DOCUMENT_UNITS = ("h", "m", "s")  # the documents' units, in the order they are written


def _parts(text: str) -> list[tuple[str, str]] | None:
    """``"1h30m"`` -> ``[("1", "h"), ("30", "m")]``; None when anything else is in the text."""
    parts: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        match = _PART.match(text, position)
        if match is None:
            return None
        parts.append((match.group(1), match.group(2)))
        position = match.end()
    return parts


def _document_parts(value: str) -> list[tuple[str, str]] | None:
    """The parts of a document's duration: whole ASCII numbers of h, m, s in that order, once each."""
    # The pattern this replaced ended in ``$``, which also matches before one final newline; a
    # stored document with one keeps parsing.
    parts = _parts(value.removesuffix("\n"))
    if not parts:
        return None
    units = [unit for _, unit in parts]
    in_order = [unit for unit in _DOCUMENT_UNITS if unit in units]
    if units != in_order:  # "ms", a unit twice, or "30s1m"
        return None
    if not all(number.isascii() and number.isdigit() for number, _ in parts):
        return None
    return parts


def parse_duration(value: str) -> timedelta:
    """``"2h"``, ``"30m"``, ``"90s"`` or ``"1h30m"``; the units of the product documents."""
    parts = _document_parts(value) if isinstance(value, str) and value else None
    if parts is None:
        raise ValueError(f'{value!r} is not a duration such as "30m", "2h" or "1h30m"')
    amounts = {unit: int(number) for number, unit in parts}
    try:
        return timedelta(hours=amounts.get("h", 0), minutes=amounts.get("m", 0), seconds=amounts.get("s", 0))
    except OverflowError:  # "99999999999999999999h": a refusal, not a crash
        raise ValueError(f"{value!r} is longer than any duration nodus takes") from None


def parse_timeout(text: str) -> float:
    """Seconds from ``"30s"``, ``"2m"``, ``"1h30m"``, ``"1.5s"``, ``"500ms"`` or a bare ``"90"``.

    Units follow kubectl's ``--timeout``; a bare number counts as seconds because that is what
    people type in scripts. Raises `ValueError` naming the value.
    """
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return float(value)
    parts = _parts(value)
    if not value or parts is None:
        raise ValueError(f"{text!r} is not a duration such as 30s, 2m or 1h30m")
    return sum((float(number) * _UNIT_SECONDS[unit] for number, unit in parts), 0.0)


def format_duration(value: timedelta) -> str:
    """``timedelta(hours=1, minutes=30)`` -> ``"1h30m"``, whole seconds, as documents spell it.

    Raises `ValueError` for less than a second, which no document takes.
    """
    seconds = int(value.total_seconds())
    if seconds <= 0:
        raise ValueError("must be more than 0s")
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if n)
