"""The control plane's list pages: the facade's part for `listing.ListingService`.

A mixin of `plane.ControlPlane`, kept apart so the facade stays a table of one-line delegations.
It imports no service at module level (every process holding a handle to the control plane
loads this module, decision 54): the service is built on first use from the facade's own
agents, runs and groups services.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodus_ray.control.list_query import ListPage, ListQuery
from nodus_ray.control.recovery import RecoveryGate, after_recovery

if TYPE_CHECKING:
    from nodus_ray.control.agents import AgentService
    from nodus_ray.control.groups import GroupService
    from nodus_ray.control.listing import ListingService
    from nodus_ray.control.runs import RunService

__all__ = ["ListingFacade"]


class ListingFacade:
    """``list_page``: one filtered page of agents, runs or groups."""

    agents: AgentService
    runs: RunService
    groups: GroupService
    _listing: ListingService | None = None

    @property
    def recovery(self) -> RecoveryGate:  # pragma: no cover - the ControlPlane's own property wins
        raise NotImplementedError

    @after_recovery
    async def list_page(self, query: ListQuery) -> ListPage:
        if self._listing is None:
            from nodus_ray.control.listing import ListingService

            self._listing = ListingService(self.agents, self.runs, self.groups)
        return await self._listing.page(query)
