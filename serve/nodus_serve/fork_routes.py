"""``POST /v1/projects/{p}/agentruns/{name}/fork``: a new run from a step of another (decision 58).

Thin like every route: it checks the body's shape (``at`` required, a step's ID or its number in
the steps listing; ``name`` and ``input`` optional strings; nothing else) and calls the control
plane, whose refusals (a step that does not exist or is not a step boundary, a name taken, a run
not found) reach the client as ``{code, message, details}`` through the app's handlers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from nodus.errors import Invalid
from nodus_ray.control.client import ControlPlaneClient

__all__ = ["install_fork_routes", "fork_body"]

_FIELDS = ("at", "name", "input")
_BODY_SCHEMA = {
    "type": "object",
    "required": ["at"],
    "additionalProperties": False,
    "properties": {
        "at": {
            "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "minLength": 1}],
            "description": "the first step the fork runs itself: its ID or its number in the steps listing",
        },
        "name": {"type": "string", "description": "the new run's name (default: NAME-fork-<n>)"},
        "input": {
            "type": "string",
            "description": "a new prompt (at 1) or keep-alive message (turn-K/message)",
        },
    },
}
_OPENAPI = {"requestBody": {"required": True, "content": {"application/json": {"schema": _BODY_SCHEMA}}}}


def fork_body(body: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """``(at, name, input)`` from the request body, or `Invalid` naming the field."""
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        raise Invalid(
            f"{unknown[0]}: unknown field (a fork takes at, name, input)", details={"field": unknown[0]}
        )
    at = body.get("at")
    if isinstance(at, int) and not isinstance(at, bool):
        at = str(at)
    if not isinstance(at, str) or not at.strip():
        raise Invalid(
            'at: required, the step to fork at: its ID or its number in the steps listing, e.g. {"at": 3}',
            details={"field": "at"},
        )
    for field in ("name", "input"):
        if body.get(field) is not None and not isinstance(body[field], str):
            raise Invalid(f"{field}: must be a string", details={"field": field})
    return at, body.get("name"), body.get("input")


def install_fork_routes(
    app: FastAPI,
    cp: ControlPlaneClient,
    project_of: Callable[[str], str],
    body_of: Callable[[Request], Awaitable[dict[str, Any]]],
) -> None:
    """Add the fork route; ``project_of`` checks a project name, ``body_of`` reads a JSON object."""

    @app.post("/v1/projects/{project}/agentruns/{name}/fork", status_code=201, openapi_extra=_OPENAPI)
    async def fork_run(project: str, name: str, request: Request) -> JSONResponse:
        """A new run whose journal is this run's up to the step ``at`` and whose workspace is the
        snapshot taken there; it goes on from that step with the same or a new ``input``."""
        at, new_name, new_input = fork_body(await body_of(request))
        run = await cp.fork_run(project_of(project), name, at, new_name, new_input)
        return JSONResponse(status_code=201, content=run)
