"""Standard Webhooks signatures: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``.

The secret is the specification's ``whsec_`` + base64 of 24 to 64 random bytes; the key is the
decoded bytes (what every Standard Webhooks library, Svix's among them, verifies with). A
receiver checks the signature over the exact bytes of the body and refuses a timestamp too far
from its clock (replays); ``webhook-id`` is the same for every retry of one event.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

__all__ = [
    "SECRET_PREFIX",
    "MIN_SECRET_BYTES",
    "MAX_SECRET_BYTES",
    "generate_secret",
    "secret_key",
    "sign",
    "signature_headers",
]

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64


def generate_secret() -> str:
    """A new ``whsec_`` secret of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret; ValueError says what is wrong (never the value)."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"the signing secret must start with {SECRET_PREFIX!r} (Standard Webhooks)")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :].strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the signing secret after {SECRET_PREFIX!r} is not base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"the signing secret must decode to {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, "
            f"not {len(key)}"
        )
    return key


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one message: ``v1,<base64 digest>``."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers, and the content type."""
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(key, message_id, timestamp, body),
    }
