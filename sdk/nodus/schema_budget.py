"""The project Budget: what a project may spend in all (or per UTC month or day), everything
billed counted: model and routing calls, sandbox compute, grading.

One Budget per project (any DNS-label name; ``default`` is the usual one). The control plane
holds work against it before the work runs, so the Budget is never passed; ``status`` is the
server's view of the current period.
"""

from __future__ import annotations

from typing import Literal

from nodus.schema_common import API_VERSION, ObjectMeta, OpenModel, StrictModel, UsdAmount

__all__ = ["BUDGET_PERIODS", "BudgetPeriod", "BudgetSpec", "BudgetStatus", "Budget"]

BudgetPeriod = Literal["total", "month", "day"]
BUDGET_PERIODS: tuple[str, ...] = ("total", "month", "day")


class BudgetSpec(StrictModel):
    """``maxCostUSD``: decimal dollars (at most 6 decimals); ``period``: ``total`` (the
    project's whole life), ``month`` or ``day`` (UTC calendar periods)."""

    maxCostUSD: UsdAmount
    period: BudgetPeriod = "total"


class BudgetStatus(OpenModel):
    """Spent and held in the current period, what is left, and the period's bounds (RFC 3339,
    UTC; ``periodStart``/``periodEnd`` are null for ``total``)."""

    spentUSD: str = "0"
    reservedUSD: str = "0"
    leftUSD: str = "0"
    periodStart: str | None = None
    periodEnd: str | None = None


class Budget(StrictModel):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Budget"] = "Budget"
    metadata: ObjectMeta
    spec: BudgetSpec
    status: BudgetStatus | None = None
