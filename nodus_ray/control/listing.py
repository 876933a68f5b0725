"""Lists that filter and page inside the control plane, so only one page crosses Ray.

A project may hold thousands of runs; the API asks for one page at a time (`ListQuery`) and
this service answers it from the registry in memory: the candidates (a kind's list, with the
runs' older ``agent``/``group``/``parent`` filters), the label and field selectors
(`nodus.selectors`, parsed here: the server is the authority), then the page.

A page is in one stable order, creation time then name, and the continue token is the key of
the page's last item: the next page starts after it, so a run created or deleted between two
pages neither shifts an item into the next page twice nor out of it (a run created meanwhile is
listed once if its key sorts after the token). The token is opaque to callers: base64 of that
key with a digest of the query and the key, so a token from another query (other selectors,
filters, kind or project) or an edited one is refused rather than silently misread. It does not
expire: it names a position, not a snapshot.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nodus.errors import BadRequest
from nodus.selectors import (
    FieldSelector,
    LabelSelector,
    canonical_time,
    parse_field_selector,
    parse_label_selector,
)
from nodus_ray.control.list_query import ListKind, ListPage, ListQuery
from nodus_ray.control.registry import check_project

if TYPE_CHECKING:
    from nodus_ray.control.agents import AgentService
    from nodus_ray.control.groups import GroupService
    from nodus_ray.control.runs import RunService

__all__ = ["ListingService", "page_of", "sort_key", "encode_token", "decode_token"]

SortKey = tuple[str, str]  # (creation time, normalised to microseconds in UTC; name)
Resource = dict[str, Any]
Candidates = Callable[[ListQuery], Awaitable[list[Resource]]]
_TOKEN_VERSION = 1


def sort_key(resource: Resource) -> SortKey:
    """Creation time then name; the time normalised so text order is time order (a timestamp
    with no fraction sorts with ``.000000``). A resource without one sorts first."""
    metadata = resource.get("metadata") or {}
    created = metadata.get("creationTimestamp") or (resource.get("status") or {}).get("createdAt") or ""
    moment = canonical_time(created) if isinstance(created, str) else None
    return moment or "", str(metadata.get("name") or "")


def _query_digest(query: ListQuery, labels: LabelSelector, fields: FieldSelector, key: SortKey) -> str:
    """What a token is bound to: the query (selectors in their canonical spelling, so
    ``a = b`` and ``a=b`` are one query; not the limit, which may change between pages) and its key."""
    bound = [
        query.kind.value,
        query.project,
        str(labels),
        str(fields),
        query.agent,
        query.group,
        query.parent,
    ]
    text = json.dumps([bound, list(key)], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def encode_token(query: ListQuery, labels: LabelSelector, fields: FieldSelector, key: SortKey) -> str:
    payload = {"v": _TOKEN_VERSION, "k": list(key), "q": _query_digest(query, labels, fields, key)}
    raw = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _bad_token(message: str) -> BadRequest:
    return BadRequest(f"continue: {message}", details={"field": "continue"})


def decode_token(token: str, query: ListQuery, labels: LabelSelector, fields: FieldSelector) -> SortKey:
    """The key a token continues after; `BadRequest` naming ``continue`` when it was not issued
    by this server for this query."""
    if len(token) > 2048:
        raise _bad_token("the token is too long to be one this server issued")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        payload = json.loads(raw.decode("utf-8"))
        version, key_list, digest = payload["v"], payload["k"], payload["q"]
        key = (str(key_list[0]), str(key_list[1]))
        if len(key_list) != 2:
            raise ValueError("not a key")
    except (binascii.Error, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError):
        raise _bad_token(
            "the token is damaged or was not issued by this server; list again without it"
        ) from None
    if version != _TOKEN_VERSION:
        raise _bad_token(
            "the token was issued by another version of the server (expired); list again without it"
        )
    if digest != _query_digest(query, labels, fields, key):
        raise _bad_token(
            "the token belongs to another query (other selectors, filters, kind or project) or was "
            "edited; a continue token is used with the query that returned it"
        )
    return key


def page_of(query: ListQuery, candidates: list[Resource]) -> ListPage:
    """Filter ``candidates`` by the query's selectors and cut its page (pure; unit-tested alone)."""
    labels = parse_label_selector(query.label_selector)
    fields = parse_field_selector(query.field_selector, query.kind.value)
    after = decode_token(query.continue_token, query, labels, fields) if query.continue_token else None
    matched = (
        [
            resource
            for resource in candidates
            if labels.matches((resource.get("metadata") or {}).get("labels")) and fields.matches(resource)
        ]
        if labels or fields
        else list(candidates)
    )
    if not query.paged:  # the old answer: every match, in the list's own order
        return ListPage(matched)
    keyed = [(sort_key(resource), resource) for resource in matched]
    if after is not None:
        keyed = [(key, resource) for key, resource in keyed if key > after]
    if query.limit is None:
        return ListPage([resource for _, resource in sorted(keyed, key=lambda pair: pair[0])])
    keyed.sort(key=lambda pair: pair[0])  # C's sort of ready keys: faster than a heap of `limit`
    page = keyed[: query.limit]
    remaining = len(keyed) - len(page)
    token = encode_token(query, labels, fields, page[-1][0]) if remaining and page else None
    return ListPage([resource for _, resource in page], token, remaining)


class ListingService:
    """The pages of agents, runs and groups (`ListQuery` in, `ListPage` out)."""

    def __init__(self, agents: AgentService, runs: RunService, groups: GroupService) -> None:
        self._candidates: dict[ListKind, Candidates] = {
            ListKind.AGENTS: lambda q: agents.list_agents(q.project),
            ListKind.AGENT_RUNS: lambda q: runs.list_runs(q.project, q.agent, q.group, q.parent),
            ListKind.AGENT_GROUPS: lambda q: groups.list_groups(q.project),
        }

    async def page(self, query: ListQuery) -> ListPage:
        check_project(query.project)
        # Selectors are parsed before the candidates are gathered: a bad one costs nothing.
        parse_label_selector(query.label_selector)
        parse_field_selector(query.field_selector, query.kind.value)
        return page_of(query, await self._candidates[query.kind](query))
