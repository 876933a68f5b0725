"""``nodus agentrun fork NAME --at STEP [--name NEW] [--input TEXT]`` (decision 58, docs/fork.md).

Registered on `commands_runs.agentrun_app` beside steps, retry and resolve. ``--at`` is a step as
``nodus agentrun steps NAME`` lists it: its ID, or its row counting from 1. The fork keeps the
steps before it and runs it again. Each refusal is one ``error:`` line and a non-zero exit
(`root`), as for every verb.
"""

from __future__ import annotations

from typing import Annotated

import typer

from . import root
from .commands_runs import agentrun_app
from .root import ProjectOption

__all__ = ["agentrun_fork"]


@agentrun_app.command("fork")
def agentrun_fork(
    name: Annotated[str, typer.Argument(help="The run to fork.")],
    at: Annotated[
        str,
        typer.Option(
            "--at",
            help="The first step the fork runs itself: its ID or its number in `nodus agentrun steps` "
            "(from 1); the steps before it are kept, not run again.",
        ),
    ],
    new_name: Annotated[
        str | None, typer.Option("--name", help="The new run's name (default: NAME-fork-<n>).")
    ] = None,
    new_input: Annotated[
        str | None,
        typer.Option(
            "--input",
            help="Replace the next user input: the prompt (--at 1) or a keep-alive run's message "
            "(--at turn-K/message).",
        ),
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Make a new run from a step of NAME: its journal up to there, its workspace as it was there."""
    step: int | str = int(at) if at.strip().isdigit() else at
    forked = root.client(project).fork_run(name, step, new_name=new_name, input=new_input)
    metadata = forked.get("metadata") or {}
    status = forked.get("status") or {}
    origin = status.get("forkedFrom") or {}
    typer.echo(
        f"agentrun/{metadata.get('name')} forked from agentrun/{name} at step "
        f"{origin.get('stepNumber', step)} ({origin.get('step', at)}); phase {status.get('phase')}"
    )
