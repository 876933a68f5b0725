"""Authentication and authorization of every ``/v1`` request, in one place: the ingress.

Every ``/v1`` call carries ``Authorization: Bearer <token>``. The token's digest is looked up in
the control plane (`nodus_ray.control.tokens`), and the answer is cached here for a few seconds so
a busy API does not ask the control plane twice per request. What the principal may do follows
from the path and method alone (`required_access`), so a route added later is covered without
remembering to protect it:

- ``GET``/``HEAD`` under ``/v1/projects/P`` needs ``read`` in P; any other method ``write``;
- ``/v1/projects/P/tokens`` needs ``admin`` in P;
- adding credits (``POST /v1/projects/P/credits``) needs an operator token: credits are money;
- changing the project's Budget (``/v1/projects/P/budgets``) needs ``admin`` in P;
- changing its Webhooks (``/v1/projects/P/webhooks``) needs ``admin`` in P: they send its events out;
- ``/v1/info``, ``/v1/prices``, ``/v1/whoami`` need any valid token.

A project token that names another project gets the same ``404`` whether that project, or the
resource, exists or not, so nothing of another project leaks: not its names, not its counts.
The one exception is project ``nodus``'s ready-made template agents (`control.templates`):
every token may read one, and another project's change to one is refused ``403``.
Health checks and the console page are outside ``/v1`` and need no token (the console asks for
one and sends it with its own API calls).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nodus.errors import Forbidden, NodusError, NotFound, Unauthorized
from nodus_ray.control.templates import is_template
from nodus_ray.control.tokens import OPERATOR, Principal, token_digest
from nodus_ray.store.timestamps import parse_timestamp

__all__ = ["Authenticator", "PrincipalCache", "Access", "required_access"]

_ROLE_RANK = {"read": 0, "write": 1, "admin": 2}
_READ_METHODS = frozenset({"GET", "HEAD"})
_CACHE_SECONDS = 5.0
_CACHE_ENTRIES = 10_000

Scope = dict[str, Any]


@dataclass(frozen=True)
class Access:
    """What a request needs: a role, in ``project`` (None: no project), or an operator token."""

    role: str
    project: str | None = None
    operator: bool = False
    what: str = ""  # said in a refusal: "creating agentruns", ...
    template: str | None = None  # the template agent the request is about (`control.templates`)


def required_access(method: str, path: str) -> Access:
    parts = path.strip("/").split("/")
    if len(parts) < 3 or parts[:2] != ["v1", "projects"]:
        return Access("read", what=f"{method} {path}")
    project, rest = parts[2], parts[3:]
    collection = rest[0] if rest else ""
    if len(rest) == 2 and collection == "agents" and is_template(project, rest[1]):
        role = "read" if method in _READ_METHODS else "write"
        return Access(role, project, what=f"{method} on template agent {rest[1]!r}", template=rest[1])
    if collection == "tokens":
        return Access("admin", project, what="managing tokens")
    if collection == "credits" and method not in _READ_METHODS:
        return Access("admin", project, operator=True, what="adding credits")
    if collection == "budgets" and method not in _READ_METHODS:
        return Access("admin", project, what="changing the project's Budget")
    if collection == "webhooks" and method not in _READ_METHODS:
        return Access("admin", project, what="changing the project's webhooks")
    if method in _READ_METHODS:
        return Access("read", project, what=f"reading {collection or 'the project'}")
    return Access("write", project, what=f"{method} on {collection or 'the project'}")


class PrincipalCache:
    """Digest -> principal for a few seconds; cleared whenever this replica revokes a token."""

    def __init__(self, seconds: float = _CACHE_SECONDS) -> None:
        self.seconds = seconds
        self._entries: dict[str, tuple[Principal, float]] = {}

    def get(self, digest: str) -> Principal | None:
        entry = self._entries.get(digest)
        if entry is None or entry[1] < time.monotonic():
            self._entries.pop(digest, None)
            return None
        return entry[0]

    def put(self, digest: str, principal: Principal) -> None:
        if len(self._entries) >= _CACHE_ENTRIES:
            self._entries.clear()
        self._entries[digest] = (principal, time.monotonic() + self.seconds)

    def clear(self) -> None:
        self._entries.clear()


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, credentials = bytes(value).decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return credentials.strip()
            return None
    return None


def authorize(principal: Principal, access: Access) -> None:
    """Refuse what ``principal`` may not do; another project is a plain 404 (its templates aside)."""
    other = (
        principal.project != OPERATOR and access.project is not None and access.project != principal.project
    )
    if other and access.template is not None:
        if access.role == "read":
            return  # every token reads a template, whatever its role
        raise Forbidden(
            f"agent {access.template!r} of project {access.project!r} is a ready-made template: other "
            f"projects run it (spec.agent: {access.template}) and cannot change or delete it",
            details={"token": principal.name, "kind": "Agent", "name": access.template},
        )
    if other:
        raise NotFound(
            f"project {access.project!r} not found", details={"kind": "Project", "name": access.project}
        )
    if access.operator and principal.project != OPERATOR:
        raise Forbidden(
            f"{access.what} needs an operator token; token {principal.name!r} belongs to project "
            f"{principal.project!r}",
            details={"token": principal.name, "needs": "operator"},
        )
    if _ROLE_RANK[principal.role] < _ROLE_RANK[access.role]:
        raise Forbidden(
            f"{access.what} needs role {access.role}; token {principal.name!r} has role {principal.role}",
            details={"token": principal.name, "role": principal.role, "needs": access.role},
        )


class Authenticator:
    """ASGI middleware: ``/v1`` requests go on only with a token that allows them.

    ``lookup(digest)`` asks the control plane; the principal is put in ``scope["state"]`` for
    routes that record who acted (a token's ``createdBy``).
    """

    def __init__(self, app: Any, lookup: Any, cache: PrincipalCache) -> None:
        self.app = app
        self.lookup = lookup
        self.cache = cache

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        try:
            principal = await self._principal(scope)
            authorize(principal, required_access(scope["method"], scope["path"]))
        except NodusError as refusal:
            await _refuse(send, refusal)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    async def _principal(self, scope: Scope) -> Principal:
        token = _bearer(scope)
        if token is None:
            raise Unauthorized(
                "this API needs a bearer token (Authorization: Bearer <token>); `nodus up` keeps "
                "one for the local user, `nodus login --token` stores another",
                details={"field": "Authorization"},
            )
        digest = token_digest(token)
        principal = self.cache.get(digest)
        if principal is None:
            found = await self.lookup(digest)
            if found is None:
                raise Unauthorized(
                    "the bearer token is not valid: unknown, revoked or expired",
                    details={"field": "Authorization"},
                )
            principal = Principal.from_dict(found)
            self.cache.put(digest, principal)
        if principal.expires_at and parse_timestamp(principal.expires_at) <= datetime.now(UTC):
            self.cache.clear()
            raise Unauthorized(
                "the bearer token is not valid: unknown, revoked or expired",
                details={"field": "Authorization"},
            )
        return principal


async def _refuse(send: Any, refusal: NodusError) -> None:
    body = json.dumps(refusal.to_dict()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="nodus"'))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
