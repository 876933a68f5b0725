"""Tokens in the control plane: the API's ingress authenticates every request through here.

The ingress (`nodus_serve.auth`) decides what a principal may do from the request's path and
method; this service only keeps the tokens (`tokens.TokenStore`) and answers who a digest
belongs to. Tokens are read once at start, like every other resource.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nodus.resources import Token, parse_resource
from nodus_ray.control.tokens import TokenStore

__all__ = ["AccessService"]


class AccessService:
    """The token verbs, over one `TokenStore`."""

    def __init__(self, tokens: TokenStore) -> None:
        self._tokens = tokens

    async def authenticate(self, digest: str) -> dict[str, Any] | None:
        """The principal of a token digest, or None: unknown, revoked and expired look the same."""
        principal = self._tokens.authenticate(digest)
        return principal.to_dict() if principal else None

    async def create_token(self, project: str, document: dict[str, Any], created_by: str) -> dict[str, Any]:
        token = parse_resource(document, expected_kind="Token")
        assert isinstance(token, Token)
        return await asyncio.to_thread(self._tokens.create, project, token, created_by=created_by)

    async def get_token(self, project: str, name: str) -> dict[str, Any]:
        return self._tokens.get(project, name)

    async def list_tokens(self, project: str) -> list[dict[str, Any]]:
        return self._tokens.list(project)

    async def revoke_token(self, project: str, name: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._tokens.revoke, project, name)

    async def ensure_operator_token(self, current: str | None) -> str:
        """`nodus up`: the local user's operator token, the same one while it still works."""
        return await asyncio.to_thread(self._tokens.ensure_operator_token, current)
