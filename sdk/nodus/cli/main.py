"""``nodus``: kubectl-style verbs over the nodus API (apply, get, wait, create, cancel, delete).

This module is the command line's table of contents: the verbs live in the ``commands_*``
modules by what they act on, and are registered on the root app (`root.app`) here, in the order
``nodus --help`` lists them. ``nodus.cli.main:run`` is the console script.

Nothing here imports Ray; only ``nodus up`` and ``nodus down`` load the server parts, lazily.
"""

from __future__ import annotations

from typing import NoReturn

from . import (
    commands_auth,
    commands_describe,
    commands_export,  # noqa: F401  # registers agentrun export, evaluation export
    commands_fork,  # noqa: F401  # registers agentrun fork
    commands_get,
    commands_program,  # noqa: F401  # registers agentrun output, children, retry, suspend, resume
    commands_resources,
    commands_runs,
    commands_service,
    commands_statistics,  # noqa: F401  # registers evaluation compare
)
from .batch import batch_app
from .commands_auth import credits_app
from .commands_create import create_app
from .commands_evaluation import evaluation_app
from .commands_runs import agentrun_app
from .commands_webhook import webhook_app
from .root import CliError, app

__all__ = ["app", "run", "CliError"]

for _command in (
    commands_service.up,
    commands_service.down,
    commands_service.version,
    commands_resources.apply,
    commands_resources.patch,
    commands_get.get,
    commands_describe.describe,
    commands_runs.wait,
    commands_runs.cancel,
    commands_resources.delete,
    commands_auth.login,
    commands_auth.logout,
    commands_auth.whoami,
    commands_auth.console,
):
    app.command()(_command)

app.add_typer(create_app, name="create")
app.add_typer(agentrun_app, name="agentrun")
app.add_typer(credits_app, name="credits")
app.add_typer(batch_app, name="batch")
app.add_typer(evaluation_app, name="evaluation")
app.add_typer(webhook_app, name="webhook")


def run() -> NoReturn:
    """The ``nodus`` console script."""
    app(prog_name="nodus")
    raise SystemExit(0)  # pragma: no cover - the group's main always exits


if __name__ == "__main__":  # pragma: no cover
    run()
