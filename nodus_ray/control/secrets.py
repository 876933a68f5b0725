"""Secrets: sealed in storage, shown by their keys only, opened only for the run that needs one.

The control plane owns this store. Nothing it returns to the API contains a value; the only
way out for a value is `SecretStore.value`, which the control plane calls when a run actor
asks for the Anthropic key of its own agent, and the answer travels in memory over Ray's RPC,
never into a journal, a status or a log.
"""

from __future__ import annotations

import base64
from typing import Any

from nodus.errors import NotFound
from nodus.resources import API_VERSION, Secret
from nodus_ray.store.secret_box import SecretBox
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import utc_now

__all__ = ["SecretStore", "SERVER_MODEL_KEY"]

# The server's own Anthropic key (access: Nodus) is kept sealed like any other secret.
SERVER_MODEL_KEY = "system/anthropic-key.json"


def _key(project: str, name: str) -> str:
    return f"projects/{project}/secrets/{name}.json"


class SecretStore:
    def __init__(self, storage: Storage, box: SecretBox):
        self._storage = storage
        self._box = box
        self._views: dict[tuple[str, str], dict[str, Any]] = {}
        self._server_key: tuple[str | None] | None = None  # (key,) once known; None: not read yet

    def load(self) -> None:
        for project in self._storage.list_dir("projects"):
            for file in self._storage.list_dir(f"projects/{project}/secrets"):
                if file.endswith(".json"):
                    stored = self._storage.read_json(f"projects/{project}/secrets/{file}")
                    self._views[(project, file[:-5])] = stored["resource"]

    def apply(self, project: str, secret: Secret, *, create_only: bool) -> tuple[dict[str, Any], str]:
        """Store the values sealed; returns the value-free view and created/configured/unchanged."""
        name = secret.metadata.name
        existing = self._views.get((project, name))
        values = dict(secret.stringData or {})
        for key, encoded in (secret.data or {}).items():
            values.setdefault(key, base64.b64decode(encoded).decode("utf-8"))
        if existing is not None and not create_only:
            current = self.values(project, name)
            if current == values:
                return existing, "unchanged"
        view = {
            "apiVersion": API_VERSION,
            "kind": "Secret",
            "metadata": {
                "name": name,
                "project": project,
                "uid": existing["metadata"]["uid"] if existing else _uid(),
                "creationTimestamp": existing["metadata"]["creationTimestamp"] if existing else utc_now(),
                "labels": secret.metadata.labels,
            },
            "type": secret.type,
            "status": {"keys": sorted(values), "updatedAt": utc_now()},
        }
        envelope = self._box.seal(values, context=f"{project}/{name}")
        self._storage.write_json(_key(project, name), {"resource": view, "sealed": envelope})
        self._views[(project, name)] = view
        return view, "created" if existing is None else "configured"

    def exists(self, project: str, name: str) -> bool:
        return (project, name) in self._views

    def get(self, project: str, name: str) -> dict[str, Any]:
        view = self._views.get((project, name))
        if view is None:
            raise NotFound(
                f"secret {name!r} not found in project {project!r}", details={"kind": "Secret", "name": name}
            )
        return view

    def list(self, project: str) -> list[dict[str, Any]]:
        return [view for (p, _), view in sorted(self._views.items()) if p == project]

    def delete(self, project: str, name: str) -> dict[str, Any]:
        view = self.get(project, name)
        self._storage.delete(_key(project, name))
        self._views.pop((project, name), None)
        return view

    def values(self, project: str, name: str) -> dict[str, str]:
        self.get(project, name)
        stored = self._storage.read_json(_key(project, name))
        return self._box.open(stored["sealed"], context=f"{project}/{name}")

    def set_server_key(self, key: str | None) -> None:
        """The server's own Anthropic key, from the environment of ``nodus up``; None clears it."""
        if key:
            self._storage.write_json(
                SERVER_MODEL_KEY, self._box.seal({"ANTHROPIC_API_KEY": key}, context="system")
            )
        else:
            self._storage.delete(SERVER_MODEL_KEY)
        self._server_key = (key or None,)

    def server_key(self) -> str | None:
        """Read and opened once; this store is the key's only writer, so the copy stays true."""
        if self._server_key is None:
            try:
                envelope = self._storage.read_json(SERVER_MODEL_KEY)
                self._server_key = (self._box.open(envelope, context="system").get("ANTHROPIC_API_KEY"),)
            except FileNotFoundError:
                self._server_key = (None,)
        return self._server_key[0]


def _uid() -> str:
    import uuid

    return uuid.uuid4().hex
