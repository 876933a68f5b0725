"""The project Budget from Python: cap everything a project spends (model, routing, sandbox and
grading), in all or per UTC month or day.

    budget = nodus.Budget.create("25.00", period="month")
    budget.spent, budget.left            # Decimal dollars, as the server counts them now
    budget.update(max_cost_usd="40")     # raising it lets runs waiting with BudgetExceeded go on
    nodus.Budget.get().delete()

One Budget per project (named ``default`` unless you name it). Everything is HTTP through
`nodus.client.Client`; amounts are sent as decimal strings, never floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from .client import Client
from .handles import _usd
from .resources import API_VERSION

__all__ = ["Budget"]

_COLLECTION = "budgets"
DEFAULT_NAME = "default"


def _money(value: Any) -> Decimal:
    return Decimal(str(value if value is not None else "0"))


class Budget:
    """The handle of a project's Budget: its spec and the server's figures as last read."""

    def __init__(
        self, resource: Mapping[str, Any], *, project: str | None = None, client: Client | None = None
    ) -> None:
        self._resource = dict(resource)
        self.name: str = str((self._resource.get("metadata") or {}).get("name") or DEFAULT_NAME)
        self._project = project
        self._client = client or Client(project=project)

    def __repr__(self) -> str:
        return (
            f"Budget(name={self.name!r}, max_cost_usd={str(self.max_cost_usd)!r}, period={self.period!r}, "
            f"spent={str(self.spent)!r}, left={str(self.left)!r})"
        )

    # -- creating and finding -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        max_cost_usd: Any,
        *,
        period: str = "total",
        name: str = DEFAULT_NAME,
        project: str | None = None,
        client: Client | None = None,
    ) -> Budget:
        """Create the project's Budget (``period``: ``total``, ``month`` or ``day``, UTC).

        Raises `errors.Conflict` (``AlreadyExists``) when the project has one, `errors.Invalid`
        naming the field for a bad amount or period, or a cap below what is spent already.
        """
        client = client or Client(project=project)
        document = {
            "apiVersion": API_VERSION,
            "kind": "Budget",
            "metadata": {"name": name},
            "spec": {"maxCostUSD": _usd(max_cost_usd, "max_cost_usd"), "period": period},
        }
        return cls(client.create(_COLLECTION, document, project=project), project=project, client=client)

    @classmethod
    def get(
        cls, name: str | None = None, *, project: str | None = None, client: Client | None = None
    ) -> Budget:
        """The project's Budget (by name, or the one there is); raises `errors.NotFound`."""
        client = client or Client(project=project)
        if name is None:
            items = client.list(_COLLECTION, project=project)
            if items:
                return cls(items[0], project=project, client=client)
            name = DEFAULT_NAME  # answers NotFound, naming it
        return cls(client.get(_COLLECTION, name, project=project), project=project, client=client)

    from_name = get

    # -- reading ----------------------------------------------------------------------------------

    def refresh(self) -> Budget:
        """Read the Budget's figures again."""
        self._resource = self._client.get(_COLLECTION, self.name, project=self._project)
        return self

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self._resource.get("spec") or {})

    @property
    def status(self) -> dict[str, Any]:
        return dict(self._resource.get("status") or {})

    @property
    def max_cost_usd(self) -> Decimal:
        return _money(self.spec.get("maxCostUSD"))

    @property
    def period(self) -> str:
        return str(self.spec.get("period") or "total")

    @property
    def spent(self) -> Decimal:
        """What the project spent in the current period (model, routing, sandbox, grading)."""
        return _money(self.status.get("spentUSD"))

    @property
    def reserved(self) -> Decimal:
        """What running work holds of the Budget for its next step."""
        return _money(self.status.get("reservedUSD"))

    @property
    def left(self) -> Decimal:
        """What the Budget can still hold: maxCostUSD - spent - reserved."""
        return _money(self.status.get("leftUSD"))

    @property
    def period_start(self) -> str | None:
        return self.status.get("periodStart")

    @property
    def period_end(self) -> str | None:
        return self.status.get("periodEnd")

    def to_dict(self) -> dict[str, Any]:
        return dict(self._resource)

    # -- changing ---------------------------------------------------------------------------------

    def update(self, *, max_cost_usd: Any = None, period: str | None = None) -> Budget:
        """Change the cap or the period (a merge patch); raising it resumes waiting runs."""
        spec: dict[str, Any] = {}
        if max_cost_usd is not None:
            spec["maxCostUSD"] = _usd(max_cost_usd, "max_cost_usd")
        if period is not None:
            spec["period"] = period
        self._resource = self._client.patch(_COLLECTION, self.name, {"spec": spec}, project=self._project)
        return self

    def delete(self) -> None:
        """Remove the Budget: nothing caps the project's spend any more."""
        self._client.delete(_COLLECTION, self.name, project=self._project)
