"""AccessService over real local storage: tokens authenticate until revoked, across a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodus_ray.control.tokens import token_digest
from tests.unit.test_control_support import make_plane


def test_a_token_authenticates_until_it_is_revoked_and_a_restart_keeps_both(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        access = plane.services.access
        document = {
            "apiVersion": "nodus.dev/v1",
            "kind": "Token",
            "metadata": {"name": "ci"},
            "spec": {"role": "write"},
        }
        created = await access.create_token("demo", document, created_by="alice")
        secret = created["status"]["token"]
        principal = await access.authenticate(token_digest(secret))
        assert principal is not None and principal["project"] == "demo" and principal["role"] == "write"
        assert [t["metadata"]["name"] for t in await access.list_tokens("demo")] == ["ci"]
        assert secret not in str(plane.storage.read_json("projects/demo/tokens/ci.json"))

        restarted = (await plane.restart()).services.access
        assert await restarted.authenticate(token_digest(secret)) is not None
        await restarted.revoke_token("demo", "ci")
        assert await restarted.authenticate(token_digest(secret)) is None
        assert await (await plane.restart()).services.access.authenticate(token_digest(secret)) is None

    asyncio.run(scenario())


def test_the_operator_token_stays_the_same_while_it_works(tmp_path: Path) -> None:
    async def scenario() -> None:
        plane = await make_plane(tmp_path)
        first = await plane.services.access.ensure_operator_token(None)
        assert await plane.services.access.ensure_operator_token(first) == first
        restarted = await plane.restart()
        assert await restarted.services.access.ensure_operator_token(first) == first
        assert await restarted.services.access.authenticate(token_digest(first)) is not None

    asyncio.run(scenario())
