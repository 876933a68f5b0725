"""``nodus agentrun export`` and ``nodus evaluation export``: a run's trajectory, an evaluation's
cases, to stdout or a file (docs/export.md).

Registered on `commands_runs.agentrun_app` and `commands_evaluation.evaluation_app`. A format
not offered, a file that cannot be written, and Parquet to a terminal are refused before
anything is asked of the server; each failure is one ``error:`` line and a non-zero exit (`root`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Annotated

import typer

from ..export_formats import BINARY_FORMATS, evaluation_export_format, run_export_format
from . import root
from .commands_evaluation import evaluation_app
from .commands_runs import agentrun_app
from .root import CliError, ProjectOption

__all__ = ["agentrun_export", "evaluation_export"]

FileOption = Annotated[
    Path | None, typer.Option("--output-file", "-o", help="Write it to this file (default: stdout).")
]


def _check_target(file: Path | None, format: str) -> None:
    if file is None:
        if format in BINARY_FORMATS and sys.stdout.isatty():
            raise CliError(
                f"--format {format} is binary and stdout is a terminal; write it with -o FILE "
                "(or redirect stdout)",
                reason="Invalid",
            )
        return
    folder = file.parent if str(file.parent) else Path(".")
    if file.is_dir():
        raise CliError(f"cannot write {file}: it is a directory", reason="Invalid")
    if (
        not folder.is_dir()
        or not os.access(folder, os.W_OK)
        or (file.exists() and not os.access(file, os.W_OK))
    ):
        raise CliError(f"cannot write {file}: its folder does not exist or is not writable", reason="Invalid")


def _export(what: str, file: Path | None, send: Callable[[Path | IO[bytes]], bytes | int]) -> None:
    """Stream the export into ``file``, or stdout."""
    if file is None:
        send(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    written = send(file)
    size = written if isinstance(written, int) else len(written)
    typer.echo(f"{what}: {size} bytes written to {file}", err=True)


@agentrun_app.command("export")
def agentrun_export(
    name: Annotated[str, typer.Argument(help="The run.")],
    format: Annotated[
        str, typer.Option("--format", "-f", help="atif (ATIF JSON) or jsonl (journal records).")
    ] = "atif",
    file: FileOption = None,
    project: ProjectOption = None,
) -> None:
    """Export the run's trajectory (ATIF, or its journal as JSON Lines); secrets stay masked."""
    chosen = run_export_format(format).value
    _check_target(file, chosen)
    client = root.client(project)
    _export(f"agentrun/{name} {chosen}", file, lambda to: client.export_run(name, chosen, to=to))


@evaluation_app.command("export")
def evaluation_export(
    name: Annotated[str, typer.Argument(help="The evaluation group.")],
    format: Annotated[
        str, typer.Option("--format", "-f", help="inspect (Inspect's eval log), jsonl or parquet.")
    ] = "inspect",
    file: FileOption = None,
    project: ProjectOption = None,
) -> None:
    """Export the evaluation's cases (Inspect's eval log, JSON Lines or Parquet); secrets stay masked."""
    chosen = evaluation_export_format(format).value
    _check_target(file, chosen)
    client = root.client(project)
    _export(f"agentgroup/{name} {chosen}", file, lambda to: client.export_evaluation(name, chosen, to=to))
