"""What a list request asks the control plane for, and the page it gets back.

Plain dataclasses (no pydantic, no services): the API's process builds a `ListQuery` and Ray
carries it to the control plane, whose `listing.ListingService` answers with a `ListPage`;
every process that holds a handle to the control plane may import this module cheaply
(decision 54).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["ListKind", "ListQuery", "ListPage"]


class ListKind(StrEnum):
    """The collections that page and filter (their REST plurals)."""

    AGENTS = "agents"
    AGENT_RUNS = "agentruns"
    AGENT_GROUPS = "agentgroups"


@dataclass(frozen=True)
class ListQuery:
    """One list request: selectors as the caller wrote them (the control plane parses them, it is
    the authority), a page size and where the previous page ended."""

    kind: ListKind
    project: str
    label_selector: str = ""
    field_selector: str = ""
    limit: int | None = None  # None: every match, no remainingItemCount
    continue_token: str = ""  # the previous page's metadata.continue
    # The runs' older filters, which keep working: an agent's, a group's, a parent's children.
    agent: str | None = None
    group: str | None = None
    parent: str | None = None

    @property
    def paged(self) -> bool:
        """A page (limit or continue given) is in creation order; a whole list keeps its old order."""
        return self.limit is not None or bool(self.continue_token)


@dataclass(frozen=True)
class ListPage:
    items: list[dict[str, Any]] = field(default_factory=list)
    continue_token: str | None = None  # None: this is the last page
    remaining_item_count: int | None = None  # matches after this page, when a limit was given

    def metadata(self) -> dict[str, Any]:
        """The list's ``metadata`` as the API answers it (Kubernetes' ListMeta)."""
        meta: dict[str, Any] = {}
        if self.continue_token:
            meta["continue"] = self.continue_token
        if self.remaining_item_count is not None:
            meta["remainingItemCount"] = self.remaining_item_count
        return meta
