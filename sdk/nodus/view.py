"""`View`: read-only, attribute-style access to the JSON the API returns."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["View"]


class View:
    """A read-only view of a JSON object: ``status.phase``, ``status.counts.succeeded``, ``get()``.

    Attribute names may be written in snake_case (``run.status.agent_revision`` reads
    ``agentRevision``, ``cost.total_usd`` reads ``totalUSD``) so Python code reads naturally while
    the wire stays camelCase. Nested objects become Views; lists are lists of Views. Keys that
    clash with a method (``get``, ``to_dict``) stay reachable with ``view["get"]``.
    """

    __slots__ = ("_data",)
    _data: dict[str, Any]
    __hash__ = None  # type: ignore[assignment]  # mutable underneath, like the dict it wraps

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))

    @staticmethod
    def wrap(value: Any) -> Any:
        """Views for mappings, lists of wrapped values for lists, everything else unchanged."""
        if isinstance(value, View):
            return value
        if isinstance(value, Mapping):
            return View(value)
        if isinstance(value, list):
            return [View.wrap(item) for item in value]
        return value

    def _key(self, name: str) -> str | None:
        if name in self._data:
            return name
        wanted = name.replace("_", "").lower()
        matches = [key for key in self._data if key.replace("_", "").lower() == wanted]
        return matches[0] if len(matches) == 1 else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # keeps copy/pickle protocols from recursing into the data
            raise AttributeError(name)
        key = self._key(name)
        if key is None:
            known = ", ".join(sorted(self._data)) or "none"
            raise AttributeError(f"no field {name!r} (fields: {known})")
        return View.wrap(self._data[key])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a View is read-only; change the resource through the API")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("a View is read-only")

    def __getitem__(self, key: str) -> Any:
        return View.wrap(self._data[key])

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value (exact key first, then its snake_case spelling), else ``default``."""
        found = self._key(key)
        return default if found is None else View.wrap(self._data[found])

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> Iterable[str]:
        return self._data.keys()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, View):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {k for k in self._data if k.isidentifier()})

    def __reduce__(self) -> tuple[Any, ...]:
        return (View, (self._data,))

    def to_dict(self) -> dict[str, Any]:
        """A deep copy as plain dicts and lists, e.g. for ``json.dumps``."""
        copy: dict[str, Any] = json.loads(json.dumps(self._data))
        return copy

    def __repr__(self) -> str:
        return f"View({self._data!r})"
