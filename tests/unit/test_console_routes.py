"""The console's files: served with their types and no token, every file the page loads is one
the route serves and the package ships, and no other name reaches the file system."""

from __future__ import annotations

import asyncio
import re
import tomllib
from pathlib import Path
from typing import Any

import httpx

from nodus_serve.app import create_app
from nodus_serve.console_routes import ASSETS
from tests.fakes.control_plane import client_over

SERVE = Path(__file__).resolve().parents[2] / "serve" / "nodus_serve"


async def _nothing(method: str, *args: Any) -> Any:
    return None  # no token is known: a /v1 call would be refused


def _get(*paths: str) -> list[httpx.Response]:
    async def fetch() -> list[httpx.Response]:
        app = create_app(client_over(_nothing))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
            return [await http.get(path) for path in paths]

    return asyncio.run(fetch())


def test_the_page_and_each_file_are_served_with_their_type_and_no_token() -> None:
    page, *files = _get("/console", *(f"/console/{name}" for name in ASSETS))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for (name, media_type), answer in zip(ASSETS.items(), files, strict=True):
        assert answer.status_code == 200, name
        assert answer.headers["content-type"] == media_type
        assert answer.text == (SERVE / name).read_text(encoding="utf-8")


def test_every_file_the_page_and_its_modules_load_is_served_and_shipped() -> None:
    wanted = set(re.findall(r'(?:href|src)="console/([^"]+)"', (SERVE / "console.html").read_text()))
    for module in [name for name in ASSETS if name.endswith(".js")]:
        wanted |= set(re.findall(r'from "\./([^"]+)"', (SERVE / module).read_text()))
    assert wanted == set(ASSETS), "ASSETS lists exactly what the page loads"
    shipped = tomllib.loads((SERVE.parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["nodus_serve"]
    assert {"*.html", "*.js", "*.css"} <= set(shipped)
    assert not any((SERVE / name).is_dir() for name in ASSETS)


def test_a_name_the_console_does_not_have_is_a_404_in_the_apis_shape() -> None:
    for path in ("/console/app.py", "/console/..%2Fapp.py", "/console/console.html", "/console/x.js"):
        (answer,) = _get(path)
        assert answer.status_code == 404, path
        assert set(answer.json()) == {"code", "message", "details"}
        assert "def create_app" not in answer.text
