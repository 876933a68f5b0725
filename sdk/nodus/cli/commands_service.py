"""``nodus up``, ``down`` and ``version``: the service on this machine, and which versions talk.

``up`` and ``down`` load the server parts (``nodus_ray.cluster``, which imports Ray) lazily, on
call: every other command runs where only the SDK is installed.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .. import __version__
from . import root
from .root import CliError

__all__ = ["up", "down", "version"]


def _cluster() -> Any:
    try:
        from nodus_ray import cluster  # the only Ray-importing path of the CLI, on purpose
    except ImportError as exc:
        raise CliError(
            f"the nodus-ray server parts are not installed here ({exc}); "
            "install nodus-ray with its Ray dependencies to run `nodus up`",
            reason="NotInstalled",
        ) from None
    return cluster


def up(
    address: Annotated[
        str | None, typer.Option(help="Ray address to join (default: start a local Ray).")
    ] = None,
    port: Annotated[int, typer.Option(help="Port of the HTTP API.")] = 8000,
    storage: Annotated[str | None, typer.Option(help="Storage URI for resources and journals.")] = None,
) -> None:
    """Start (or join) Ray and the nodus API on this machine."""
    started = _cluster().up(address=address, port=port, storage=storage)
    lines = [
        ("API", "api_url"),
        ("Storage", "storage"),
        ("Models", "model_backend"),
        ("Sandbox", "sandbox"),
        ("Ray", "ray_address"),
        ("Dashboard", "dashboard_url"),
    ]
    for label, attribute in lines:
        value = getattr(started, attribute, None)
        typer.echo(f"{label:<10}{value if value not in (None, '') else '-'}")
    if getattr(started, "credentials_file", None):
        typer.echo(
            f"{'Token':<10}an operator token (local-admin) for this user, kept in {started.credentials_file}"
        )


def down() -> None:
    """Stop the nodus API and the local Ray started by `nodus up`."""
    typer.echo(str(_cluster().down()))


def version(
    client_only: Annotated[bool, typer.Option("--client", help="Print only the client version.")] = False,
) -> None:
    """Print the client version and, when reachable, the server's."""
    typer.echo(f"Client Version: {__version__}")
    if client_only:
        return
    info = root.client().info()
    details = ", ".join(
        f"{label} {info[key]}"
        for label, key in (("storage", "storage"), ("models", "modelBackend"), ("sandbox", "sandbox"))
        if info.get(key)
    )
    typer.echo(f"Server Version: {info.get('version', 'unknown')}" + (f" ({details})" if details else ""))
