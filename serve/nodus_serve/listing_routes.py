"""The list routes of agents, runs and groups: label and field selectors, and pages.

``GET /v1/projects/{p}/agentruns?labelSelector=&fieldSelector=&limit=&continue=`` as Kubernetes
spells it (the runs' older ``agent``, ``group`` and ``parent`` filters keep working), and the same
on ``agents`` and ``agentgroups``. The route checks only the page size; the selectors and the
continue token go to the control plane as written, which parses them (it is the authority),
filters its registry and sends back one page (`control.listing`), so thousands of runs never
cross Ray for one page. A selector that does not parse, a field that cannot be selected on, a
limit out of range or a token of another query is a 400 naming the parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query

from nodus.resources import API_VERSION
from nodus.selectors import parse_limit
from nodus_ray.control.client import ControlPlaneClient
from nodus_ray.control.list_query import ListKind, ListPage, ListQuery

__all__ = ["install_listing_routes"]

LabelSelectorParam = Annotated[
    str | None,
    Query(
        alias="labelSelector",
        description="k=v, k!=v, 'k in (a,b)', 'k notin (a,b)', k, !k; a comma is AND",
    ),
]
FieldSelectorParam = Annotated[
    str | None,
    Query(
        alias="fieldSelector",
        description="status.phase, status.reason, spec.agent, spec.group, metadata.name with = or !=; "
        "metadata.creationTimestamp with =, >, >=, <, <= and an RFC 3339 time; a comma is AND",
    ),
]
LimitParam = Annotated[str | None, Query(description="items per page, 1 to 1000; none: every item")]
ContinueParam = Annotated[
    str | None, Query(alias="continue", description="the previous page's metadata.continue")
]

_LIST_KINDS = {
    ListKind.AGENTS: "AgentList",
    ListKind.AGENT_RUNS: "AgentRunList",
    ListKind.AGENT_GROUPS: "AgentGroupList",
}


def _answer(kind: ListKind, page: ListPage) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": _LIST_KINDS[kind],
        "metadata": page.metadata(),
        "items": page.items,
    }


def install_listing_routes(app: FastAPI, cp: ControlPlaneClient, project_of: Callable[[str], str]) -> None:
    """Register the three list routes; ``project_of`` checks the path's project."""

    async def listing(
        kind: ListKind,
        project: str,
        label_selector: str | None,
        field_selector: str | None,
        limit: str | None,
        continue_token: str | None,
        agent: str | None = None,
        group: str | None = None,
        parent: str | None = None,
    ) -> dict[str, Any]:
        query = ListQuery(
            kind=kind,
            project=project_of(project),
            label_selector=label_selector or "",
            field_selector=field_selector or "",
            limit=parse_limit(limit),
            continue_token=continue_token or "",
            agent=agent,
            group=group,
            parent=parent,
        )
        return _answer(kind, await cp.list_page(query))

    @app.get("/v1/projects/{project}/agents")
    async def list_agents(
        project: str,
        label_selector: LabelSelectorParam = None,
        field_selector: FieldSelectorParam = None,
        limit: LimitParam = None,
        continue_token: ContinueParam = None,
    ) -> dict[str, Any]:
        """The project's agents, by name; or a page of them in creation order (``limit``)."""
        return await listing(ListKind.AGENTS, project, label_selector, field_selector, limit, continue_token)

    @app.get("/v1/projects/{project}/agentruns")
    async def list_runs(
        project: str,
        agent: str | None = None,
        group: str | None = None,
        parent: str | None = None,
        label_selector: LabelSelectorParam = None,
        field_selector: FieldSelectorParam = None,
        limit: LimitParam = None,
        continue_token: ContinueParam = None,
    ) -> dict[str, Any]:
        """The project's runs; ``agent``, ``group`` and ``parent`` (a Python run's children)
        filter, and so do the selectors. With ``limit`` or ``continue``, a page in creation order
        whose ``metadata.continue`` asks for the next one."""
        return await listing(
            ListKind.AGENT_RUNS,
            project,
            label_selector,
            field_selector,
            limit,
            continue_token,
            agent=agent,
            group=group,
            parent=parent,
        )

    @app.get("/v1/projects/{project}/agentgroups")
    async def list_groups(
        project: str,
        label_selector: LabelSelectorParam = None,
        field_selector: FieldSelectorParam = None,
        limit: LimitParam = None,
        continue_token: ContinueParam = None,
    ) -> dict[str, Any]:
        """The project's groups, by name; or a page of them in creation order (``limit``)."""
        return await listing(
            ListKind.AGENT_GROUPS, project, label_selector, field_selector, limit, continue_token
        )
