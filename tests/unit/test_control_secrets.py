"""SecretService over real local storage: values never shown, opened only for a run that names them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from nodus.errors import Conflict, Invalid, NotFound
from tests.unit.test_control_support import agent_doc, make_plane, run_doc

VALUE = "sk-ant-unit-test-value-0123456789"


def _secret(name: str, **values: str) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": name}, "stringData": values}


def test_a_secret_is_sealed_shown_by_its_keys_and_survives_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        secrets = plane.services.secrets
        created = await secrets.apply_secret("demo", _secret("keys", API_TOKEN=VALUE), mode="create")
        assert created["result"] == "created" and created["resource"]["status"]["keys"] == ["API_TOKEN"]
        assert (await secrets.apply_secret("demo", _secret("keys", API_TOKEN=VALUE)))["result"] == "unchanged"
        with pytest.raises(Conflict) as exists:
            await secrets.apply_secret("demo", _secret("keys", API_TOKEN=VALUE), mode="create")
        assert exists.value.code == "AlreadyExists"
        with pytest.raises(Invalid) as empty:
            await secrets.apply_secret("demo", _secret("empty"))
        assert empty.value.details["field"] == "stringData"
        assert VALUE not in json.dumps(plane.storage.read_json("projects/demo/secrets/keys.json"))
        restarted = await plane.restart()
        after = restarted.services.secrets
        assert [s["metadata"]["name"] for s in await after.list_secrets("demo")] == ["keys"]
        assert VALUE not in json.dumps(await after.get_secret("demo", "keys"))
        await after.delete_secret("demo", "keys")
        with pytest.raises(NotFound):
            await after.get_secret("demo", "keys")

    asyncio.run(scenario())


def test_a_run_is_given_its_env_with_secret_values_to_redact(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        secrets = plane.services.secrets
        env = [
            {"name": "PLAIN", "value": "1"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "API_TOKEN"}}},
        ]
        await plane.services.agents.apply_agent("demo", agent_doc(env=env))
        await plane.services.runs.create_run("demo", run_doc("r1"))
        with pytest.raises(NotFound) as missing:
            await secrets.run_secrets("demo", "r1")
        assert (missing.value.code, missing.value.details["field"]) == ("SecretNotFound", "spec.env[1]")
        await secrets.apply_secret("demo", _secret("keys", OTHER="x"))
        with pytest.raises(Invalid) as no_key:
            await secrets.run_secrets("demo", "r1")
        assert no_key.value.code == "SecretKeyMissing"
        await secrets.apply_secret("demo", _secret("keys", API_TOKEN=VALUE))
        assert await secrets.run_secrets("demo", "r1") == {
            "env": {"PLAIN": "1", "TOKEN": VALUE},
            "redact": {"keys/API_TOKEN": VALUE},
        }

    asyncio.run(scenario())


def test_model_access_is_offline_without_a_key_and_byok_needs_its_secret(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        secrets = plane.services.secrets
        await plane.services.agents.apply_agent("demo", agent_doc())
        await plane.services.agents.apply_agent(
            "demo", agent_doc("byok", model={"access": "BYOK", "apiKeySecret": "anthropic"})
        )
        await plane.services.runs.create_run("demo", run_doc("plain"))
        await plane.services.runs.create_run("demo", run_doc("own", agent="byok"))
        assert (await secrets.model_access("demo", "plain"))["provider"] == "offline"
        assert await secrets.configure_model_key("sk-server") == "anthropic"
        access = await secrets.model_access("demo", "plain")
        assert (access["provider"], access["apiKey"], access["access"]) == ("anthropic", "sk-server", "Nodus")
        with pytest.raises(NotFound) as no_secret:
            await secrets.model_access("demo", "own")
        assert no_secret.value.code == "SecretNotFound"
        await secrets.apply_secret("demo", _secret("anthropic", ANTHROPIC_API_KEY=VALUE))
        assert (await secrets.model_access("demo", "own"))["apiKey"] == VALUE
        restarted = await plane.restart()  # the server key is sealed in storage
        assert (await restarted.services.secrets.model_access("demo", "plain"))["apiKey"] == "sk-server"
        assert await restarted.services.secrets.configure_model_key(None) == "offline"
        assert (await restarted.services.secrets.model_access("demo", "plain"))["provider"] == "offline"

    asyncio.run(scenario())
