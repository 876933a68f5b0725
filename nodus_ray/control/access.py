"""The control plane's token verbs: the API's ingress authenticates every request through here.

The ingress (`nodus_serve.auth`) decides what a principal may do from the request's path and
method; this mixin only keeps the tokens (`access_tokens.TokenStore`) and answers who a digest
belongs to. Tokens are read once at start, like every other resource.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nodus.resources import Token, parse_resource
from nodus_ray.control.tokens import TokenStore

__all__ = ["AccessControl"]


class AccessControl:
    """Mixed into `ControlPlane`, which provides ``tokens`` and ``_ensure_started``."""

    tokens: TokenStore
    _ensure_started: Callable[[], Awaitable[None]]

    async def authenticate(self, digest: str) -> dict[str, Any] | None:
        """The principal of a token digest, or None: unknown, revoked and expired look the same."""
        await self._ensure_started()
        principal = self.tokens.authenticate(digest)
        return principal.to_dict() if principal else None

    async def create_token(self, project: str, document: dict[str, Any], created_by: str) -> dict[str, Any]:
        await self._ensure_started()
        token = parse_resource(document, expected_kind="Token")
        assert isinstance(token, Token)
        return await asyncio.to_thread(self.tokens.create, project, token, created_by=created_by)

    async def get_token(self, project: str, name: str) -> dict[str, Any]:
        await self._ensure_started()
        return self.tokens.get(project, name)

    async def list_tokens(self, project: str) -> list[dict[str, Any]]:
        await self._ensure_started()
        return self.tokens.list(project)

    async def revoke_token(self, project: str, name: str) -> dict[str, Any]:
        await self._ensure_started()
        return await asyncio.to_thread(self.tokens.revoke, project, name)

    async def ensure_operator_token(self, current: str | None) -> str:
        """`nodus up`: the local user's operator token, the same one while it still works."""
        await self._ensure_started()
        return await asyncio.to_thread(self.tokens.ensure_operator_token, current)
