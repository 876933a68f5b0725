"""``nodus batch run``: a file of tasks as one AgentGroup, with progress, into one output file.

The work is `nodus.batch.run_batch`; this module is its command line: the options, a live
progress bar on a terminal (one line every few seconds otherwise, for CI and ``ray job logs``)
and the exit code (0 when every task succeeded, 1 when some did not).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..batch import BatchProgress, batch_group_name, log_progress, run_batch
from . import root
from .root import CliError

__all__ = ["batch_app"]

batch_app = typer.Typer(
    help="Run a file of tasks as one AgentGroup and write one row per task.", no_args_is_help=True
)


class _Bar:
    """A rich progress bar on stderr: done of total, then failed, active, queued and spend."""

    def __init__(self, group: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._group = group
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._task: Any = None

    def __call__(self, progress: BatchProgress) -> None:
        cap = f" of ${progress.cap}" if progress.cap else ""
        detail = f"{progress.failed} failed, {progress.active} active, {progress.queued} queued, ${progress.spent}{cap}"
        if progress.blocked:
            detail += f" (waiting: {progress.blocked})"
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(self._group, total=progress.total, detail=detail)
        self._progress.update(self._task, completed=progress.done, detail=detail)

    def stop(self) -> None:
        if self._task is not None:
            self._progress.stop()


@batch_app.command("run")
def batch_run(
    tasks: Annotated[
        Path, typer.Argument(help="Tasks: .jsonl, .csv or .parquet with key, input, depends_on.")
    ],
    agent: Annotated[str, typer.Option("--agent", help="The Agent every task runs on.")],
    out: Annotated[Path, typer.Option("--out", help="Where the rows go: .parquet, .jsonl or .csv.")],
    max_active: Annotated[
        int | None, typer.Option("--max-active", help="Tasks that run at once (default 10).")
    ] = None,
    max_cost: Annotated[
        str | None, typer.Option("--max-cost", help="Cost cap of the whole batch in USD.")
    ] = None,
    group: Annotated[
        str | None, typer.Option("--group", help="The group's name (default: from --out).")
    ] = None,
    project: Annotated[str | None, typer.Option("--project", "-p", help="Project of the batch.")] = None,
) -> None:
    """Run every task of a file as one AgentGroup; the same command again resumes it."""
    name = group or batch_group_name(out)
    show: Any = _Bar(name) if sys.stderr.isatty() else log_progress(name)
    try:
        result = run_batch(
            tasks,
            agent=agent,
            out=out,
            max_active=max_active,
            max_cost=max_cost,
            group=name,
            client=root.client(project),
            on_progress=show,
        )
    except KeyboardInterrupt:
        raise CliError(
            f"interrupted; the batch goes on in agentgroup/{name}: run the same command to "
            "resume it and write the rest",
            reason="Interrupted",
        ) from None
    finally:
        if isinstance(show, _Bar):
            show.stop()
    failed = result.failed
    typer.echo(
        f"{len(result.rows) - len(failed)} of {len(result.rows)} tasks succeeded "
        f"(agentgroup/{name}); rows in {out}"
    )
    if failed:
        raise CliError(
            f"{len(failed)} of {len(result.rows)} tasks did not succeed; see the phase and "
            f"reason columns of {out}",
            reason="RunsFailed",
        )
