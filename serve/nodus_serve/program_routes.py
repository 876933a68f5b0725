"""The routes of durable Python agents: source uploads, suspend/resume/retry, a run's outputs
and its program log.

Thin like every route: each one checks the shape of what it was sent and calls the control plane,
whose refusals reach the client as ``{code, message, details}`` through the app's handlers.
A source upload has a body limit of its own: a program may be up to 4 MiB of text
(`schema_agent.MAX_SOURCE_BYTES`), more than `input_limits.MAX_BODY_BYTES` allows any other
body, and JSON escaping makes text longer still.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from nodus.errors import BadRequest, Invalid, PayloadTooLarge
from nodus.input_limits import check_depth
from nodus.schema_agent import MAX_SOURCE_BYTES, MAX_SOURCE_FILES
from nodus_ray.control.client import ControlPlaneClient

__all__ = ["MAX_SOURCE_BODY_BYTES", "install_program_routes"]

# 4 MiB of text, its JSON escapes (quotes, backslashes, newlines) and the paths of 1,000 files.
MAX_SOURCE_BODY_BYTES = 2 * MAX_SOURCE_BYTES + 256 * 1024


def _source_too_large() -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the source upload is larger than {MAX_SOURCE_BODY_BYTES} bytes; a source is at most "
        f"{MAX_SOURCE_BYTES // (1024 * 1024)} MiB of text in {MAX_SOURCE_FILES} files",
        details={"field": "files", "limit": MAX_SOURCE_BYTES},
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def _source_body(request: Request) -> dict[str, Any]:
    """``{"files": {path: text}}``, read no further than `MAX_SOURCE_BODY_BYTES`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_SOURCE_BODY_BYTES:
        raise _source_too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_SOURCE_BODY_BYTES:
            raise _source_too_large()
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks) or b"null", parse_constant=_no_constant)
    except RecursionError:
        raise BadRequest("the request body is nested too deeply", details={"field": ""}) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not JSON: {exc}", details={"field": ""}) from None
    check_depth(body)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", details={"field": ""})
    unknown = sorted(set(body) - {"files"})
    if unknown:
        raise Invalid(
            f"{unknown[0]}: unknown field (a source upload has files)", details={"field": unknown[0]}
        )
    if "files" not in body:
        raise Invalid(
            'files: required, e.g. {"files": {"main.py": "def main(ctx, input): ..."}}',
            details={"field": "files"},
        )
    return body


def install_program_routes(app: FastAPI, cp: ControlPlaneClient, project_of: Callable[[str], str]) -> None:
    """Add the Python agents' routes; ``project_of`` checks a project name (`app._project`)."""
    runs = "/v1/projects/{project}/agentruns/{name}"

    @app.post("/v1/projects/{project}/agentsources", status_code=201)
    async def upload_source(project: str, request: Request) -> JSONResponse:
        """Store a program's files (content-addressed); answers the Agent's ``spec.source``."""
        body = await _source_body(request)
        ref = await cp.upload_source(project_of(project), body["files"])
        return JSONResponse(status_code=201, content=ref)

    @app.post(f"{runs}/suspend")
    async def suspend_run(project: str, name: str) -> dict[str, Any]:
        """Park the run with no process (Waiting, Suspended) until resumed; its deadline runs on."""
        return await cp.suspend_run(project_of(project), name)

    @app.post(f"{runs}/resume")
    async def resume_run(project: str, name: str) -> dict[str, Any]:
        """Start a suspended run again; it replays its journal."""
        return await cp.resume_run(project_of(project), name)

    @app.post(f"{runs}/retry")
    async def retry_run(project: str, name: str) -> dict[str, Any]:
        """Run a Failed run again from its journal, its completed steps kept."""
        return await cp.retry_run(project_of(project), name)

    @app.get(f"{runs}/outputs")
    async def run_outputs(project: str, name: str) -> dict[str, Any]:
        """The outputs the run's program saved (``ctx.save_output``): name and size."""
        return {"items": await cp.run_outputs(project_of(project), name)}

    @app.get(
        f"{runs}/outputs/{{output}}",
        response_class=Response,
        responses={
            200: {"description": "the output, byte for byte", "content": {"application/octet-stream": {}}}
        },
    )
    async def run_output(project: str, name: str, output: str) -> Response:
        data = await cp.run_output(project_of(project), name, output)
        return Response(content=data, media_type="application/octet-stream")

    @app.get(
        f"{runs}/logs",
        response_class=PlainTextResponse,
        responses={200: {"description": "what the program printed", "content": {"text/plain": {}}}},
    )
    async def run_logs(project: str, name: str) -> PlainTextResponse:
        """What a Python run's program printed, every attempt in order (replays not repeated)."""
        return PlainTextResponse(await cp.run_logs(project_of(project), name))
