"""Who the CLI is and what it may spend: ``login``, ``logout``, ``whoami``, ``console`` and
``credits``.

A token is stored per server (~/.nodus/credentials.json, 0600) and travels in the console
link's fragment only, which a browser never sends to a server.
"""

from __future__ import annotations

import getpass
import sys
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer

from .. import credentials
from ..client import Client
from ..config import Settings
from ..errors import Invalid, Unauthorized, Unavailable
from . import root
from .output import dump_json, dump_yaml
from .root import OutputOption, ProjectOption

__all__ = ["login", "logout", "whoami", "console", "credits_app"]


# The operator token `nodus up` keeps for the local user (`nodus_ray.control.tokens.LOCAL_ADMIN`).
_LOCAL_ADMIN = "local-admin"

credits_app = typer.Typer(
    help="The project's credits: what runs on the server's key may spend.", invoke_without_command=True
)


def login(
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="An API token (nodus_...), e.g. from `nodus create token`; asked for when left out.",
        ),
    ] = None,
) -> None:
    """Check a token against the server and store it for that server (~/.nodus/credentials.json, 0600).

    Without ``--token`` it asks for one (hidden input on a terminal, one line from standard input
    otherwise), except against a local service `nodus up` started: its operator token is stored
    already, and this says who you are. A token the server refuses is stored nowhere.
    """
    settings = root.settings()
    if token is None:
        local = _local_operator(settings)
        if local is not None:
            typer.echo(
                f"already logged in to {settings.api_url} as token {local.get('name')} (every project, "
                f"role {local.get('role')}): `nodus up` keeps it in {credentials.credentials_file()}; "
                "`nodus login --token` stores another"
            )
            return
        token = _ask_token()
    token = token.strip()
    if not token:
        raise Invalid(
            "no token given: paste an API token (nodus_...); nothing was stored", details={"field": "token"}
        )
    try:
        who = Client(settings=settings, token=token).whoami()
    except Unauthorized:
        raise Unauthorized(
            f"{settings.api_url} refused the token (unknown, revoked or expired); nothing was stored",
            details={"field": "token"},
        ) from None
    project = None if who.get("project") == "*" else who.get("project")
    file = credentials.remember(settings.api_url, token, project=project)
    scope = "every project" if project is None else f"project {project}"
    typer.echo(
        f"logged in to {settings.api_url} as token {who.get('name')} ({scope}, role {who.get('role')}); "
        f"stored in {file}"
    )


def _local_operator(settings: Settings) -> dict[str, Any] | None:
    """Who the token `nodus up` stored for this server is, if that is the one in use and still works."""
    if not settings.token:
        return None
    try:
        who = Client(settings=settings).whoami()
    except (Unauthorized, Unavailable):
        return None
    return who if (who.get("project"), who.get("name")) == ("*", _LOCAL_ADMIN) else None


def _ask_token() -> str:
    """The token, typed: hidden on a terminal (getpass), else the first line of standard input."""
    if sys.stdin is not None and sys.stdin.isatty():
        return getpass.getpass("API token (input hidden): ")
    line = sys.stdin.readline() if sys.stdin is not None else ""
    return line


def logout() -> None:
    """Forget the token stored for this server."""
    url = root.settings().api_url
    typer.echo(f"removed the token of {url}" if credentials.forget(url) else f"no token was stored for {url}")


def whoami(output: OutputOption = None) -> None:
    """Which token this CLI uses: its name, project and role."""
    who = root.client().whoami()
    if output == "json":
        typer.echo(dump_json(who))
    elif output == "yaml":
        typer.echo(dump_yaml(who), nl=False)
    else:
        scope = "every project (operator)" if who.get("project") == "*" else f"project {who.get('project')}"
        typer.echo(f"token {who.get('name')}: {scope}, role {who.get('role')}")


def console(project: ProjectOption = None) -> None:
    """Print the web console's link for the project, carrying this CLI's token.

    The token travels in the link's fragment (after ``#``), which a browser never sends to a
    server, so it reaches no access log; the page keeps it for its tab only.
    """
    settings = root.settings()
    link = f"{settings.api_url}/console?{urlencode({'project': project or settings.project})}"
    typer.echo(f"{link}#token={quote(settings.token, safe='')}" if settings.token else link)


# -- credits ----------------------------------------------------------------------------------


def _print_credits(view: dict[str, Any]) -> None:
    typer.echo(f"project   {view.get('project')}")
    typer.echo(f"balance   ${view.get('balanceUSD')}")
    typer.echo(f"granted   ${view.get('grantedUSD')}")
    typer.echo(f"spent     ${view.get('spentUSD')}")
    typer.echo(f"reserved  ${view.get('reservedUSD')}  (held for calls in flight)")


@credits_app.callback()
def credits(ctx: typer.Context, output: OutputOption = None, project: ProjectOption = None) -> None:
    """Show the project's balance (runs on access Nodus are billed from it)."""
    if ctx.invoked_subcommand is not None:
        return
    view = root.client(project).credits()
    if output == "json":
        typer.echo(dump_json(view))
    elif output == "yaml":
        typer.echo(dump_yaml(view), nl=False)
    else:
        _print_credits(view)


@credits_app.command("add")
def credits_add(
    amount: Annotated[str, typer.Argument(help="Dollars to add, e.g. 10 or 2.50.")],
    project: ProjectOption = None,
) -> None:
    """Add credits (the operator's verb); runs waiting for credits continue."""
    _print_credits(root.client(project).add_credits(amount))
