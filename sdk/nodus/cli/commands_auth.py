"""Who the CLI is and what it may spend: ``login``, ``logout``, ``whoami``, ``console`` and
``credits``.

A token is stored per server (~/.nodus/credentials.json, 0600) and travels in the console
link's fragment only, which a browser never sends to a server.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer

from .. import credentials
from ..client import Client
from . import root
from .output import dump_json, dump_yaml
from .root import OutputOption, ProjectOption

__all__ = ["login", "logout", "whoami", "console", "credits_app"]


credits_app = typer.Typer(
    help="The project's credits: what runs on the server's key may spend.", invoke_without_command=True
)


def login(
    token: Annotated[
        str, typer.Option("--token", help="An API token (nodus_...), e.g. from `nodus create token`.")
    ],
) -> None:
    """Check a token against the server and store it for that server (~/.nodus/credentials.json, 0600)."""
    settings = root.settings()
    who = Client(settings=settings, token=token).whoami()
    project = None if who.get("project") == "*" else who.get("project")
    file = credentials.remember(settings.api_url, token, project=project)
    scope = "every project" if project is None else f"project {project}"
    typer.echo(
        f"logged in to {settings.api_url} as token {who.get('name')} ({scope}, role {who.get('role')}); "
        f"stored in {file}"
    )


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
