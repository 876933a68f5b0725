"""The small JSONPath subset kubectl users write: ``{.status.phase}``, ``{.status.turns[-1].model}``.

Only member access (``.name`` or ``['name']``) and list indexes (``[0]``, ``[-1]``) are supported;
filters and wildcards are refused with a clear message rather than half-implemented, so a
``nodus wait`` condition either means exactly what it says or does not run.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["MISSING", "JsonPathError", "parse", "lookup", "format_value"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""Returned by `lookup` when the path does not exist (distinct from a JSON ``null``)."""

_TOKEN = re.compile(
    r"""\.(?P<key>[^.\[\]{}'"]+)"""  # .name
    r"""|\[(?P<index>-?\d+)\]"""  # [0], [-1]
    r"""|\[(?P<q>['"])(?P<quoted>[^'"]*)(?P=q)\]"""  # ['name-with.dots']
)


class JsonPathError(ValueError):
    """The expression is outside the supported subset."""


def parse(expression: str) -> tuple[str | int, ...]:
    """``"{.a.b[0].c}"`` -> ``("a", "b", 0, "c")``; braces and the leading dot are optional."""
    text = expression.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text in ("", "."):
        return ()
    if not text.startswith((".", "[")):
        text = "." + text
    parts: list[str | int] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise JsonPathError(
                f"unsupported JSONPath {expression!r} at {text[position:]!r}; use the subset {{.a.b[0].c}}"
            )
        if match.group("key") is not None:
            parts.append(match.group("key"))
        elif match.group("index") is not None:
            parts.append(int(match.group("index")))
        else:
            parts.append(match.group("quoted"))
        position = match.end()
    return tuple(parts)


def lookup(data: Any, expression: str | tuple[str | int, ...]) -> Any:
    """The value at the path, or `MISSING` when any step of it does not exist."""
    path = parse(expression) if isinstance(expression, str) else expression
    current = data
    for part in path:
        if isinstance(part, int):
            if not isinstance(current, list) or not -len(current) <= part < len(current):
                return MISSING
            current = current[part]
        elif isinstance(current, dict) and part in current:
            current = current[part]
        else:
            return MISSING
    return current


def format_value(value: Any) -> str:
    """Render a value as kubectl prints it: strings raw, JSON literals lower-case, objects as JSON."""
    if value is MISSING:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, bool)) or value is None:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)
