"""The API's answer to a bad body, under every role's token: a 4xx JSON refusal, never a 500.

The app runs over a fake control plane that keeps Agents and groups and validates documents
with the real parsers (`parse_resource`, `patched_document`), so a refused patch can be checked
to have changed nothing. Bodies: deeply nested, larger than the limit (declared or streamed),
malformed bytes, ``NaN``, not an object, strings where booleans and numbers belong, and merge
patches that null out what a resource needs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodus.errors import NotFound
from nodus.input_limits import MAX_BODY_BYTES, MAX_NESTING_DEPTH
from nodus.resources import parse_resource, parse_run_list
from nodus_ray.control.tokens import OPERATOR, token_digest
from nodus_ray.core.patch import patched_document
from nodus_serve.app import create_app
from tests.fakes.control_plane import client_over

V1 = "nodus.dev/v1"
BASE = "/v1/projects/default"
ROLES = {"read": "default", "write": "default", "admin": "default", "operator": OPERATOR}
TOKENS = {role: f"nodus_{role}_token" for role in ROLES}
AGENT = {
    "apiVersion": V1,
    "kind": "Agent",
    "metadata": {"name": "keeper"},
    "spec": {"system": "keep me", "perRunMaxCostUSD": "5.00", "maxTokens": 99},
}
GROUP = {"apiVersion": V1, "kind": "AgentGroup", "metadata": {"name": "g"}, "spec": {"agent": "keeper"}}


class _ControlPlane:
    """Keeps Agents and groups; validates every document with the real parsers."""

    def __init__(self) -> None:
        self.principals = {
            token_digest(token): {
                "name": role,
                "project": ROLES[role],
                "role": "admin" if role == "operator" else role,
                "expiresAt": None,
            }
            for role, token in TOKENS.items()
        }
        self.resources: dict[tuple[str, str], dict[str, Any]] = {}
        self._store(AGENT)
        self._store(GROUP)

    def _store(self, document: dict[str, Any]) -> dict[str, Any]:
        resource = parse_resource(document).model_dump(mode="json", exclude_none=True)
        self.resources[(resource["kind"], resource["metadata"]["name"])] = resource
        return {"result": "updated", "resource": resource}

    def _get(self, kind: str, name: str) -> dict[str, Any]:
        if (kind, name) not in self.resources:
            raise NotFound(f"{kind} {name} not found", details={"kind": kind, "name": name})
        return self.resources[(kind, name)]

    async def call(self, method: str, *args: Any) -> Any:
        if method == "authenticate":
            return self.principals.get(args[0])
        if method in ("apply_agent", "apply_group", "create_run", "apply_secret"):
            return self._store(args[1])
        if method == "create_runs":
            return {"replayed": False, "items": [r.model_dump(mode="json") for r in parse_run_list(args[1])]}
        if method == "create_token":
            parse_resource(args[1], expected_kind="Token")
            return {"metadata": args[1]["metadata"]}
        if method == "patch_agent":
            return self._store(patched_document(self._get("Agent", args[1]), args[2], args[1]))
        if method == "patch_group":
            return self._store(patched_document(self._get("AgentGroup", args[1]), args[2], args[1]))
        if method in ("send_message", "resolve_run"):
            raise NotFound("no such run", details={"kind": "AgentRun", "name": args[1]})
        if method == "add_credits":
            return {"balanceUSD": args[1]}
        return {}


# Every route that reads a body, with the method it takes.
ROUTES: list[tuple[str, str]] = [
    ("POST", f"{BASE}/agents"),
    ("PUT", f"{BASE}/agents/keeper"),
    ("PATCH", f"{BASE}/agents/keeper"),
    ("POST", f"{BASE}/agentruns"),
    ("PUT", f"{BASE}/agentruns/r"),
    ("POST", f"{BASE}/agentgroups"),
    ("PUT", f"{BASE}/agentgroups/g"),
    ("PATCH", f"{BASE}/agentgroups/g"),
    ("POST", f"{BASE}/secrets"),
    ("PUT", f"{BASE}/secrets/s"),
    ("POST", f"{BASE}/tokens"),
    ("POST", f"{BASE}/agentruns/r/messages"),
    ("POST", f"{BASE}/agentruns/r/resolve"),
    ("POST", f"{BASE}/credits"),
]


async def _send(cp: _ControlPlane, requests: list[tuple[str, str, str, Any]]) -> list[httpx.Response]:
    """``(role, method, path, content)``; content is bytes, or an async iterator (streamed)."""
    app = create_app(client_over(cp.call))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
        answers = []
        for role, method, path, content in requests:
            headers = {"Authorization": f"Bearer {TOKENS[role]}", "Content-Type": "application/json"}
            answers.append(await http.request(method, path, content=content, headers=headers))
        return answers


def _snapshot(cp: _ControlPlane) -> str:
    return json.dumps(sorted(cp.resources.items()), sort_keys=True)


def send(cp: _ControlPlane, role: str, method: str, path: str, content: Any) -> httpx.Response:
    return asyncio.run(_send(cp, [(role, method, path, content)]))[0]


def assert_refused(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    if status is not None:
        assert response.status_code == status, response.text[:300]
    body = response.json()
    assert set(body) == {"code", "message", "details"} and body["message"]
    assert "Traceback" not in response.text
    return dict(body)


def _allowed(role: str, path: str) -> bool:
    """Whether ``role`` may send a body to ``path`` (`nodus_serve.auth.required_access`)."""
    if path.endswith("/credits"):
        return role == "operator"
    if path.endswith("/tokens"):
        return role in ("admin", "operator")
    return role != "read"


def _nested(depth: int, opener: str) -> bytes:
    closer = {"[": "]", '{"a":': "}"}[opener]
    return (opener * depth + "1" + closer * depth).encode()


# -- the bodies that answered 500 --------------------------------------------------------------


@pytest.mark.parametrize("role", sorted(ROLES))
@pytest.mark.parametrize(
    "content",
    [b"[" * 100_000, _nested(50_000, '{"a":'), _nested(50_000, "["), b"{" * 100_000],
    ids=["100k-brackets", "50k-objects", "50k-arrays", "100k-braces"],
)
def test_deep_bodies_are_400_for_every_route_and_role(role: str, content: bytes) -> None:
    cp = _ControlPlane()
    before = _snapshot(cp)
    answers = asyncio.run(_send(cp, [(role, method, path, content) for method, path in ROUTES]))
    for (method, path), answer in zip(ROUTES, answers, strict=True):
        body = assert_refused(answer)
        if _allowed(role, path):
            assert answer.status_code == 400, (method, path, answer.text)
            assert "nested more than" in body["message"] or "not JSON" in body["message"]
        else:  # the token's role is refused before the body is read
            assert answer.status_code == 403 and body["code"] == "Forbidden", (method, path, answer.text)
    assert _snapshot(cp) == before


def test_a_body_just_inside_the_depth_limit_is_read_and_one_past_it_is_not() -> None:
    cp = _ControlPlane()
    inside = {"apiVersion": V1, "kind": "Agent", "metadata": {"name": "keeper"}, "spec": {}}
    place: dict[str, Any] = inside["spec"]  # type: ignore[assignment]
    for _ in range(MAX_NESTING_DEPTH - 2):  # the body and spec are two levels
        place["x"] = {}
        place = place["x"]
    answer = send(cp, "write", "PUT", f"{BASE}/agents/keeper", json.dumps(inside).encode())
    assert assert_refused(answer, 422)["details"]["field"] == "spec.x"  # read, then refused as unknown
    place["x"] = {}
    answer = send(cp, "write", "PUT", f"{BASE}/agents/keeper", json.dumps(inside).encode())
    assert "nested more than 32" in assert_refused(answer, 400)["message"]


def test_a_body_over_the_size_limit_is_413_declared_or_streamed() -> None:
    cp = _ControlPlane()
    big = b" " * (MAX_BODY_BYTES + 1)
    assert (
        assert_refused(send(cp, "write", "POST", f"{BASE}/agentruns", big), 413)["code"] == "PayloadTooLarge"
    )

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the reader stops at the limit
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    streamed = send(cp, "write", "POST", f"{BASE}/agentruns", chunks())
    assert assert_refused(streamed, 413)["details"]["limit"] == MAX_BODY_BYTES


@pytest.mark.parametrize("role", ["write", "admin", "operator"])
def test_a_patch_that_nulls_the_spec_is_refused_and_changes_nothing(role: str) -> None:
    cp = _ControlPlane()
    patch: dict[str, Any]
    before = _snapshot(cp)
    for path in (f"{BASE}/agents/keeper", f"{BASE}/agentgroups/g"):
        for patch, field in (
            ({"spec": None}, "spec"),
            ({"metadata": None}, "metadata"),
            ({"metadata": {"name": None}}, "metadata.name"),
            ({"apiVersion": None}, "apiVersion"),
        ):
            answer = send(cp, role, "PATCH", path, json.dumps(patch).encode())
            assert assert_refused(answer, 422)["details"]["field"] == field
    for patch, field in (
        ({"spec": {"system": None}}, "spec.system"),
        ({"spec": {"perRunMaxCostUSD": None}}, "spec.perRunMaxCostUSD"),
        ({"spec": {"model": None}}, "spec.model"),
        ({"spec": {"model": {"access": None}}}, "spec.model.access"),
    ):
        answer = send(cp, role, "PATCH", f"{BASE}/agents/keeper", json.dumps(patch).encode())
        assert assert_refused(answer, 422)["details"]["field"] == field
    for patch, field in (
        ({"spec": {"agent": None}}, "spec.agent"),
        ({"spec": {"limits": None}}, "spec.limits"),
        ({"spec": {"limits": {"maxActive": None}}}, "spec.limits.maxActive"),
    ):
        answer = send(cp, role, "PATCH", f"{BASE}/agentgroups/g", json.dumps(patch).encode())
        assert assert_refused(answer, 422)["details"]["field"] == field
    assert _snapshot(cp) == before
    agent = cp.resources[("Agent", "keeper")]
    assert agent["spec"]["system"] == "keep me" and agent["spec"]["perRunMaxCostUSD"] == "5.00"


def test_a_null_on_what_may_be_unset_still_removes_it() -> None:
    cp = _ControlPlane()
    labelled = {
        "metadata": {"labels": {"team": "a", "tier": "b"}},
        "spec": {"network": {"allowedHosts": ["pypi.org"]}},
    }
    assert (
        send(cp, "write", "PATCH", f"{BASE}/agents/keeper", json.dumps(labelled).encode()).status_code == 200
    )
    removal = {"metadata": {"labels": {"team": None}}, "spec": {"network": None, "image": None}}
    answer = send(cp, "write", "PATCH", f"{BASE}/agents/keeper", json.dumps(removal).encode())
    assert answer.status_code == 200, answer.text
    agent = answer.json()
    assert agent["metadata"]["labels"] == {"tier": "b"} and "network" not in agent["spec"]
    assert agent["spec"]["system"] == "keep me"


@pytest.mark.parametrize(
    ("method", "path", "document", "field"),
    [
        (
            "POST",
            f"{BASE}/agentruns",
            {
                "apiVersion": V1,
                "kind": "AgentRun",
                "metadata": {"name": "r"},
                "spec": {"agent": "keeper", "keepAlive": "yes"},
            },
            "spec.keepAlive",
        ),
        ("PATCH", f"{BASE}/agents/keeper", {"spec": {"maxTokens": "100"}}, "spec.maxTokens"),
        ("PATCH", f"{BASE}/agents/keeper", {"spec": {"maxToolCalls": True}}, "spec.maxToolCalls"),
        ("PATCH", f"{BASE}/agents/keeper", {"spec": {"maxTokens": 100.0}}, "spec.maxTokens"),
        ("PATCH", f"{BASE}/agents/keeper", {"spec": {"perRunMaxCostUSD": 0.5}}, "spec.perRunMaxCostUSD"),
        ("PATCH", f"{BASE}/agents/keeper", {"spec": {"system": 7}}, "spec.system"),
        ("PATCH", f"{BASE}/agentgroups/g", {"spec": {"sealed": "true"}}, "spec.sealed"),
        ("PATCH", f"{BASE}/agentgroups/g", {"spec": {"sealed": 1}}, "spec.sealed"),
        ("PATCH", f"{BASE}/agentgroups/g", {"spec": {"limits": {"maxActive": "3"}}}, "spec.limits.maxActive"),
        ("POST", f"{BASE}/credits", {"amountUSD": 10}, "amountUSD"),
    ],
)
def test_types_are_strict(method: str, path: str, document: dict[str, Any], field: str) -> None:
    cp = _ControlPlane()
    before = _snapshot(cp)
    answer = send(cp, "operator", method, path, json.dumps(document).encode())
    assert assert_refused(answer, 422)["details"]["field"] == field
    assert _snapshot(cp) == before


# -- fuzzed: any bad body, any route, any role ------------------------------------------------

_JSONISH = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.text(max_size=10), st.sampled_from(["yes", "1", "true"])
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "apiVersion",
                    "kind",
                    "metadata",
                    "spec",
                    "name",
                    "system",
                    "keepAlive",
                    "sealed",
                    "limits",
                    "maxActive",
                    "maxTokens",
                    "agent",
                    "payload",
                    "amountUSD",
                    "labels",
                    "model",
                    "access",
                ]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


def _bad_bodies() -> st.SearchStrategy[bytes]:
    nested = st.builds(
        _nested,
        st.integers(min_value=MAX_NESTING_DEPTH - 2, max_value=20_000),
        st.sampled_from(["[", '{"a":']),
    )
    return st.one_of(
        nested,
        st.binary(max_size=64),
        st.text(alphabet='[]{}:,"0a \\', max_size=200).map(str.encode),
        st.sampled_from([b"NaN", b'{"a": Infinity}', b'{"a": -Infinity}', b"1" * 5000, b'"\\ud800"', b""]),
        _JSONISH.map(lambda value: json.dumps(value).encode()),
        _JSONISH.map(
            lambda value: json.dumps(
                {"apiVersion": V1, "kind": "Agent", "metadata": {"name": "keeper"}, "spec": value}
            ).encode()
        ),
        _JSONISH.map(lambda value: json.dumps({"spec": value}).encode()),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    role=st.sampled_from(sorted(ROLES)),
    route=st.sampled_from(ROUTES),
    content=_bad_bodies(),
)
def test_no_body_makes_the_api_answer_5xx_under_any_role(
    role: str, route: tuple[str, str], content: bytes
) -> None:
    cp = _ControlPlane()
    answer = send(cp, role, route[0], route[1], content)
    if answer.status_code < 400:  # a body that happened to be right: it was applied as sent
        assert role != "read"
        return
    assert_refused(answer)
    agent = cp.resources[("Agent", "keeper")]
    assert agent["spec"]["system"] == "keep me"  # a refusal loses nothing
