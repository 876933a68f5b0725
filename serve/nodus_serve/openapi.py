"""The OpenAPI document of the API: what each route takes and every answer it can give.

The routes read their bodies by hand (`app._body`), so that every refusal, a malformed body
included, is one JSON error in our own shape naming the field, which FastAPI's own body
parsing would not give. FastAPI therefore cannot see the bodies; this module describes them
from the same pydantic models that validate them, and documents the error answers every
route can give (`{code, message, details}`), so the document is a contract a client generator,
or a fuzzer such as schemathesis, can hold the server to.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

from nodus.resources import Agent, AgentGroup, AgentRun, AgentRunList, Budget, Secret, Token, Webhook

__all__ = ["ErrorBody", "install"]


class ErrorBody(BaseModel):
    """Every refusal: a reason code from the product documents, a message, and details such as
    ``field``."""

    model_config = ConfigDict(extra="allow")
    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


_ERRORS = {
    "400": "the body is not a JSON object",
    "401": "no bearer token, or one that is unknown, revoked or expired",
    "403": "the token's role (or project) does not allow this request",
    "404": "no such resource (or path)",
    "409": "a conflict with the resource's state (AlreadyExists, GroupSealed, ...)",
    "413": "the body or an input is too large",
    "422": "a field is invalid; details.field names it",
    "429": "the API is at its limit of requests in flight; nothing was done, retry after Retry-After",
    "503": "the control plane is (re)starting; try again",
}
_MODELS: tuple[type[BaseModel], ...] = (
    Agent,
    AgentRun,
    AgentRunList,
    AgentGroup,
    Secret,
    Token,
    Budget,
    Webhook,
    ErrorBody,
)
_ANY_OBJECT = {"type": "object"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_body(schema: dict[str, Any], media: str = "application/json") -> dict[str, Any]:
    return {"required": True, "content": {media: {"schema": schema}}}


_STRING = {"type": "string"}
_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/projects/{project}/agents"): _json_body(_ref("Agent")),
    ("put", "/v1/projects/{project}/agents/{name}"): _json_body(_ref("Agent")),
    ("post", "/v1/projects/{project}/agentruns"): _json_body(
        {"oneOf": [_ref("AgentRun"), _ref("AgentRunList")]}
    ),
    ("put", "/v1/projects/{project}/agentruns/{name}"): _json_body(_ref("AgentRun")),
    ("post", "/v1/projects/{project}/agentgroups"): _json_body(_ref("AgentGroup")),
    ("put", "/v1/projects/{project}/agentgroups/{name}"): _json_body(_ref("AgentGroup")),
    ("post", "/v1/projects/{project}/secrets"): _json_body(_ref("Secret")),
    ("put", "/v1/projects/{project}/secrets/{name}"): _json_body(_ref("Secret")),
    ("post", "/v1/projects/{project}/tokens"): _json_body(_ref("Token")),
    ("post", "/v1/projects/{project}/budgets"): _json_body(_ref("Budget")),
    ("put", "/v1/projects/{project}/budgets/{name}"): _json_body(_ref("Budget")),
    ("patch", "/v1/projects/{project}/budgets/{name}"): _json_body(
        _ANY_OBJECT, "application/merge-patch+json"
    ),
    ("post", "/v1/projects/{project}/webhooks"): _json_body(_ref("Webhook")),
    ("put", "/v1/projects/{project}/webhooks/{name}"): _json_body(_ref("Webhook")),
    ("patch", "/v1/projects/{project}/webhooks/{name}"): _json_body(
        _ANY_OBJECT, "application/merge-patch+json"
    ),
    ("patch", "/v1/projects/{project}/agents/{name}"): _json_body(
        _ANY_OBJECT, "application/merge-patch+json"
    ),
    ("patch", "/v1/projects/{project}/agentgroups/{name}"): _json_body(
        _ANY_OBJECT, "application/merge-patch+json"
    ),
    ("post", "/v1/projects/{project}/agentruns/{name}/messages"): _json_body(
        {
            "type": "object",
            "required": ["payload"],
            "additionalProperties": False,
            "properties": {"payload": _STRING, "messageKey": _STRING, "name": _STRING},
        }
    ),
    ("post", "/v1/projects/{project}/agentruns/{name}/resolve"): _json_body(
        {
            "type": "object",
            "required": ["step", "decision"],
            "additionalProperties": False,
            "properties": {
                "step": _STRING,
                "decision": {"enum": ["Completed", "NoEffect", "Cancelled"]},
                "expectedRevision": {"type": "integer"},
                "revision": {"type": "integer"},
                "checkpointSeq": {"type": "integer"},
                "result": _ANY_OBJECT,
                "evidence": {"oneOf": [_STRING, {"type": "object", "additionalProperties": _STRING}]},
            },
        }
    ),
    ("post", "/v1/projects/{project}/agentsources"): _json_body(
        {
            "type": "object",
            "required": ["files"],
            "additionalProperties": False,
            "properties": {"files": {"type": "object", "additionalProperties": _STRING}},
        }
    ),
    ("post", "/v1/projects/{project}/credits"): _json_body(
        {"type": "object", "required": ["amountUSD"], "properties": {"amountUSD": _STRING}}
    ),
}
# Successful answers other than 200 (FastAPI documents 200 only).
_CREATED = {"description": "created", "content": {"application/json": {"schema": _ANY_OBJECT}}}
_DELIVERED = {
    "description": "delivered: the input went to the live run holding spec.sessionKey as a message "
    "(X-Nodus-Result: delivered, X-Nodus-Message-Seq); the body is that run",
    "content": {"application/json": {"schema": _ANY_OBJECT}},
}
_EXTRA_SUCCESS: dict[tuple[str, str], dict[str, Any]] = {
    **{(method, path): {"201": _CREATED} for method, path in _BODIES if method in ("post", "put")},
    ("post", "/v1/projects/{project}/agentruns/{name}/messages"): {
        "202": {
            "description": "accepted (200: the same messageKey again)",
            "content": {"application/json": {"schema": _ANY_OBJECT}},
        }
    },
    ("post", "/v1/projects/{project}/credits"): {},
    ("post", "/v1/projects/{project}/agentruns/{name}/resolve"): {},
    # A run naming spec.sessionKey that a live run holds: delivered to it as a message (decision 48).
    **{
        (method, path): {"201": _CREATED, "202": _DELIVERED}
        for method, path in (
            ("post", "/v1/projects/{project}/agentruns"),
            ("put", "/v1/projects/{project}/agentruns/{name}"),
        )
    },
}


def _schemas() -> dict[str, Any]:
    components: dict[str, Any] = {}
    for model in _MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` describe the hand-read bodies and every error answer."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        document = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = document.setdefault("components", {})
        components.setdefault("schemas", {}).update(_schemas())
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        error = {"content": {"application/json": {"schema": _ref("ErrorBody")}}}
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                body = _BODIES.get((method, path))
                if body is not None:
                    operation["requestBody"] = body
                responses = operation.setdefault("responses", {})
                responses.update(_EXTRA_SUCCESS.get((method, path), {}))
                responses.pop("422", None)  # FastAPI's own validation shape: ours is ErrorBody
                if path.startswith("/v1/"):
                    operation["security"] = [{"bearer": []}]
                for status, description in _ERRORS.items():
                    responses.setdefault(status, {"description": description, **error})
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]
