"""A bare `nodus login`: asks for the token, checks it with /v1/whoami, stores it; against a
local service `nodus up` started it says who you are already; a refused token is stored nowhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from nodus import credentials
from nodus.cli import commands_auth
from nodus.cli import main as cli
from nodus.client import Client

API = "http://nodus.test:8000"
TOKENS = {
    "nodus_team": {"name": "ci", "project": "team", "role": "write"},
    "nodus_local": {"name": "local-admin", "project": "*", "role": "admin"},
    "nodus_other": {"name": "ops", "project": "*", "role": "admin"},
}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """A /v1/whoami that knows `TOKENS`; the CLI's clients reach it; credentials under tmp_path."""
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        asked.append(token)
        if request.url.path == "/v1/whoami" and token in TOKENS:
            return httpx.Response(200, json=TOKENS[token])
        body = {"code": "Unauthorized", "message": "the bearer token is not valid", "details": {}}
        return httpx.Response(401, json=body)

    def client(*args: Any, **kwargs: Any) -> Client:
        return Client(*args, transport=httpx.MockTransport(handle), **kwargs)

    monkeypatch.setattr(commands_auth, "Client", client)
    monkeypatch.setenv("NODUS_CREDENTIALS_FILE", str(tmp_path / "credentials.json"))
    monkeypatch.setenv("NODUS_API_URL", API)
    monkeypatch.delenv("NODUS_TOKEN", raising=False)
    monkeypatch.delenv("NODUS_PROJECT", raising=False)
    monkeypatch.setattr(commands_auth.getpass, "getpass", _no_terminal)
    return asked


def _no_terminal(prompt: str = "") -> str:
    raise AssertionError("standard input is not a terminal here: getpass must not be used")


def _login(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(cli.app, ["login", *args], input=input)


def test_bare_login_reads_one_line_from_standard_input_checks_and_stores_it(server: list[str]) -> None:
    result = _login(input="nodus_team\nignored second line\n")
    assert result.exit_code == 0, result.output
    assert "as token ci (project team, role write)" in result.stdout
    assert credentials.lookup(API) == {"token": "nodus_team", "project": "team"}
    assert server == ["nodus_team"]  # checked once with /v1/whoami, nothing else sent


def test_a_refused_token_is_one_line_a_non_zero_exit_and_stores_nothing(server: list[str]) -> None:
    for args, given in (((), "nodus_wrong\n"), (("--token", "nodus_wrong"), None), ((), "\n")):
        result = _login(*args, input=given)
        assert result.exit_code != 0, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "nothing was stored" in lines[0]
    assert credentials.lookup(API) is None
    assert not Path(credentials.credentials_file()).exists()


def test_against_the_local_service_it_says_who_you_are_and_asks_nothing(server: list[str]) -> None:
    credentials.remember(API, "nodus_local")  # what `nodus up` wrote
    before = Path(credentials.credentials_file()).read_text()
    result = _login(input="nodus_team\n")
    assert result.exit_code == 0, result.output
    assert "already logged in" in result.stdout and "local-admin" in result.stdout
    assert Path(credentials.credentials_file()).read_text() == before  # nothing replaced


def test_another_stored_token_is_replaced_by_the_one_typed(server: list[str]) -> None:
    credentials.remember(API, "nodus_other")  # an operator token, not the one `nodus up` keeps
    result = _login(input="nodus_team\n")
    assert result.exit_code == 0, result.output
    assert json.loads(Path(credentials.credentials_file()).read_text())["servers"]
    assert credentials.lookup(API) == {"token": "nodus_team", "project": "team"}


def test_login_with_token_works_as_before(server: list[str]) -> None:
    result = _login("--token", "nodus_other")
    assert result.exit_code == 0, result.output
    assert "(every project, role admin)" in result.stdout
    assert credentials.lookup(API) == {"token": "nodus_other"}


def test_on_a_terminal_the_token_is_read_hidden(server: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    prompts: list[str] = []

    class _Terminal:
        def isatty(self) -> bool:
            return True

        def readline(self) -> str:
            raise AssertionError("a terminal's token is read with getpass, not echoed")

    def hidden(prompt: str = "") -> str:
        prompts.append(prompt)
        return "nodus_team"

    monkeypatch.setattr(commands_auth.getpass, "getpass", hidden)
    monkeypatch.setattr(commands_auth.sys, "stdin", _Terminal())
    commands_auth.login(token=None)
    assert prompts and "hidden" in prompts[0]
    assert credentials.lookup(API) == {"token": "nodus_team", "project": "team"}
