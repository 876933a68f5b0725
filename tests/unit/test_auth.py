"""Tokens are stored hashed and checked on every /v1 request; roles and projects decide the rest."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodus import credentials
from nodus.config import load_settings
from nodus.errors import Conflict
from nodus.resources import Token
from nodus_ray.control.list_query import ListPage
from nodus_ray.control.tokens import LOCAL_ADMIN, OPERATOR, TokenStore, token_digest
from nodus_ray.store.storage import Storage
from nodus_serve.app import create_app
from nodus_serve.auth import required_access
from tests.fakes.control_plane import client_over


def _token(name: str, role: str = "read", expires_in: str | None = None) -> Token:
    spec: dict[str, Any] = {"role": role}
    if expires_in:
        spec["expiresIn"] = expires_in
    return Token.model_validate({"metadata": {"name": name}, "spec": spec})


class _Gateway:
    """The control plane's token verbs over a real TokenStore; every other call answers a stub."""

    def __init__(self, store: TokenStore) -> None:
        self.store = store
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    async def call(self, method: str, *args: Any) -> Any:
        self.calls.append((method, args))
        if method == "authenticate":
            principal = self.store.authenticate(args[0])
            return principal.to_dict() if principal else None
        if method == "create_token":
            project, document, created_by = args
            return self.store.create(project, Token.model_validate(document), created_by=created_by)
        if method == "revoke_token":
            return self.store.revoke(*args)
        if method == "list_tokens":
            return self.store.list(*args)
        if method == "list_page":
            return ListPage()
        if method.startswith("list_"):
            return []
        return {"metadata": {"name": args[-1] if args else ""}}


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    return TokenStore(Storage(str(tmp_path / "storage")))


def _request(
    gateway: _Gateway, method: str, path: str, token: str | None = None, **kwargs: Any
) -> httpx.Response:
    async def send() -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.ASGITransport(app=create_app(client_over(gateway.call)))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            return await http.request(method, path, headers=headers, **kwargs)

    return asyncio.run(send())


def test_only_the_hash_of_a_token_is_stored_and_it_survives_a_reload(
    tmp_path: Path, store: TokenStore
) -> None:
    created = store.create("team-a", _token("ci", "write"), created_by="*/local-admin")
    value = created["status"]["token"]
    assert value.startswith("nodus_") and len(value) > 40
    files = list((tmp_path / "storage").rglob("*.json"))
    assert files and all(value not in file.read_text() for file in files)
    assert token_digest(value) in files[0].read_text()
    reloaded = TokenStore(Storage(str(tmp_path / "storage")))
    reloaded.load()
    principal = reloaded.authenticate(token_digest(value))
    assert principal is not None and (principal.project, principal.role, principal.name) == (
        "team-a",
        "write",
        "ci",
    )
    assert "token" not in reloaded.get("team-a", "ci")["status"]


def test_a_revoked_or_expired_token_is_refused(store: TokenStore) -> None:
    from datetime import UTC, datetime, timedelta

    value = store.create("p", _token("short", expires_in="1h"), created_by="x")["status"]["token"]
    assert store.authenticate(token_digest(value)) is not None
    later = datetime.now(UTC) + timedelta(hours=1, seconds=1)
    assert store.authenticate(token_digest(value), now=later) is None
    other = store.create("p", _token("gone"), created_by="x")["status"]["token"]
    store.revoke("p", "gone")
    assert store.authenticate(token_digest(other)) is None
    with pytest.raises(Conflict):
        store.create("p", _token("short"), created_by="x")


def test_the_operator_token_is_kept_while_it_works_and_replaced_when_it_does_not(store: TokenStore) -> None:
    first = store.ensure_operator_token(None)
    assert store.ensure_operator_token(first) == first
    project_token = store.create("p", _token("x", "admin"), created_by="x")["status"]["token"]
    second = store.ensure_operator_token(project_token)  # a project token is no operator token
    assert second != first and store.authenticate(token_digest(first)) is None
    assert store.get(OPERATOR, LOCAL_ADMIN)["spec"]["role"] == "admin"
    assert store.ensure_operator_token("nodus_forged") not in (second, "nodus_forged")


@pytest.mark.parametrize(
    ("method", "path", "role", "project", "operator"),
    [
        ("GET", "/v1/projects/a/agentruns", "read", "a", False),
        ("HEAD", "/v1/projects/a/agents/x", "read", "a", False),
        ("POST", "/v1/projects/a/agentruns/r/cancel", "write", "a", False),
        ("DELETE", "/v1/projects/a/secrets/s", "write", "a", False),
        ("GET", "/v1/projects/a/tokens", "admin", "a", False),
        ("POST", "/v1/projects/a/credits", "admin", "a", True),
        ("GET", "/v1/projects/a/credits", "read", "a", False),
        ("GET", "/v1/info", "read", None, False),
    ],
)
def test_what_a_request_needs_follows_from_its_path_and_method(
    method: str, path: str, role: str, project: str | None, operator: bool
) -> None:
    access = required_access(method, path)
    assert (access.role, access.project, access.operator) == (role, project, operator)


def test_no_token_or_a_wrong_one_is_401_and_health_needs_none(store: TokenStore) -> None:
    gateway = _Gateway(store)
    missing = _request(gateway, "GET", "/v1/projects/a/agents")
    assert missing.status_code == 401 and missing.json()["code"] == "Unauthorized"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = _request(gateway, "GET", "/v1/projects/a/agents", token="nodus_not-a-token")
    assert wrong.status_code == 401 and "nodus_not-a-token" not in wrong.text
    assert _request(gateway, "GET", "/v1/info", token="").status_code == 401
    assert _request(gateway, "GET", "/healthz").status_code == 200
    assert not [
        call for call in gateway.calls if call[0] != "authenticate"
    ]  # nothing reached the control plane


def test_another_projects_resources_are_a_404_that_says_nothing(store: TokenStore) -> None:
    gateway = _Gateway(store)
    token = store.create("team-a", _token("a-admin", "admin"), created_by="x")["status"]["token"]
    answers = [
        _request(gateway, method, path, token=token, **extra)
        for method, path, extra in [
            ("GET", "/v1/projects/team-b/agentruns", {}),
            ("GET", "/v1/projects/team-b/agentruns/exists", {}),
            ("GET", "/v1/projects/nobody/agentruns/missing", {}),
            ("POST", "/v1/projects/team-b/agentruns/r/cancel", {}),
            ("DELETE", "/v1/projects/team-b/tokens/t", {}),
        ]
    ]
    assert {answer.status_code for answer in answers} == {404}
    assert {answer.json()["code"] for answer in answers} == {"NotFound"}
    assert answers[0].json()["message"] == "project 'team-b' not found"
    assert answers[1].json() == answers[0].json()  # an existing name and a missing one look alike
    assert _request(gateway, "GET", "/v1/projects/team-a/agentruns", token=token).status_code == 200


def test_roles_limit_what_a_token_may_do_in_its_project(store: TokenStore) -> None:
    gateway = _Gateway(store)
    reader = store.create("p", _token("reader", "read"), created_by="x")["status"]["token"]
    writer = store.create("p", _token("writer", "write"), created_by="x")["status"]["token"]
    refused = _request(gateway, "POST", "/v1/projects/p/agentruns/r/cancel", token=reader)
    assert refused.status_code == 403 and refused.json()["code"] == "Forbidden"
    assert refused.json()["details"] == {"token": "reader", "role": "read", "needs": "write"}
    assert _request(gateway, "POST", "/v1/projects/p/agentruns/r/cancel", token=writer).status_code == 200
    assert _request(gateway, "GET", "/v1/projects/p/tokens", token=writer).status_code == 403
    credit = _request(gateway, "POST", "/v1/projects/p/credits", token=writer, json={"amountUSD": "5"})
    assert credit.status_code == 403
    admin = store.create("p", _token("boss", "admin"), created_by="x")["status"]["token"]
    assert (
        _request(gateway, "POST", "/v1/projects/p/credits", token=admin, json={"amountUSD": "5"}).status_code
        == 403
    )
    operator = store.ensure_operator_token(None)
    assert (
        _request(
            gateway, "POST", "/v1/projects/p/credits", token=operator, json={"amountUSD": "5"}
        ).status_code
        == 200
    )


def test_a_token_created_through_the_api_works_and_stops_working_once_revoked(store: TokenStore) -> None:
    gateway = _Gateway(store)
    operator = store.ensure_operator_token(None)
    created = _request(
        gateway,
        "POST",
        "/v1/projects/p/tokens",
        token=operator,
        json={
            "apiVersion": "nodus.dev/v1",
            "kind": "Token",
            "metadata": {"name": "ci"},
            "spec": {"role": "read"},
        },
    )
    assert created.status_code == 201 and created.headers["cache-control"] == "no-store"
    value = created.json()["status"]["token"]
    assert created.json()["status"]["createdBy"] == "*/local-admin"
    who = _request(gateway, "GET", "/v1/whoami", token=value)
    assert who.json() == {"name": "ci", "project": "p", "role": "read", "expiresAt": None}
    listed = _request(gateway, "GET", "/v1/projects/p/tokens", token=operator).json()["items"]
    assert [item["metadata"]["name"] for item in listed] == ["ci"] and value not in json.dumps(listed)

    async def revoke_then_use() -> tuple[int, int]:
        app = create_app(client_over(gateway.call))  # one app: one replica and its cache
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            assert (
                await http.get("/v1/whoami", headers={"Authorization": f"Bearer {value}"})
            ).status_code == 200
            revoked = await http.delete(
                "/v1/projects/p/tokens/ci", headers={"Authorization": f"Bearer {operator}"}
            )
            after = await http.get("/v1/whoami", headers={"Authorization": f"Bearer {value}"})
            return revoked.status_code, after.status_code

    assert asyncio.run(revoke_then_use()) == (200, 401)


def test_the_sdk_finds_the_stored_token_and_the_environment_overrides_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    credentials.remember("http://localhost:9999/", "nodus_stored", project="team-a")
    settings = load_settings(api_url="http://127.0.0.1:9999", environ={})
    assert (settings.token, settings.project) == ("nodus_stored", "team-a")
    assert (
        load_settings(api_url="http://127.0.0.1:9999", environ={"NODUS_TOKEN": "nodus_env"}).token
        == "nodus_env"
    )
    assert load_settings(api_url="http://127.0.0.1:9998", environ={}).token is None
    assert credentials.credentials_file().stat().st_mode & 0o777 == 0o600
    assert (
        credentials.forget("http://127.0.0.1:9999")
        and load_settings(api_url="http://127.0.0.1:9999", environ={}).token is None
    )
