"""schemathesis against the real Serve app: no input makes it answer 5xx or break its own schema.

The OpenAPI document is fetched from the running server, so the test holds the server to what
it publishes (`nodus_serve.openapi`): every operation, with bodies generated from the same
pydantic models that validate them, plus schemathesis' own malformed variants. The number of
examples per operation is bounded (``NODUS_FUZZ_EXAMPLES``, default 25) so CI stays in budget;
raise it to fuzz longer locally.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .conftest import Server, unique

EXAMPLES = int(os.environ.get("NODUS_FUZZ_EXAMPLES", "25"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _operations(server: Server) -> list[Any]:
    # The events stream follows a run until it ends: fuzzed, it would hold the test open.
    published = schemathesis.openapi.from_url(f"{server.api_url}/openapi.json").exclude(
        path_regex=r"/events$"
    )
    return [result.ok() for result in published.get_all_operations()]


def test_no_input_breaks_the_api(server: Server) -> None:
    headers = {"Authorization": f"Bearer {server.token}"}
    operations = _operations(server)
    assert len(operations) > 30  # every route is published (a schema that lost them would pass vacuously)
    broken: dict[str, str] = {}
    sent: Counter[str] = Counter()
    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def fuzz(case: Any) -> None:
            sent[case.operation.label] += 1
            case.call_and_validate(base_url=server.api_url, headers=headers, checks=CHECKS, timeout=30)

        try:
            fuzz()
        except Exception as failure:  # noqa: BLE001 - collect every operation's, then report all
            broken[operation.label] = " ".join(str(failure).split())[:1500]
    assert not broken, "\n\n".join(f"{label}: {why}" for label, why in broken.items())
    assert set(sent) == {operation.label for operation in operations}  # every operation was called
    print(f"{sum(sent.values())} requests over {len(sent)} operations")


# -- raw bodies: nesting depth, size, malformed bytes, merge patches, every role's token ------

RAW_EXAMPLES = int(os.environ.get("NODUS_FUZZ_RAW_EXAMPLES", "60"))
_BASE = "/v1/projects/default"
_BODY_ROUTES = [
    ("POST", f"{_BASE}/agents"),
    ("PUT", f"{_BASE}/agents/fuzz-target"),
    ("PATCH", f"{_BASE}/agents/fuzz-target"),
    ("POST", f"{_BASE}/agentruns"),
    ("PATCH", f"{_BASE}/agentgroups/fuzz-missing"),
    ("POST", f"{_BASE}/agentruns/fuzz-missing/messages"),
    ("POST", f"{_BASE}/tokens"),
    ("POST", f"{_BASE}/credits"),
]
_KEYS = st.sampled_from(["spec", "metadata", "system", "keepAlive", "maxTokens", "limits", "agent", "labels"])
_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.just("yes")),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)),
    max_leaves=10,
)


def _raw_bodies() -> st.SearchStrategy[bytes]:
    def nested(depth: int, opener: str) -> bytes:
        return (opener * depth + "1" + {"[": "]", '{"a":': "}"}[opener] * depth).encode()

    return st.one_of(
        st.builds(nested, st.integers(min_value=30, max_value=100_000), st.sampled_from(["[", '{"a":'])),
        st.integers(min_value=1, max_value=100_000).map(lambda n: b"[" * n),  # unclosed, as the 500s were
        st.binary(max_size=40),
        st.sampled_from([b"NaN", b'{"a": Infinity}', b" " * (1024 * 1024 + 1)]),
        _VALUES.map(lambda value: json.dumps({"spec": value}).encode()),  # merge patches, nulls included
        _VALUES.map(lambda value: json.dumps(value).encode()),
    )


def _role_token(server: Server, role: str) -> str:
    with server.http() as http:
        created = http.post(
            f"{_BASE}/tokens",
            json={
                "apiVersion": "nodus.dev/v1",
                "kind": "Token",
                "metadata": {"name": unique(f"fuzz-{role}")},
                "spec": {"role": role},
            },
        )
    assert created.status_code == 201, created.text
    return str(created.json()["status"]["token"])


def test_no_raw_body_breaks_the_api_under_any_role(server: Server) -> None:
    agent = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": {"name": "fuzz-target"},
        "spec": {"system": "keep"},
    }
    with server.http() as http:
        assert http.put(f"{_BASE}/agents/fuzz-target", json=agent).status_code in (200, 201)
    tokens = {role: _role_token(server, role) for role in ("read", "write", "admin")}
    tokens["operator"] = server.token
    clients = {
        role: httpx.Client(base_url=server.api_url, headers={"Authorization": f"Bearer {t}"}, timeout=60)
        for role, t in tokens.items()
    }
    answered: Counter[int] = Counter()

    @settings(
        max_examples=RAW_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(role=st.sampled_from(sorted(tokens)), route=st.sampled_from(_BODY_ROUTES), content=_raw_bodies())
    def fuzz(role: str, route: tuple[str, str], content: bytes) -> None:
        answer = clients[role].request(
            route[0], route[1], content=content, headers={"content-type": "application/json"}
        )
        answered[answer.status_code] += 1
        assert answer.status_code < 500, (role, route, content[:80], answer.text[:300])
        if answer.status_code >= 400:
            body = answer.json()
            assert set(body) == {"code", "message", "details"}, answer.text[:300]

    try:
        fuzz()
    finally:
        for client in clients.values():
            client.close()
    assert sum(answered.values()) >= RAW_EXAMPLES
    print(f"raw bodies answered: {dict(answered)}")
