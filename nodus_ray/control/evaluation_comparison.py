"""``compare_evaluations``: the paired difference of two evaluation groups on the same batch.

Reads both evaluations' case records through `EvaluationService.group_results` (so an unknown
name is its 404, a group that is not an evaluation its 409 ``NotAnEvaluation``, expired records
its 410), refuses two different batches naming every field that differs, and hands the records
to the pure `core.eval_statistics.compare_records`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nodus.errors import Conflict
from nodus_ray.core.eval_statistics import BATCH_FIELDS, batch_differences, compare_records
from nodus_ray.core.evaluation import summarize

if TYPE_CHECKING:
    from nodus_ray.control.evaluations import EvaluationService

__all__ = ["compare_evaluations"]


def _side(name: str, evaluation: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """What the answer says of one evaluation: its name and how far it got, from the same case
    records as the comparison (the group's stored status may be a moment behind them)."""
    summary = summarize(items)
    return {
        "name": name,
        "repetitions": evaluation.get("repetitions"),
        **{key: summary[key] for key in ("scored", "unscored", "pending", "passRate", "meanReward")},
    }


async def compare_evaluations(evaluations: EvaluationService, project: str, a: str, b: str) -> dict[str, Any]:
    """``GET .../evaluations/compare?a=A&b=B``: A minus B, per task scored in both."""
    first = await evaluations.group_results(project, a)
    second = await evaluations.group_results(project, b)
    left, right = first.get("evaluation") or {}, second.get("evaluation") or {}
    differs = batch_differences(left, right)
    if differs:
        said = "; ".join(f"{field} {x!r} vs {y!r}" for field, (x, y) in differs.items())
        raise Conflict(
            f"agentgroups {a!r} and {b!r} are not evaluations of the same batch: {said} "
            f"(a comparison pairs the same tasks: same {', '.join(BATCH_FIELDS)})",
            code="NotSameBatch",
            details={
                "field": next(iter(differs)),
                "differs": {field: {"a": x, "b": y} for field, (x, y) in differs.items()},
            },
        )
    batch = {field: left.get(field) for field in BATCH_FIELDS}
    a_items, b_items = list(first.get("items") or []), list(second.get("items") or [])
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "EvaluationComparison",
        "batch": batch,
        "a": _side(a, left, a_items),
        "b": _side(b, right, b_items),
        **compare_records(a_items, b_items),
    }
