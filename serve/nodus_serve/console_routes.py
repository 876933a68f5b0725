"""The web console's files: the page at ``/console`` and its scripts and style beside it.

The console is static: plain JavaScript modules and one style sheet that read the REST API and
the events stream from the browser, with the token the page was given (decision 63). Nothing
here reads a resource, so these routes are outside ``/v1`` and need no token, like the page
always was. The files are package data of `nodus_serve`, read once per replica; only the names
in `ASSETS` are served, so no path a request names reaches the file system.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from nodus.errors import NotFound

__all__ = ["ASSETS", "install_console_routes"]

_JS = "text/javascript; charset=utf-8"
# Every file the page loads, and its media type (a module script needs a JavaScript type).
ASSETS: dict[str, str] = {
    "console.css": "text/css; charset=utf-8",
    "console_api.js": _JS,
    "console_charts.js": _JS,
    "console_main.js": _JS,
    "console_project.js": _JS,
    "console_run.js": _JS,
    "console_transcript.js": _JS,
    "console_group.js": _JS,
}


@functools.cache
def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def install_console_routes(app: FastAPI) -> None:
    """``GET /console`` (the page) and ``GET /console/{asset}`` (its scripts and style)."""

    @app.get("/console", response_class=HTMLResponse, include_in_schema=False)
    async def console() -> HTMLResponse:
        """The web console: a project's groups and runs (``?project=``, filtered and paged), a
        run's page (``?run=``: timeline, transcript, cost) and a group's (``?group=``)."""
        return HTMLResponse(_read("console.html"))

    @app.get("/console/{asset}", include_in_schema=False)
    async def console_asset(asset: str) -> Response:
        media_type = ASSETS.get(asset)
        if media_type is None:
            raise NotFound(f"the console has no file {asset!r}", details={"name": asset})
        # Revalidated on every load: a replica serving a newer console is picked up at once.
        return Response(_read(asset), media_type=media_type, headers={"Cache-Control": "no-cache"})
