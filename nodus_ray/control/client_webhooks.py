"""`ControlPlaneClient`'s Webhook calls (the API's ``/webhooks`` routes), kept apart so the client
module stays a table of the engine's own calls. Each is one call on the control plane's
`plane_webhooks.WebhookFacade`, under the client's policy."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["WebhookCalls"]

T = TypeVar("T")


class WebhookCalls:
    """Apply, read, patch and delete Webhooks; their deliveries; a test event."""

    if TYPE_CHECKING:

        async def _call(self, invoke: Callable[[Any], Awaitable[T]]) -> T: ...

    async def apply_webhook(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self._call(lambda h: h.apply_webhook.remote(project, document, mode))

    async def patch_webhook(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._call(lambda h: h.patch_webhook.remote(project, name, patch))

    async def get_webhook(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.get_webhook.remote(project, name))

    async def list_webhooks(self, project: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.list_webhooks.remote(project))

    async def delete_webhook(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.delete_webhook.remote(project, name))

    async def webhook_deliveries(self, project: str, name: str, limit: int = 50) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.webhook_deliveries.remote(project, name, limit))

    async def webhook_test_event(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.webhook_test_event.remote(project, name))
