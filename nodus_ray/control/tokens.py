"""API tokens: issued once, stored as a hash, looked up by that hash on every request.

A token is ``nodus_`` and 43 characters of 32 random bytes. Only its SHA-256 goes to storage:
a copy of the storage (an S3 bucket, a backup) cannot be used to call the API. A slow password
hash is not needed because a token is not guessable the way a password is; the hash only has to
be one-way.

Project tokens live at ``projects/<p>/tokens/<name>.json`` and reach that project only, with a
role (``read``, ``write``, ``admin``). The operator's tokens live at ``system/tokens/<name>.json``
and reach every project as admin; `nodus up` makes one for the local user (`OPERATOR`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nodus.errors import Conflict, NotFound
from nodus.resources import API_VERSION, Token, parse_duration
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import format_timestamp, parse_timestamp, utc_now

__all__ = ["OPERATOR", "LOCAL_ADMIN", "Principal", "TokenStore", "token_digest"]

OPERATOR = "*"  # the project of an operator token: every project
LOCAL_ADMIN = "local-admin"  # the operator token `nodus up` keeps for the local user
_PREFIX = "nodus_"
_SHOWN_PREFIX = 10  # "nodus_" and 4 characters: enough to tell tokens apart, useless to guess


def token_digest(token: str) -> str:
    """What is stored and compared: the token's SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a token's name, its project (`OPERATOR`: all) and its role."""

    name: str
    project: str
    role: str
    expires_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "project": self.project, "role": self.role, "expiresAt": self.expires_at}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Principal:
        return cls(data["name"], data["project"], data["role"], data.get("expiresAt"))


def _path(project: str, name: str) -> str:
    if project == OPERATOR:
        return f"system/tokens/{name}.json"
    return f"projects/{project}/tokens/{name}.json"


class TokenStore:
    """The control plane's tokens: views in memory, indexed by digest; storage holds the same."""

    def __init__(self, storage: Storage):
        self._storage = storage
        self._records: dict[tuple[str, str], dict[str, Any]] = {}  # (project, name) -> {resource, sha256}
        self._by_digest: dict[str, tuple[str, str]] = {}

    def load(self) -> None:
        for file in self._storage.list_dir("system/tokens"):
            self._load_one(f"system/tokens/{file}")
        for project in self._storage.list_dir("projects"):
            for file in self._storage.list_dir(f"projects/{project}/tokens"):
                self._load_one(f"projects/{project}/tokens/{file}")

    def _load_one(self, path: str) -> None:
        if not path.endswith(".json"):
            return
        record = self._storage.read_json(path)
        metadata = record["resource"]["metadata"]
        self._remember((metadata["project"], metadata["name"]), record)

    def _remember(self, key: tuple[str, str], record: dict[str, Any]) -> None:
        self._records[key] = record
        self._by_digest[record["sha256"]] = key

    def authenticate(self, digest: str, now: datetime | None = None) -> Principal | None:
        """The principal of the token with this digest, if it exists and has not expired."""
        key = self._by_digest.get(digest)
        record = self._records.get(key) if key else None
        if record is None or not hmac.compare_digest(record["sha256"], digest):
            return None
        resource = record["resource"]
        expires_at = resource["status"].get("expiresAt")
        if expires_at and parse_timestamp(expires_at) <= (now or datetime.now(UTC)):
            return None
        return Principal(
            resource["metadata"]["name"],
            resource["metadata"]["project"],
            resource["spec"]["role"],
            expires_at,
        )

    def create(self, project: str, token: Token, *, created_by: str) -> dict[str, Any]:
        """Store a new token; the answer is the only place its value ever appears."""
        name = token.metadata.name
        if (project, name) in self._records:
            raise Conflict(
                f"token {name!r} already exists in project {project!r}; revoke it first or pick another name",
                code="AlreadyExists",
                details={"kind": "Token", "name": name},
            )
        value = _PREFIX + secrets.token_urlsafe(32)
        created = utc_now()
        expires_at = None
        if token.spec.expiresIn:
            expires_at = format_timestamp(parse_timestamp(created) + parse_duration(token.spec.expiresIn))
        resource: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "Token",
            "metadata": {
                "name": name,
                "project": project,
                "uid": secrets.token_hex(16),
                "creationTimestamp": created,
                "labels": token.metadata.labels,
            },
            "spec": {"role": token.spec.role, "expiresIn": token.spec.expiresIn},
            "status": {
                "prefix": value[:_SHOWN_PREFIX],
                "createdAt": created,
                "expiresAt": expires_at,
                "createdBy": created_by,
            },
        }
        record = {"resource": resource, "sha256": token_digest(value)}
        self._storage.write_json(_path(project, name), record)
        self._remember((project, name), record)
        return {**resource, "status": {**resource["status"], "token": value}}

    def get(self, project: str, name: str) -> dict[str, Any]:
        record = self._records.get((project, name))
        if record is None:
            raise NotFound(
                f"token {name!r} not found in project {project!r}", details={"kind": "Token", "name": name}
            )
        resource: dict[str, Any] = record["resource"]
        return resource

    def list(self, project: str) -> list[dict[str, Any]]:
        return [record["resource"] for (p, _), record in sorted(self._records.items()) if p == project]

    def revoke(self, project: str, name: str) -> dict[str, Any]:
        """Forget the token; it is refused from the next request on (API replicas cache for seconds)."""
        resource = self.get(project, name)
        record = self._records.pop((project, name))
        self._by_digest.pop(record["sha256"], None)
        self._storage.delete(_path(project, name))
        return resource

    def ensure_operator_token(self, current: str | None) -> str:
        """`nodus up`: keep the local user's operator token if it still works, else issue a new one.

        A lost or revoked ``local-admin`` is replaced, so the person at the machine that runs the
        server can always get back in (they hold the storage and the key anyway).
        """
        if (
            current
            and (principal := self.authenticate(token_digest(current))) is not None
            and principal.project == OPERATOR
        ):
            return current
        if (OPERATOR, LOCAL_ADMIN) in self._records:
            self.revoke(OPERATOR, LOCAL_ADMIN)
        fresh = Token.model_validate({"metadata": {"name": LOCAL_ADMIN}, "spec": {"role": "admin"}})
        return str(self.create(OPERATOR, fresh, created_by="nodus up")["status"]["token"])
