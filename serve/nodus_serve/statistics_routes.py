"""The comparison route: ``GET /v1/projects/{p}/evaluations/compare?a=A&b=B``.

The paired difference of two evaluation groups on the same task batch (decision 60). Thin like
every route: the two names are checked here (required, DNS labels), the control plane reads both
evaluations and computes (`control.evaluation_comparison`). Each evaluation's own error bars
are in its ``status.evaluation.statistics`` and ``GET .../agentgroups/NAME/results``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from nodus.errors import Invalid
from nodus.resources import validate_dns_label
from nodus_ray.control.client import ControlPlaneClient

__all__ = ["install_statistics_routes"]


def _group_name(field: str, value: str | None) -> str:
    if value is None or value == "":
        raise Invalid(
            f"{field}: required, the name of an evaluation group (compare?a=A&b=B)", details={"field": field}
        )
    try:
        return validate_dns_label(value)
    except ValueError as exc:
        raise Invalid(f"{field}: {exc}", details={"field": field}) from None


def install_statistics_routes(app: FastAPI, cp: ControlPlaneClient, project_of: Callable[[str], str]) -> None:
    """Add the comparison route; ``project_of`` checks a project name (`app._project`)."""

    @app.get("/v1/projects/{project}/evaluations/compare")
    async def compare_evaluations(project: str, a: str | None = None, b: str | None = None) -> dict[str, Any]:
        """A minus B, per task scored in both: pass rate and mean reward, each with its standard
        error, 95% interval and n (409 ``NotSameBatch`` naming what differs)."""
        first, second = _group_name("a", a), _group_name("b", b)
        return await cp.compare_evaluations(project_of(project), first, second)
