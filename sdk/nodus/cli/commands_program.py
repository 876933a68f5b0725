"""``nodus agentrun output|outputs|children|retry|suspend|resume``: a Python agent's run.

Registered on `commands_runs.agentrun_app` beside answer, logs, send, resolve and steps. Each
failure is one ``error:`` line and a non-zero exit (`root`), as for every verb.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from . import root
from .commands_runs import agentrun_app
from .output import dollars, format_age, print_table
from .root import CliError, ProjectOption

__all__ = [
    "agentrun_output",
    "agentrun_outputs",
    "agentrun_children",
    "agentrun_retry",
    "agentrun_suspend",
    "agentrun_resume",
]


@agentrun_app.command("output")
def agentrun_output(
    name: Annotated[str, typer.Argument(help="The run.")],
    output: Annotated[str, typer.Argument(help="The output's name (ctx.save_output).")],
    file: Annotated[
        Path | None, typer.Option("--output-file", "-o", help="Write it to this file (default: stdout).")
    ] = None,
    project: ProjectOption = None,
) -> None:
    """Download one output the run's program saved, byte for byte."""
    data = root.client(project).run_output(name, output)
    if file is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    target = file / output if file.is_dir() else file
    try:
        target.write_bytes(data)
    except OSError as exc:
        raise CliError(f"cannot write {target}: {exc.strerror or exc}", reason=type(exc).__name__) from None
    typer.echo(f"agentrun/{name} output {output}: {len(data)} bytes written to {target}", err=True)


@agentrun_app.command("outputs")
def agentrun_outputs(
    name: Annotated[str, typer.Argument(help="The run.")],
    project: ProjectOption = None,
) -> None:
    """List the outputs the run's program saved."""
    items = root.client(project).run_outputs(name)
    if not items:
        typer.echo(f"agentrun/{name} has saved no outputs.", err=True)
        return
    print_table(["NAME", "BYTES"], [[str(item.get("name")), str(item.get("bytes"))] for item in items])


@agentrun_app.command("children")
def agentrun_children(
    name: Annotated[str, typer.Argument(help="The parent run.")],
    project: ProjectOption = None,
) -> None:
    """List the child runs the run spawned (ctx.spawn, ctx.map), in creation order."""
    client = root.client(project)
    client.get("agentruns", name)  # a missing parent is an error, not an empty table
    children = client.run_children(name)
    if not children:
        typer.echo(f"agentrun/{name} has no children.", err=True)
        return
    rows = []
    for child in children:
        status = child.get("status") or {}
        cost = (status.get("cost") or {}).get("totalUSD")
        rows.append(
            [
                str((child.get("metadata") or {}).get("name", "")),
                str(status.get("phase") or "Pending"),
                str(status.get("reason") or ""),
                dollars(cost),
                format_age((child.get("metadata") or {}).get("creationTimestamp")),
            ]
        )
    print_table(["NAME", "PHASE", "REASON", "COST", "AGE"], rows)


_DONE = {"retry": "retried", "suspend": "suspended", "resume": "resumed"}


def _verb(verb: str, name: str, project: str | None) -> None:
    client = root.client(project)
    call = {"retry": client.retry_run, "suspend": client.suspend_run, "resume": client.resume_run}[verb]
    status = call(name).get("status") or {}
    reason = f" ({status['reason']})" if status.get("reason") else ""
    typer.echo(f"agentrun/{name} {_DONE[verb]}; phase {status.get('phase')}{reason}")


@agentrun_app.command("retry")
def agentrun_retry(
    name: Annotated[str, typer.Argument(help="The Failed run.")],
    project: ProjectOption = None,
) -> None:
    """Run a Failed run again from its journal; its completed steps are kept."""
    _verb("retry", name, project)


@agentrun_app.command("suspend")
def agentrun_suspend(
    name: Annotated[str, typer.Argument(help="The Running or Waiting run.")],
    project: ProjectOption = None,
) -> None:
    """Park the run with no process until `nodus agentrun resume`; its deadline still runs."""
    _verb("suspend", name, project)


@agentrun_app.command("resume")
def agentrun_resume(
    name: Annotated[str, typer.Argument(help="The suspended run.")],
    project: ProjectOption = None,
) -> None:
    """Start a suspended run again; it replays its journal."""
    _verb("resume", name, project)
