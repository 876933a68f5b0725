"""Webhooks: an HTTP(S) endpoint the server calls, signed, when a run or group ends or starts
waiting for a person.

The payload and its headers follow the Standard Webhooks specification (what Svix, and in
spirit Stripe and GitHub, send): ``webhook-id`` (the same for every retry of one event, so the
receiver can drop duplicates), ``webhook-timestamp`` and ``webhook-signature``
(``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``), keyed by a ``whsec_`` secret that a
project Secret holds (``spec.secretRef``): the key is never in the Webhook, its answers or logs.

``spec.url`` is checked on the server too (docs/webhooks.md): an address that is private,
loopback, link-local or otherwise not public is refused unless the operator opened it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, StrictBool

from nodus.schema_agent import SecretKeyRef
from nodus.schema_common import API_VERSION, DnsLabel, ObjectMeta, OpenModel, StrictModel

__all__ = [
    "MAX_WEBHOOK_URL_CHARS",
    "WebhookEvent",
    "WEBHOOK_EVENTS",
    "WebhookSpec",
    "WebhookStatus",
    "Webhook",
    "validate_webhook_url",
]

MAX_WEBHOOK_URL_CHARS = 2048


class WebhookEvent(StrEnum):
    """The event types a Webhook may subscribe to (``spec.events``; all of them when left out)."""

    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    # Waiting for a person: a decision on an interrupted step (NeedsResolution) or a message
    # to a keep-alive run (AwaitingMessage).
    RUN_WAITING = "run.waiting"
    GROUP_SUCCEEDED = "group.succeeded"
    GROUP_FAILED = "group.failed"
    GROUP_CANCELLED = "group.cancelled"


WEBHOOK_EVENTS: tuple[str, ...] = tuple(event.value for event in WebhookEvent)


def validate_webhook_url(value: str) -> str:
    """An absolute ``http``/``https`` URL with a host, no user-info, no fragment.

    The address it resolves to is checked by the server (it needs DNS and the operator's
    setting); this is the shape every entry point refuses alike.
    """
    if not isinstance(value, str) or not value or len(value) > MAX_WEBHOOK_URL_CHARS:
        raise ValueError(f"must be an http(s) URL of at most {MAX_WEBHOOK_URL_CHARS} characters")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{value[:80]!r} is not an http(s) URL (scheme {parts.scheme or 'none'!r})")
    if not parts.hostname:
        raise ValueError(f"{value[:80]!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not hold a user or password (sign with spec.secretRef instead)")
    if parts.fragment:
        raise ValueError("must not hold a fragment (#...)")
    if port == 0:
        raise ValueError("port 0 is not a port")
    if any(ch.isspace() or ord(ch) < 32 for ch in value):
        raise ValueError("must not hold spaces or control characters")
    return value


def _unique_events(events: list[WebhookEvent]) -> list[WebhookEvent]:
    if len(set(events)) != len(events):
        raise ValueError("lists an event twice")
    return events


class WebhookSpec(StrictModel):
    """``url``: where to POST; ``events``: which (all when left out); ``group``: only that
    AgentGroup's runs and the group itself; ``secretRef``: the project Secret key holding the
    ``whsec_...`` signing secret; ``paused``: record nothing and send nothing while true."""

    url: Annotated[str, AfterValidator(validate_webhook_url)]
    events: Annotated[list[WebhookEvent], AfterValidator(_unique_events)] = Field(
        default_factory=lambda: list(WebhookEvent), min_length=1
    )
    group: DnsLabel | None = None
    secretRef: SecretKeyRef
    paused: StrictBool = False


class WebhookStatus(OpenModel):
    """The deliveries as the server last saw them: the last success and failure (RFC 3339), the
    failures in a row since the last success, and deliveries still being retried."""

    # Since when its events are recorded: its creation, or its last change of spec (an end
    # that came before, or while it was paused, is not owed).
    subscribedSince: str | None = None
    lastSuccessAt: str | None = None
    lastFailureAt: str | None = None
    lastError: str | None = None
    consecutiveFailures: int = 0
    pending: int = 0
    delivered: int = 0
    failed: int = 0


class Webhook(StrictModel):
    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Webhook"] = "Webhook"
    metadata: ObjectMeta
    spec: WebhookSpec
    status: WebhookStatus | None = None
