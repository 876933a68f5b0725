"""schemathesis against the real Serve app: no input makes it answer 5xx or break its own schema.

The OpenAPI document is fetched from the running server, so the test holds the server to what
it publishes (`nodus_serve.openapi`): every operation, with bodies generated from the same
pydantic models that validate them, plus schemathesis' own malformed variants. The number of
examples per operation is bounded (``NODUS_FUZZ_EXAMPLES``, default 25) so CI stays in budget;
raise it to fuzz longer locally.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .conftest import Server

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
