"""Listing from Python: one page (`Client.list_page`), every page (`Client.iter_list`), and runs
by labels, phase, agent, group and creation time (`Client.iter_runs`).

A mixin of `client.Client`. The selectors are parsed here first (`nodus.selectors`, the same
parser the server uses), so a selector that does not parse raises `errors.BadRequest` before
anything is sent; the server, which filters, stays the authority. Iterating asks for pages of
`DEFAULT_PAGE_SIZE` items, never for one list of every run.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from ._client_core import ClientCore
from .errors import Invalid
from .selectors import FIELDS, parse_field_selector, parse_label_selector, parse_limit

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "Page",
    "Selection",
    "ListingCalls",
    "label_selector_of",
    "run_field_selector",
]

DEFAULT_PAGE_SIZE = 500  # items per request when iterating: well under the server's 1,000


@dataclass(frozen=True)
class Page:
    """One page of a list: its items, the token of the next page (None on the last) and, when a
    limit was given, how many items match after this page."""

    items: builtins.list[dict[str, Any]] = field(default_factory=builtins.list)
    continue_: str | None = None
    remaining_item_count: int | None = None


class Selection(TypedDict, total=False):
    """What selects and pages a list: `ListingCalls.list_page`'s keywords."""

    label_selector: str | None
    field_selector: str | None
    limit: int | None
    continue_: str | None


def label_selector_of(labels: Mapping[str, str] | str | None) -> str | None:
    """``{"team": "a"}`` as ``team=a`` (every pair must hold); a string is a selector already."""
    if labels is None or isinstance(labels, str):
        return labels
    if not isinstance(labels, Mapping):
        raise Invalid("labels must be a dict of key: value or a selector string", details={"field": "labels"})
    return ",".join(f"{key}={value}" for key, value in labels.items())


def _moment(value: datetime | str, what: str) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise Invalid(f"{what}: a datetime with a time zone (e.g. UTC)", details={"field": what})
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value


def run_field_selector(
    *,
    phase: str | None = None,
    reason: str | None = None,
    agent: str | None = None,
    group: str | None = None,
    created_after: datetime | str | None = None,
    created_before: datetime | str | None = None,
    field_selector: str | None = None,
) -> str | None:
    """The field selector these keywords mean, ANDed with ``field_selector``; None for none."""
    parts = [field_selector] if field_selector else []
    for path, value in (
        ("status.phase", phase),
        ("status.reason", reason),
        ("spec.agent", agent),
        ("spec.group", group),
    ):
        if value is not None:
            parts.append(f"{path}={value}")
    if created_after is not None:
        parts.append(f"metadata.creationTimestamp>{_moment(created_after, 'created_after')}")
    if created_before is not None:
        parts.append(f"metadata.creationTimestamp<{_moment(created_before, 'created_before')}")
    return ",".join(parts) or None


class ListingCalls(ClientCore):
    """`Client`'s paged lists."""

    def list(
        self,
        collection: str,
        *,
        project: str | None = None,
        params: Mapping[str, str] | None = None,
        **selection: Unpack[Selection],
    ) -> builtins.list[dict[str, Any]]:
        """The items of a collection (``?agent=NAME`` filters agentruns server-side); ``label_selector``,
        ``field_selector``, ``limit`` and ``continue_`` as `list_page` (`iter_list` pages on)."""
        return self.list_page(collection, project=project, params=params, **selection).items

    def list_page(
        self,
        collection: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        project: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Page:
        """One page of ``agents``, ``agentruns`` or ``agentgroups``: the items matching both
        selectors (Kubernetes' grammar, docs/api.md), at most ``limit`` of them (1 to 1000; all
        when None), after the page whose ``continue_`` token this is. Other collections take
        neither selectors nor pages. ``params`` are a collection's own filters (``agent``,
        ``group``, ``parent`` of agentruns)."""
        query = dict(params or {})
        if label_selector or field_selector or limit is not None or continue_:
            if collection not in FIELDS:
                raise Invalid(
                    f"{collection} take no selectors or pages; {', '.join(FIELDS)} do",
                    details={"field": "collection"},
                )
            parse_label_selector(label_selector)  # refused here, before anything is sent
            parse_field_selector(field_selector, collection)
            if limit is not None:
                query["limit"] = str(parse_limit(limit))
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            if continue_:
                query["continue"] = continue_
        answer = self._json(self._request("GET", self._path(collection, project), params=query or None))
        body: dict[str, Any] = answer if isinstance(answer, dict) else {}
        meta: dict[str, Any] = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
        remaining = meta.get("remainingItemCount")
        return Page(
            builtins.list(body.get("items") or []),
            meta.get("continue") or None,
            remaining if isinstance(remaining, int) else None,
        )

    def iter_list(
        self,
        collection: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        project: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every matching item, in creation order, asked for ``page_size`` at a time (a bad
        selector or size raises here, not at the first ``next``)."""
        if collection not in FIELDS:
            raise Invalid(
                f"{collection} are not paged; {', '.join(FIELDS)} are", details={"field": "collection"}
            )
        parse_label_selector(label_selector)
        parse_field_selector(field_selector, collection)
        parse_limit(page_size, field="page_size")
        return self._pages(collection, label_selector, field_selector, page_size, project, params)

    def _pages(
        self,
        collection: str,
        label_selector: str | None,
        field_selector: str | None,
        page_size: int,
        project: str | None,
        params: Mapping[str, str] | None,
    ) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            page = self.list_page(
                collection,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
                continue_=token,
                project=project,
                params=params,
            )
            yield from page.items
            if not page.continue_:
                return
            token = page.continue_

    def iter_runs(
        self,
        *,
        labels: Mapping[str, str] | str | None = None,
        phase: str | None = None,
        reason: str | None = None,
        agent: str | None = None,
        group: str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        field_selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        project: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The project's runs that match every argument given, in creation order, a page at a
        time: ``labels`` (``{"team": "a"}``, or a selector such as ``"team=a,env!=prod"``),
        ``phase``, ``reason``, ``agent``, ``group``, created after / before a time (exclusive),
        and a raw ``field_selector`` ANDed with the rest."""
        return self.iter_list(
            "agentruns",
            label_selector=label_selector_of(labels),
            field_selector=run_field_selector(
                phase=phase,
                reason=reason,
                agent=agent,
                group=group,
                created_after=created_after,
                created_before=created_before,
                field_selector=field_selector,
            ),
            page_size=page_size,
            project=project,
        )
