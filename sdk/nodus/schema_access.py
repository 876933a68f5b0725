"""Who may do what: Secrets (values written, never read back) and API Tokens (a role in one
project, for a while or until revoked).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from .durations import parse_duration
from .schema_common import API_VERSION, ObjectMeta, OpenModel, StrictModel

__all__ = [
    "MAX_SECRET_VALUE_BYTES",
    "SecretStatus",
    "Secret",
    "ROLES",
    "Role",
    "TokenSpec",
    "TokenStatus",
    "Token",
]

_SECRET_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,252}$")
MAX_SECRET_VALUE_BYTES = 64 * 1024


def _validate_secret_values(values: dict[str, str] | None) -> dict[str, str] | None:
    # Messages name keys, never values: a refusal must not echo a secret back.
    for key, value in (values or {}).items():
        if not _SECRET_KEY.match(key):
            raise ValueError(f"key {key[:40]!r} must look like an environment variable name")
        if len(value.encode("utf-8")) > MAX_SECRET_VALUE_BYTES:
            raise ValueError(f"the value of {key} is larger than {MAX_SECRET_VALUE_BYTES} bytes")
    return values


def _validate_base64_values(values: dict[str, str] | None) -> dict[str, str] | None:
    import base64
    import binascii

    for key, value in (values or {}).items():
        try:
            base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise ValueError(f"the value of {key[:40]!r} is not base64 of UTF-8 text") from None
    return values


class SecretStatus(OpenModel):
    keys: list[str] = Field(default_factory=list)
    updatedAt: str | None = None


class Secret(StrictModel):
    """Named values such as ``ANTHROPIC_API_KEY``: written with ``stringData`` (or base64
    ``data``), never read back; the API shows only their keys."""

    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Secret"] = "Secret"
    metadata: ObjectMeta
    type: Literal["Opaque"] = "Opaque"
    stringData: Annotated[dict[str, str] | None, AfterValidator(_validate_secret_values)] = Field(
        default=None, repr=False
    )
    data: Annotated[
        dict[str, str] | None,
        AfterValidator(_validate_base64_values),
        AfterValidator(_validate_secret_values),
    ] = Field(default=None, repr=False)
    status: SecretStatus | None = None


# What a token may do in its project: ``read`` (every GET), ``write`` (read, and every change
# to agents, runs, groups and secrets), ``admin`` (write, and the project's tokens).
Role = Literal["read", "write", "admin"]
ROLES: tuple[str, ...] = ("read", "write", "admin")
_MAX_TOKEN_LIFETIME = timedelta(days=366)


def _validate_token_lifetime(value: str) -> str:
    duration = parse_duration(value)
    if duration < timedelta(minutes=1) or duration > _MAX_TOKEN_LIFETIME:
        raise ValueError("must be from 1m to 8784h (a year)")
    return value


class TokenSpec(StrictModel):
    role: Role = "read"
    # How long the token is accepted after it is created; unset: until it is revoked.
    expiresIn: Annotated[str, AfterValidator(_validate_token_lifetime)] | None = None


class TokenStatus(OpenModel):
    # The token itself, in the answer to its creation only: the server keeps a hash.
    token: str | None = Field(default=None, repr=False)
    prefix: str | None = None  # the first characters, to tell tokens apart in a list
    createdAt: str | None = None
    expiresAt: str | None = None


class Token(StrictModel):
    """An API bearer token of one project, with a role; created by POST, revoked by DELETE."""

    apiVersion: Literal["nodus.dev/v1"] = API_VERSION
    kind: Literal["Token"] = "Token"
    metadata: ObjectMeta
    spec: TokenSpec = Field(default_factory=TokenSpec)
    status: TokenStatus | None = None
