"""The Webhook routes: ``/v1/projects/{p}/webhooks`` (create, list, read, apply, patch, delete),
``.../webhooks/{name}/deliveries`` (each event owed and every attempt) and ``.../test``.

Thin like every route: the shape of the request is checked here, the rest (the URL's address,
the signing Secret, the events) by the control plane, whose refusals reach the client as
``{code, message, details}``. Changing a Webhook needs ``admin`` in the project (`auth`): a
Webhook sends the project's events out of the cluster.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from nodus.errors import Invalid
from nodus.resources import API_VERSION
from nodus_ray.control.client import ControlPlaneClient

__all__ = ["install_webhook_routes"]

_COLLECTION = "/v1/projects/{project}/webhooks"


def _applied(outcome: dict[str, Any]) -> JSONResponse:
    status = 201 if outcome["result"] == "created" else 200
    return JSONResponse(
        status_code=status, content=outcome["resource"], headers={"X-Nodus-Result": outcome["result"]}
    )


def _named(body: dict[str, Any], name: str) -> dict[str, Any]:
    """A PUT's document names the URL's Webhook (or no name, which is filled in)."""
    meta = body.get("metadata")
    if isinstance(meta, dict) and meta.get("name") not in (None, name):
        raise Invalid(
            f"metadata.name {meta.get('name')!r} does not match the URL's name {name!r}",
            details={"field": "metadata.name"},
        )
    if not isinstance(meta, dict):
        return {**body, "metadata": {"name": name}}
    return {**body, "metadata": {**meta, "name": name}}


def _limit(text: str | None) -> int:
    if text is None:
        return 50
    if not text.isdigit():
        raise Invalid(f"limit: a whole number from 1 to 200, not {text[:20]!r}", details={"field": "limit"})
    return int(text)


def install_webhook_routes(
    app: FastAPI,
    cp: ControlPlaneClient,
    project_of: Callable[[str], str],
    body_of: Callable[[Request], Awaitable[dict[str, Any]]],
) -> None:
    """Add the routes; ``project_of`` checks a project name, ``body_of`` reads a JSON object."""

    @app.get(_COLLECTION)
    async def list_webhooks(project: str) -> dict[str, Any]:
        items = await cp.list_webhooks(project_of(project))
        return {"apiVersion": API_VERSION, "kind": "WebhookList", "items": items}

    @app.post(_COLLECTION, status_code=201)
    async def create_webhook(project: str, request: Request) -> JSONResponse:
        return _applied(await cp.apply_webhook(project_of(project), await body_of(request), "create"))

    @app.get(_COLLECTION + "/{name}")
    async def get_webhook(project: str, name: str) -> dict[str, Any]:
        return await cp.get_webhook(project_of(project), name)

    @app.put(_COLLECTION + "/{name}")
    async def apply_webhook(project: str, name: str, request: Request) -> JSONResponse:
        document = _named(await body_of(request), name)
        return _applied(await cp.apply_webhook(project_of(project), document, "apply"))

    @app.patch(_COLLECTION + "/{name}")
    async def patch_webhook(project: str, name: str, request: Request) -> JSONResponse:
        return _applied(await cp.patch_webhook(project_of(project), name, await body_of(request)))

    @app.delete(_COLLECTION + "/{name}")
    async def delete_webhook(project: str, name: str) -> dict[str, Any]:
        return await cp.delete_webhook(project_of(project), name)

    @app.get(_COLLECTION + "/{name}/deliveries")
    async def webhook_deliveries(project: str, name: str, limit: str | None = None) -> dict[str, Any]:
        """The Webhook's deliveries, newest first (``limit``, 50 by default, at most 200)."""
        items = await cp.webhook_deliveries(project_of(project), name, _limit(limit))
        return {"apiVersion": API_VERSION, "kind": "WebhookDeliveryList", "items": items}

    @app.post(_COLLECTION + "/{name}/test", status_code=202)
    async def webhook_test(project: str, name: str) -> JSONResponse:
        """Send a ``webhook.test`` event now; answers with its delivery record (Pending)."""
        return JSONResponse(status_code=202, content=await cp.webhook_test_event(project_of(project), name))
