"""Secrets in the API, and the model key and environment a run actor is given.

The values are kept sealed by `secrets.SecretStore`; this service checks what the API sends,
and opens values only for a run actor that asks for its own (`model_access`, `run_secrets`):
the answer travels over Ray's RPC into the actor's memory, never into a journal, status or log.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nodus.errors import Conflict, Invalid, NotFound
from nodus.resources import Secret, parse_resource
from nodus_ray.control.registry import Registry, check_project
from nodus_ray.control.run_pool import RunPoolService
from nodus_ray.control.secrets import SecretStore
from nodus_ray.store import layout

__all__ = ["SecretService"]


class SecretService:
    """The Secret verbs, the server's own model key, and what a run may open."""

    def __init__(
        self,
        registry: Registry,
        store: SecretStore,
        run_pool: RunPoolService,
        anthropic_base_url: str | None,
    ) -> None:
        self._registry = registry
        self._store = store
        self._run_pool = run_pool
        self._anthropic_base_url = anthropic_base_url

    def has_server_key(self) -> bool:
        """Whether the server has its own Anthropic key (blocking the first time: a storage read)."""
        return bool(self._store.server_key())

    async def apply_secret(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        check_project(project)
        secret = parse_resource(document, expected_kind="Secret")
        assert isinstance(secret, Secret)
        key = (project, f"secret/{secret.metadata.name}")
        async with self._registry.locks[key]:
            if mode == "create" and self._store.exists(project, secret.metadata.name):
                raise Conflict(
                    f"secret {secret.metadata.name!r} already exists",
                    code="AlreadyExists",
                    details={"kind": "Secret", "name": secret.metadata.name},
                )
            if not (secret.stringData or secret.data):
                raise Invalid(
                    "a Secret needs stringData (or data) with at least one value",
                    details={"field": "stringData"},
                )
            view, result = await asyncio.to_thread(
                self._store.apply, project, secret, create_only=(mode == "create")
            )
        return {"resource": view, "result": result}

    async def get_secret(self, project: str, name: str) -> dict[str, Any]:
        check_project(project)
        return self._store.get(project, name)

    async def list_secrets(self, project: str) -> list[dict[str, Any]]:
        check_project(project)
        return self._store.list(project)

    async def delete_secret(self, project: str, name: str) -> dict[str, Any]:
        check_project(project)
        return await asyncio.to_thread(self._store.delete, project, name)

    async def configure_model_key(self, key: str | None) -> str:
        """The server's own Anthropic key, from the environment of ``nodus up``; sealed in storage."""
        await asyncio.to_thread(self._store.set_server_key, key)
        await self._run_pool.refill()
        return "anthropic" if key else "offline"

    async def model_access(self, project: str, name: str) -> dict[str, Any]:
        """What a run actor needs to call its model: which provider, and the key, in memory only."""
        self._registry.run(project, name)
        pinned = await asyncio.to_thread(self._registry.storage.read_json, layout.run_agent(project, name))
        model = pinned["spec"].get("model") or {}
        base = {"baseUrl": self._anthropic_base_url, "access": model.get("access", "Nodus")}
        if model.get("access") == "BYOK":
            secret = model.get("apiKeySecret") or ""
            if not self._store.exists(project, secret):
                raise NotFound(
                    f"the agent's apiKeySecret {secret!r} does not exist in project {project!r}",
                    code="SecretNotFound",
                    details={"kind": "Secret", "name": secret},
                )
            values = await asyncio.to_thread(self._store.values, project, secret)
            if not values.get("ANTHROPIC_API_KEY"):
                raise Invalid(
                    f"secret {secret!r} has no ANTHROPIC_API_KEY",
                    code="SecretKeyMissing",
                    details={"kind": "Secret", "name": secret},
                )
            return {**base, "provider": "anthropic", "apiKey": values["ANTHROPIC_API_KEY"]}
        server_key = await asyncio.to_thread(self._store.server_key)
        if server_key:
            return {**base, "provider": "anthropic", "apiKey": server_key}
        return {**base, "provider": "offline", "apiKey": None}

    async def run_secrets(self, project: str, name: str) -> dict[str, Any]:
        """A run's environment (`spec.env`, secret values opened) and the values to redact.

        Like the model key, the answer travels over Ray's RPC into the run actor's memory only.
        ``redact`` maps ``secret/KEY`` to each secret value of its env, so the actor masks them
        in whatever it records (`redaction`); the actor adds the BYOK key, which `model_access`
        already gave it.
        """
        self._registry.run(project, name)
        pinned = await asyncio.to_thread(self._registry.storage.read_json, layout.run_agent(project, name))
        env: dict[str, str] = {}
        redact: dict[str, str] = {}
        opened: dict[str, dict[str, str]] = {}
        for index, variable in enumerate(pinned["spec"].get("env") or []):
            reference = (variable.get("valueFrom") or {}).get("secretKeyRef")
            if reference is None:
                env[variable["name"]] = variable.get("value") or ""
                continue
            secret, key = reference["name"], reference["key"]
            if secret not in opened:
                if not self._store.exists(project, secret):
                    raise NotFound(
                        f"spec.env[{index}] ({variable['name']}) names secret {secret!r}, which does not "
                        f"exist in project {project!r}",
                        code="SecretNotFound",
                        details={"kind": "Secret", "name": secret, "field": f"spec.env[{index}]"},
                    )
                opened[secret] = await asyncio.to_thread(self._store.values, project, secret)
            if key not in opened[secret]:
                raise Invalid(
                    f"spec.env[{index}] ({variable['name']}) names key {key!r}, which secret {secret!r} "
                    f"does not have (it has {', '.join(sorted(opened[secret])) or 'none'})",
                    code="SecretKeyMissing",
                    details={"kind": "Secret", "name": secret, "field": f"spec.env[{index}]"},
                )
            env[variable["name"]] = redact[f"{secret}/{key}"] = opened[secret][key]
        return {"env": env, "redact": redact}
