"""What ``nodus get KIND`` asks the server for: selectors it filters by, and pages.

``--field-selector`` requirements on the fields the server selects on (`nodus.selectors.FIELDS`:
``status.phase``, ``spec.group``, ``metadata.creationTimestamp>=...`` of runs) go to the server,
checked here first with the server's own parser; any other ``PATH=VALUE`` (``spec.model.name``)
is checked by the CLI on each item, as before. ``-l`` goes to the server for the kinds that page
and is checked locally for the others. Without ``--limit`` the CLI asks for `PAGE_SIZE` items at
a time until the last page, never for one list of every run; with it, one page, and the token of
the next one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..client import Client
from ..client_listing import DEFAULT_PAGE_SIZE
from ..selectors import (
    FIELDS,
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
    parse_limit,
)
from . import jsonpath
from .root import UsageError

__all__ = ["PAGE_SIZE", "Selection", "Listed", "selection_of", "fetch"]

PAGE_SIZE = DEFAULT_PAGE_SIZE

ClientCheck = tuple[str, bool, str]  # (JSONPath, equal, value): a requirement the CLI checks itself
_PART = re.compile(r"([^=!<>]+?)\s*(==|!=|>=|<=|=|>|<)\s*(.*)")


@dataclass(frozen=True)
class Selection:
    """What ``-l`` and ``--field-selector`` select: the server's part and the CLI's own checks."""

    labels: LabelSelector = LabelSelector()
    label_text: str = ""
    fields: FieldSelector = FieldSelector()
    field_text: str = ""
    client_checks: tuple[ClientCheck, ...] = ()

    def matches(self, resource: dict[str, Any]) -> bool:
        """Every requirement, checked locally too (the server's filter again, and the paths it
        does not select on)."""
        labels = (resource.get("metadata") or {}).get("labels")
        return (
            self.labels.matches(labels)
            and self.fields.matches(resource)
            and all(
                (jsonpath.format_value(jsonpath.lookup(resource, path)) == value) == equal
                for path, equal, value in self.client_checks
            )
        )


def selection_of(collection: str, labels: str | None, fields: str | None) -> Selection:
    """Parse ``-l`` and ``--field-selector`` for ``collection``; a selector that does not parse
    raises the server's error (`errors.BadRequest`), a bad path a usage error."""
    label_selector = parse_label_selector(labels, field="--selector")
    supported = FIELDS.get(collection, {})
    server_parts: list[str] = []
    checks: list[ClientCheck] = []
    for part in filter(None, (piece.strip() for piece in (fields or "").split(","))):
        match = _PART.fullmatch(part)
        if match is None:
            raise UsageError(f"--field-selector {part!r} is not PATH=VALUE or PATH!=VALUE")
        path, operator, value = match.groups()
        if path.strip() in supported:
            server_parts.append(part)
            continue
        if operator not in ("=", "==", "!="):
            raise UsageError(
                f"--field-selector {part!r}: only metadata.creationTimestamp is ordered "
                f"(fields the server selects {collection} on: {', '.join(supported) or 'none'})"
            )
        try:
            jsonpath.parse(path)
        except jsonpath.JsonPathError as exc:
            raise UsageError(str(exc)) from None
        checks.append((path, operator != "!=", value))
    server_text = ",".join(server_parts)
    return Selection(
        label_selector,
        str(label_selector),
        parse_field_selector(server_text, collection, field="--field-selector"),
        server_text,
        tuple(checks),
    )


@dataclass(frozen=True)
class Listed:
    items: list[dict[str, Any]] = field(default_factory=list)
    continue_: str | None = None
    remaining_item_count: int | None = None


def fetch(
    client: Client, collection: str, selection: Selection, *, limit: int | None, continue_: str | None
) -> Listed:
    """The items ``nodus get`` prints: one page with ``limit``, otherwise every page."""
    if collection not in FIELDS:  # not paged by the server: one list, selected here
        if limit is not None or continue_:
            raise UsageError(
                f"--limit and --continue page {', '.join(FIELDS)}; {collection} are listed whole"
            )
        return Listed([item for item in client.list(collection) if selection.matches(item)])
    wanted = parse_limit(limit, field="--limit")
    labels, fields = selection.label_text or None, selection.field_text or None
    if wanted is not None:
        page = client.list_page(
            collection, label_selector=labels, field_selector=fields, limit=wanted, continue_=continue_
        )
        items = [item for item in page.items if selection.matches(item)]
        return Listed(items, page.continue_, page.remaining_item_count)
    items = []
    token = continue_
    while True:
        page = client.list_page(
            collection, label_selector=labels, field_selector=fields, limit=PAGE_SIZE, continue_=token
        )
        items += [item for item in page.items if selection.matches(item)]
        if not page.continue_:
            return Listed(items)
        token = page.continue_
