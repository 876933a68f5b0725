"""Webhooks from Python: `Client.webhook_deliveries` and `Client.send_webhook_test`.

A mixin of `client.Client`. The Webhook itself is a resource like the others
(``client.apply("webhooks", document)``, ``client.get("webhooks", name)``,
``client.delete("webhooks", name)``); `webhook_document` builds one. Deliveries are each event
owed to the Webhook, newest first, with every attempt (status code, duration, error).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._client_core import ClientCore
from .schema_common import API_VERSION

if TYPE_CHECKING:
    pass

__all__ = ["WebhookCalls", "webhook_document"]


def webhook_document(
    name: str,
    url: str,
    *,
    secret: str,
    key: str = "signingSecret",
    events: Sequence[str] | None = None,
    group: str | None = None,
) -> dict[str, Any]:
    """A Webhook document: POSTs to ``url``, signed with key ``key`` of Secret ``secret``
    (a ``whsec_`` value); ``events`` (all when None) of the project, or of ``group`` only."""
    spec: dict[str, Any] = {"url": url, "secretRef": {"name": secret, "key": key}}
    if events is not None:
        spec["events"] = list(events)
    if group is not None:
        spec["group"] = group
    return {"apiVersion": API_VERSION, "kind": "Webhook", "metadata": {"name": name}, "spec": spec}


class WebhookCalls(ClientCore):
    """`Client`'s Webhook calls beyond the resource's own."""

    def webhook_deliveries(
        self, name: str, *, limit: int = 50, project: str | None = None
    ) -> list[dict[str, Any]]:
        """The Webhook's deliveries, newest first (at most ``limit``, up to 200): each with its
        ``eventId`` (the ``webhook-id`` header), ``eventType``, ``state`` (Pending, Delivered,
        Failed), ``nextAttemptAt``, ``attempts`` and the ``payload`` sent."""
        path = self._path("webhooks", project, name, "deliveries")
        answer = self._object(self._request("GET", path, params={"limit": str(limit)}))
        items: list[dict[str, Any]] = answer.get("items") or []
        return items

    def send_webhook_test(self, name: str, *, project: str | None = None) -> dict[str, Any]:
        """Send a ``webhook.test`` event to the Webhook now; returns its delivery (Pending)."""
        return self._object(self._request("POST", self._path("webhooks", project, name, "test")))
