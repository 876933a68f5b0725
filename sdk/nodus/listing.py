"""Finding runs among thousands from Python: ``nodus.iter_runs`` and ``nodus.list_runs``.

Both select on the server (labels, phase, reason, agent, group, creation time) and page through
the answer `client_listing.DEFAULT_PAGE_SIZE` runs at a time, in creation order, handing back
`AgentRun` handles. ``Agent.runs`` and ``AgentGroup.runs`` call these with their own name.

    for run in nodus.iter_runs(labels={"team": "a"}, phase="Failed"):
        print(run.name, run.status.reason)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from datetime import datetime

from .agent_run import AgentRun
from .client import Client
from .client_listing import DEFAULT_PAGE_SIZE
from .errors import Invalid

__all__ = ["iter_runs", "list_runs"]


def iter_runs(
    *,
    labels: Mapping[str, str] | str | None = None,
    phase: str | None = None,
    reason: str | None = None,
    agent: str | None = None,
    group: str | None = None,
    created_after: datetime | str | None = None,
    created_before: datetime | str | None = None,
    field_selector: str | None = None,
    project: str | None = None,
    client: Client | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> Iterator[AgentRun]:
    """The project's runs matching every argument given, oldest first, fetched a page at a time.

    ``labels``: ``{"team": "a"}`` (each pair must hold) or a label selector such as
    ``"team=a,env!=prod"`` or ``"tier in (gold,silver)"``. ``phase``, ``reason``, ``agent`` and
    ``group`` are equalities; ``created_after``/``created_before`` (a timezone-aware datetime or
    an RFC 3339 string) are exclusive bounds; ``field_selector`` is ANDed with the rest. A
    selector that does not parse raises `errors.BadRequest` here, before anything is sent.
    """
    client = client or Client(project=project)
    items = client.iter_runs(
        labels=labels,
        phase=phase,
        reason=reason,
        agent=agent,
        group=group,
        created_after=created_after,
        created_before=created_before,
        field_selector=field_selector,
        page_size=page_size,
        project=project,
    )
    return (AgentRun(item, project=project, client=client) for item in items)


def list_runs(
    *,
    labels: Mapping[str, str] | str | None = None,
    phase: str | None = None,
    reason: str | None = None,
    agent: str | None = None,
    group: str | None = None,
    created_after: datetime | str | None = None,
    created_before: datetime | str | None = None,
    field_selector: str | None = None,
    limit: int | None = None,
    project: str | None = None,
    client: Client | None = None,
) -> list[AgentRun]:
    """`iter_runs` as a list: every match, or the oldest ``limit`` of them."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise Invalid(f"limit {limit!r} must be a whole number of at least 1", details={"field": "limit"})
    runs = iter_runs(
        labels=labels,
        phase=phase,
        reason=reason,
        agent=agent,
        group=group,
        created_after=created_after,
        created_before=created_before,
        field_selector=field_selector,
        project=project,
        client=client,
        page_size=min(limit, DEFAULT_PAGE_SIZE) if limit else DEFAULT_PAGE_SIZE,
    )
    return list(itertools.islice(runs, limit))
