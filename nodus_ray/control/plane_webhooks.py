"""The control plane's Webhooks: the facade's part for `webhook_service.WebhookService`.

A mixin of `plane.ControlPlane`, apart so the facade stays a table of one-line delegations. It
imports no service at module level (every process holding a handle to the control plane loads
this module, decision 54); the service itself is composed with the others (`services.compose`)
because it listens to every run's and group's change from the start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nodus_ray.control.recovery import RecoveryGate, after_recovery

if TYPE_CHECKING:
    from nodus_ray.control.services import Services

__all__ = ["WebhookFacade"]


class WebhookFacade:
    """Webhooks: apply, read, patch, delete; their deliveries; a test event."""

    _services: Services

    @property
    def recovery(self) -> RecoveryGate:  # pragma: no cover - the ControlPlane's own property wins
        raise NotImplementedError

    @after_recovery
    async def apply_webhook(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self._services.webhooks.apply_webhook(project, document, mode)

    @after_recovery
    async def patch_webhook(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._services.webhooks.patch_webhook(project, name, patch)

    @after_recovery
    async def get_webhook(self, project: str, name: str) -> dict[str, Any]:
        return await self._services.webhooks.get_webhook(project, name)

    @after_recovery
    async def list_webhooks(self, project: str) -> list[dict[str, Any]]:
        return await self._services.webhooks.list_webhooks(project)

    @after_recovery
    async def delete_webhook(self, project: str, name: str) -> dict[str, Any]:
        return await self._services.webhooks.delete_webhook(project, name)

    @after_recovery
    async def webhook_deliveries(self, project: str, name: str, limit: int = 50) -> list[dict[str, Any]]:
        return await self._services.webhooks.list_deliveries(project, name, limit)

    @after_recovery
    async def webhook_test_event(self, project: str, name: str) -> dict[str, Any]:
        return await self._services.webhooks.send_test(project, name)
