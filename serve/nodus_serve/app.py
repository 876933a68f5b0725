"""The REST API: a stateless FastAPI app in front of the control plane actor.

The ingress validates what it can alone (JSON shape, names), forwards everything else to the
control plane and turns every refusal into ``{code, message, details}`` with a 4xx status.
It holds no state, so Serve may run any number of replicas.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from nodus.errors import BadRequest, Invalid, NodusError
from nodus.input_limits import MAX_BODY_BYTES, body_too_large, decode_json_body
from nodus.resources import API_VERSION, validate_dns_label
from nodus_ray import faults
from nodus_ray.control.client import ControlPlaneClient
from nodus_ray.control.tokens import Principal

from .auth import Authenticator, PrincipalCache
from .console_routes import install_console_routes
from .events import parse_cursor, run_events
from .export_routes import install_export_routes
from .fork_routes import install_fork_routes
from .listing_routes import install_listing_routes
from .load_shedding import LoadShedder, max_inflight_from_env
from .openapi import install as install_openapi
from .program_routes import install_program_routes
from .statistics_routes import install_statistics_routes
from .webhook_routes import install_webhook_routes

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


def _error(error: NodusError) -> JSONResponse:
    return JSONResponse(status_code=error.status, content=error.to_dict())


async def _read_capped(request: Request) -> bytes:
    """The body, read no further than `MAX_BODY_BYTES` (a larger one is refused, not buffered)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise body_too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise body_too_large()
        chunks.append(chunk)
    return b"".join(chunks)


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object of the body; a body too large, too deep or not JSON is a 4xx (`input_limits`)."""
    body = decode_json_body(await _read_capped(request))
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", details={"field": ""})
    return body


def _project(project: str) -> str:
    try:
        return validate_dns_label(project)
    except ValueError as exc:
        raise Invalid(f"project: {exc}", details={"field": "project"}) from None


def _name_matches(body: dict[str, Any], name: str) -> dict[str, Any]:
    meta = body.get("metadata")
    if isinstance(meta, dict) and meta.get("name") not in (None, name):
        raise Invalid(
            f"metadata.name {meta.get('name')!r} does not match the URL's name {name!r}",
            details={"field": "metadata.name"},
        )
    if isinstance(meta, dict):
        body = {**body, "metadata": {**meta, "name": name}}
    elif meta is None:
        body = {**body, "metadata": {"name": name}}
    return body


def _listing(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "items": items}


def _applied(outcome: dict[str, Any]) -> JSONResponse:
    # 202 "delivered": a run naming a session key went to the live run holding it, as a message
    # (the resource is that run's; X-Nodus-Message-Seq the message's number). Decision 48.
    status = {"created": 201, "delivered": 202}.get(outcome["result"], 200)
    headers = {"X-Nodus-Result": outcome["result"]}
    if outcome.get("message"):
        headers["X-Nodus-Message-Seq"] = str(outcome["message"]["seq"])
    return JSONResponse(status_code=status, content=outcome["resource"], headers=headers)


_MAX_IDEMPOTENCY_KEY = 255


Apply = Callable[[str, dict[str, Any], str], Awaitable[dict[str, Any]]]  # (project, document, mode)
ByName = Callable[[str, str], Awaitable[dict[str, Any]]]  # (project, name)
CreateList = Callable[[str, dict[str, Any], str | None], Awaitable[dict[str, Any]]]  # (.., idempotency key)


async def _create_list(
    create_list: tuple[str, CreateList],
    project: str,
    body: dict[str, Any],
    request: Request,
) -> JSONResponse:
    """A batch: 201 with the created items, or 200 with the first answer to a repeated key."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not (0 < len(key) <= _MAX_IDEMPOTENCY_KEY and key.isprintable()):
        raise Invalid(
            f"the Idempotency-Key header must be 1 to {_MAX_IDEMPOTENCY_KEY} printable characters",
            details={"field": "Idempotency-Key"},
        )
    outcome = await create_list[1](project, body, key)
    replayed = bool(outcome["replayed"])
    return JSONResponse(
        status_code=200 if replayed else 201,
        content=_listing(create_list[0], outcome["items"]),
        headers={"Idempotency-Replayed": "true" if replayed else "false"},
    )


def _resource_routes(
    app: FastAPI,
    plural: str,
    *,
    apply: Apply,
    get: ByName,
    delete: ByName,
    create_list: tuple[str, CreateList] | None = None,
) -> None:
    """POST (create), GET, PUT (apply) and DELETE of one kind of resource, all alike.

    ``apply`` is the control-plane call taking ``(project, document, mode)`` with mode
    ``create`` (refuses a taken name) or ``apply`` (creates or updates). ``create_list`` is
    ``(list kind, call)`` when POST also takes a batch of that list kind.
    """
    collection = f"/v1/projects/{{project}}/{plural}"

    async def create(project: str, request: Request) -> JSONResponse:
        body = await _body(request)
        if create_list is not None and body.get("kind") == create_list[0]:
            return await _create_list(create_list, _project(project), body, request)
        return _applied(await apply(_project(project), body, "create"))

    async def read(project: str, name: str) -> dict[str, Any]:
        return await get(_project(project), name)

    async def put(project: str, name: str, request: Request) -> JSONResponse:
        body = _name_matches(await _body(request), name)
        return _applied(await apply(_project(project), body, "apply"))

    async def remove(project: str, name: str) -> dict[str, Any]:
        return await delete(_project(project), name)

    app.add_api_route(collection, create, methods=["POST"], status_code=201, name=f"create_{plural}")
    app.add_api_route(f"{collection}/{{name}}", read, methods=["GET"], name=f"get_{plural}")
    app.add_api_route(f"{collection}/{{name}}", put, methods=["PUT"], name=f"apply_{plural}")
    app.add_api_route(f"{collection}/{{name}}", remove, methods=["DELETE"], name=f"delete_{plural}")


def create_app(
    control_plane: ControlPlaneClient | None = None, *, max_inflight: int | None = None
) -> FastAPI:
    """The FastAPI app; Serve's ingress wraps it, tests may call it directly.

    ``control_plane``: by default the client with Serve's policy (`ControlPlaneClient.for_serve`:
    a control plane away answers 503 at once); tests pass one over a fake handle.

    ``max_inflight``: requests in flight past which it answers 429 (`load_shedding`); by
    default ``NODUS_API_MAX_INFLIGHT`` or 128.
    """
    cp = control_plane or ControlPlaneClient.for_serve()
    app = FastAPI(
        title="nodus",
        version="0.1.0",
        description="Durable agent runs on Ray. Errors are JSON {code, message, details}.",
    )
    principals = PrincipalCache()
    # Starlette runs the middleware added last first: load is shed before a token is looked up.
    app.add_middleware(Authenticator, lookup=cp.authenticate, cache=principals)
    app.add_middleware(LoadShedder, limit=max_inflight or max_inflight_from_env())

    install_openapi(app)

    @app.exception_handler(NodusError)
    async def _nodus_error(_: Request, error: NodusError) -> JSONResponse:
        return _error(error)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        field = ".".join(str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path"))
        return _error(Invalid(f"{field}: {first.get('msg', 'invalid request')}", details={"field": field}))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
        # Unknown paths and methods answer in the same JSON shape as every other refusal.
        codes = {404: "NotFound", 405: "MethodNotAllowed"}
        code = codes.get(error.status_code, f"HTTP{error.status_code}")
        message = (
            f"{request.method} {request.url.path} is not an endpoint of this API"
            if error.status_code in codes
            else str(error.detail)
        )
        return JSONResponse(
            status_code=error.status_code,
            headers=getattr(error, "headers", None),
            content={"code": code, "message": message, "details": {}},
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error", exc_info=error)
        return JSONResponse(
            status_code=500,
            content={"code": "InternalError", "message": "the server failed; see its logs", "details": {}},
        )

    if faults.enabled():  # the fault-injection suite only: kill this replica mid-request

        @app.middleware("http")
        async def _crash_point(request: Request, call_next: Any) -> Any:
            response = await call_next(request)
            faults.crash_point("api-answering", f"{request.method} {request.url.path}")
            return response

    install_console_routes(app)  # /console: the page, its scripts and style (decision 63)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, Any]:
        info = await cp.ready()
        return {"status": "ready", **info}

    @app.get("/v1/info")
    async def info() -> dict[str, Any]:
        return await cp.ready()

    # -- agents -----------------------------------------------------------------------------

    # The lists of agents, runs and groups: selectors and pages (`listing_routes`).
    install_listing_routes(app, cp, _project)

    _resource_routes(app, "agents", apply=cp.apply_agent, get=cp.get_agent, delete=cp.delete_agent)

    @app.patch("/v1/projects/{project}/agents/{name}")
    async def patch_agent(project: str, name: str, request: Request) -> JSONResponse:
        return _applied(await cp.patch_agent(_project(project), name, await _body(request)))

    # -- runs: the generic routes, plus a filtered list and the run's own verbs ---------------

    _resource_routes(
        app,
        "agentruns",
        apply=cp.create_run,
        get=cp.get_run,
        delete=cp.delete_run,
        create_list=("AgentRunList", cp.create_runs),
    )

    @app.post("/v1/projects/{project}/agentruns/{name}/cancel")
    async def cancel_run(project: str, name: str) -> dict[str, Any]:
        return await cp.cancel_run(_project(project), name)

    @app.post("/v1/projects/{project}/agentruns/{name}/messages")
    async def send_message(project: str, name: str, request: Request) -> JSONResponse:
        body = await _body(request)
        unknown = sorted(set(body) - {"payload", "messageKey", "name"})
        if unknown:
            raise Invalid(
                f"{unknown[0]}: unknown field (a message has payload, messageKey and name)",
                details={"field": unknown[0]},
            )
        if "payload" not in body:
            raise Invalid(
                'payload: required, e.g. {"payload": "Now the staging logs"}', details={"field": "payload"}
            )
        receipt = await cp.send_message(
            _project(project),
            name,
            body["payload"],
            body.get("messageKey"),
            body.get("name", "message"),
        )
        return JSONResponse(status_code=200 if receipt["duplicate"] else 202, content=receipt)

    @app.post("/v1/projects/{project}/agentruns/{name}/resolve")
    async def resolve_run(project: str, name: str, request: Request) -> dict[str, Any]:
        return await cp.resolve_run(_project(project), name, await _body(request))

    @app.get(
        "/v1/projects/{project}/agentruns/{name}/events",
        response_class=StreamingResponse,
        responses={200: {"description": "server-sent events", "content": {"text/event-stream": {}}}},
    )
    async def run_events_stream(
        project: str, name: str, request: Request, follow: bool = True
    ) -> StreamingResponse:
        """Server-sent events of the run (`events`); resumable with Last-Event-ID."""
        project = _project(project)
        await cp.get_run(project, name)  # a missing run is a 404 before the stream starts
        cursor = parse_cursor(request.headers.get("Last-Event-ID"))
        return StreamingResponse(
            run_events(cp, project, name, cursor, follow),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/v1/projects/{project}/agentruns/{name}/steps")
    async def run_steps(project: str, name: str) -> dict[str, Any]:
        return {"items": await cp.run_steps(_project(project), name)}

    @app.get("/v1/projects/{project}/agentruns/{name}/answer")
    async def run_answer(project: str, name: str) -> dict[str, Any]:
        return await cp.run_answer(_project(project), name)

    install_program_routes(app, cp, _project)  # sources, a run's outputs and program log
    install_fork_routes(app, cp, _project, _body)  # a new run from a step of another
    install_export_routes(app, cp, _project)  # a run's trajectory, an evaluation's cases
    install_statistics_routes(app, cp, _project)  # the paired difference of two evaluations
    install_webhook_routes(app, cp, _project, _body)  # webhooks and their deliveries (decision 62)

    # -- groups -----------------------------------------------------------------------------

    _resource_routes(app, "agentgroups", apply=cp.apply_group, get=cp.get_group, delete=cp.delete_group)

    @app.patch("/v1/projects/{project}/agentgroups/{name}")
    async def patch_group(project: str, name: str, request: Request) -> JSONResponse:
        return _applied(await cp.patch_group(_project(project), name, await _body(request)))

    @app.post("/v1/projects/{project}/agentgroups/{name}/cancel")
    async def cancel_group(project: str, name: str) -> dict[str, Any]:
        return await cp.cancel_group(_project(project), name)

    @app.get("/v1/projects/{project}/agentgroups/{name}/results")
    async def group_results(project: str, name: str) -> dict[str, Any]:
        """An evaluation's cases: task id, repetition, run, state, verdict, reward, evidence."""
        answer = await cp.group_results(_project(project), name)
        return {"apiVersion": "nodus.dev/v1", "kind": "EvaluationResultList", **answer}

    # -- environments: what an evaluation group can run ------------------------------------

    @app.get("/v1/projects/{project}/environments")
    async def list_environments(project: str) -> dict[str, Any]:
        items = await cp.list_environments(_project(project))
        return {"apiVersion": "nodus.dev/v1", "kind": "EnvironmentList", "items": items}

    # -- secrets: values go in, only keys come out -----------------------------------------

    @app.get("/v1/projects/{project}/secrets")
    async def list_secrets(project: str) -> dict[str, Any]:
        return _listing("SecretList", await cp.list_secrets(_project(project)))

    _resource_routes(app, "secrets", apply=cp.apply_secret, get=cp.get_secret, delete=cp.delete_secret)

    # -- the project Budget: one per project, spent and left in its status -----------------

    @app.get("/v1/projects/{project}/budgets")
    async def list_budgets(project: str) -> dict[str, Any]:
        return _listing("BudgetList", await cp.list_budgets(_project(project)))

    _resource_routes(app, "budgets", apply=cp.apply_budget, get=cp.get_budget, delete=cp.delete_budget)

    @app.patch("/v1/projects/{project}/budgets/{name}")
    async def patch_budget(project: str, name: str, request: Request) -> JSONResponse:
        return _applied(await cp.patch_budget(_project(project), name, await _body(request)))

    # -- credits --------------------------------------------------------------------------

    @app.get("/v1/projects/{project}/credits")
    async def get_credits(project: str) -> dict[str, Any]:
        return await cp.get_credits(_project(project))

    @app.post("/v1/projects/{project}/credits")
    async def add_credits(project: str, request: Request) -> dict[str, Any]:
        body = await _body(request)
        if "amountUSD" not in body:
            raise Invalid('amountUSD: required, e.g. {"amountUSD": "10.00"}', details={"field": "amountUSD"})
        if not isinstance(body["amountUSD"], str):  # as every amount of dollars: a number is not exact
            raise Invalid(
                'amountUSD: a decimal string of dollars, e.g. {"amountUSD": "10.00"}, not a number',
                details={"field": "amountUSD"},
            )
        return await cp.add_credits(_project(project), body["amountUSD"])

    @app.get("/v1/prices")
    async def prices() -> dict[str, Any]:
        return await cp.price_table()

    # -- tokens: who may call this API (`auth`) ---------------------------------------------

    @app.get("/v1/whoami")
    async def whoami(request: Request) -> dict[str, Any]:
        """The token this request was sent with: its name, project (``*``: every project) and role."""
        principal: Principal = request.state.principal
        return principal.to_dict()

    @app.get("/v1/projects/{project}/tokens")
    async def list_tokens(project: str) -> dict[str, Any]:
        return _listing("TokenList", await cp.list_tokens(_project(project)))

    @app.post("/v1/projects/{project}/tokens", status_code=201)
    async def create_token(project: str, request: Request) -> JSONResponse:
        """A new token; the answer's ``status.token`` is the only time its value is shown."""
        principal = request.state.principal
        created = await cp.create_token(
            _project(project), await _body(request), f"{principal.project}/{principal.name}"
        )
        return JSONResponse(status_code=201, content=created, headers={"Cache-Control": "no-store"})

    @app.get("/v1/projects/{project}/tokens/{name}")
    async def get_token(project: str, name: str) -> dict[str, Any]:
        return await cp.get_token(_project(project), name)

    @app.delete("/v1/projects/{project}/tokens/{name}")
    async def revoke_token(project: str, name: str) -> dict[str, Any]:
        revoked = await cp.revoke_token(_project(project), name)
        principals.clear()  # this replica refuses it at once; others within the cache's seconds
        return revoked

    return app
