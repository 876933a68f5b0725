"""The control plane's exports: the facade's part for `exports.ExportService`.

A mixin of `plane.ControlPlane`, kept apart so the facade stays a table of one-line delegations.
It imports no service at module level (every process holding a handle to the control plane
loads this module, decision 54): the service is built on first use from the facade's own
registry, evaluations and secrets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodus_ray.control.recovery import RecoveryGate, after_recovery
from nodus_ray.export.page import ExportPage

if TYPE_CHECKING:
    from nodus_ray.control.evaluations import EvaluationService
    from nodus_ray.control.exports import ExportService
    from nodus_ray.control.registry import Registry
    from nodus_ray.control.secret_service import SecretService

__all__ = ["ExportFacade"]


class ExportFacade:
    """``export_run`` and ``export_evaluation``: a run's trajectory, an evaluation's cases."""

    registry: Registry
    evaluations: EvaluationService
    secrets: SecretService
    _exports: ExportService | None = None

    @property
    def recovery(self) -> RecoveryGate:  # pragma: no cover - the ControlPlane's own property wins
        raise NotImplementedError

    def _export_service(self) -> ExportService:
        if self._exports is None:
            from nodus_ray.control.exports import ExportService

            self._exports = ExportService(self.registry, self.evaluations, self.secrets)
        return self._exports

    @after_recovery
    async def export_run(self, project: str, name: str, format: str) -> ExportPage:
        return await self._export_service().export_run(project, name, format)

    @after_recovery
    async def export_evaluation(self, project: str, name: str, format: str, page: int = 0) -> ExportPage:
        return await self._export_service().export_evaluation(project, name, format, page)
