"""The control plane's comparison of two evaluations: the facade's part for
`evaluation_comparison` (decision 60).

A mixin of `plane.ControlPlane`, apart so the facade stays a table of one-line delegations. It
imports no service at module level (every process holding a handle to the control plane loads
this module, decision 54).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nodus_ray.control.recovery import RecoveryGate, after_recovery

if TYPE_CHECKING:
    from nodus_ray.control.evaluations import EvaluationService

__all__ = ["EvaluationStatisticsFacade"]


class EvaluationStatisticsFacade:
    """``compare_evaluations``: the paired difference of two evaluations on the same batch."""

    evaluations: EvaluationService

    @property
    def recovery(self) -> RecoveryGate:  # pragma: no cover - the ControlPlane's own property wins
        raise NotImplementedError

    @after_recovery
    async def compare_evaluations(self, project: str, a: str, b: str) -> dict[str, Any]:
        from nodus_ray.control.evaluation_comparison import compare_evaluations

        return await compare_evaluations(self.evaluations, project, a, b)
