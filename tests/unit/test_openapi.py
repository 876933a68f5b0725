"""The published OpenAPI document describes what the routes really take and answer."""

from __future__ import annotations

from typing import Any

import schemathesis

from nodus_serve.app import create_app
from tests.fakes.control_plane import client_over


class _NoControlPlane:
    async def call(self, *_: Any) -> Any:  # never reached: only the document is read
        raise AssertionError("no call expected")


def _document() -> dict[str, Any]:
    return create_app(client_over(_NoControlPlane().call)).openapi()


def test_every_write_that_reads_a_body_documents_it() -> None:
    paths = _document()["paths"]
    bodiless = {
        ("post", "/v1/projects/{project}/agentruns/{name}/cancel"),
        ("post", "/v1/projects/{project}/agentgroups/{name}/cancel"),
        ("post", "/v1/projects/{project}/webhooks/{name}/test"),
        *(
            ("post", f"/v1/projects/{{project}}/agentruns/{{name}}/{verb}")
            for verb in ("suspend", "resume", "retry")
        ),
    }
    for path, operations in paths.items():
        for method, operation in operations.items():
            if method in ("post", "put", "patch") and (method, path) not in bodiless:
                assert "requestBody" in operation, f"{method.upper()} {path} documents no body"


def test_every_operation_documents_the_error_shape_and_its_successes() -> None:
    document = _document()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            for status in ("400", "404", "409", "413", "422", "503"):
                assert responses[status]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/ErrorBody"
                }, f"{method} {path} {status}"
    creates = document["paths"]["/v1/projects/{project}/agents/{name}"]["put"]["responses"]
    assert {"200", "201"} <= set(creates)
    messages = document["paths"]["/v1/projects/{project}/agentruns/{name}/messages"]["post"]["responses"]
    assert "202" in messages


def test_resource_bodies_are_the_validating_models_with_every_reference_resolvable() -> None:
    document = _document()
    schemas = document["components"]["schemas"]
    agent = schemas["Agent"]
    assert agent["additionalProperties"] is False and set(agent["required"]) == {"metadata"}
    assert "evaluation" in schemas["AgentGroupSpec"]["properties"]

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["$ref"]] if "$ref" in node else []
            return found + [ref for value in node.values() for ref in refs(value)]
        if isinstance(node, list):
            return [ref for value in node for ref in refs(value)]
        return []

    for ref in refs(document):
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    loaded = schemathesis.openapi.from_dict(document)
    assert sum(1 for _ in loaded.get_all_operations()) == sum(len(ops) for ops in document["paths"].values())
