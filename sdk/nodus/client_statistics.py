"""Comparing two evaluations from Python: `Client.compare_evaluations` (decision 60).

A mixin of `client.Client`: ``GET /v1/projects/{p}/evaluations/compare?a=A&b=B``, the paired
difference of two evaluation groups on the same task batch. Each evaluation's own error bars
need no call of their own: they are ``status.evaluation.statistics`` of the group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._client_core import ClientCore
from .errors import Invalid
from .schema_common import validate_dns_label

if TYPE_CHECKING:
    pass

__all__ = ["StatisticsCalls", "evaluation_name"]


def evaluation_name(value: Any, field: str) -> str:
    """An evaluation group's name, checked before anything is sent (`Invalid` naming ``field``)."""
    if isinstance(value, str):
        try:
            return validate_dns_label(value)
        except ValueError as exc:
            raise Invalid(f"{field}: {exc}", details={"field": field}) from None
    raise Invalid(
        f"{field}: the name of an evaluation group, not {type(value).__name__}", details={"field": field}
    )


class StatisticsCalls(ClientCore):
    """`Client`'s comparison of two evaluations."""

    def compare_evaluations(self, a: str, b: str, *, project: str | None = None) -> dict[str, Any]:
        """``EvaluationComparison``: A minus B per task scored in both, for the pass rate and the
        mean reward (``difference``, ``standardError``, ``ci95``, ``n``). Raises `errors.Conflict`
        (``NotSameBatch``, naming what differs; ``NotAnEvaluation``) or `errors.NotFound`."""
        params = {"a": evaluation_name(a, "a"), "b": evaluation_name(b, "b")}
        # `_path` checks the project; evaluations/compare sits beside the project's collections.
        path = self._path("agentgroups", project).rsplit("/", 1)[0] + "/evaluations/compare"
        return self._object(self._request("GET", path, params=params))
