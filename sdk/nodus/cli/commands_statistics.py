"""``nodus evaluation compare A B``: the paired difference of two evaluations (decision 60).

Registered on `commands_evaluation.evaluation_app` beside ``results``. A refusal (two different
batches, a group that is not an evaluation, an unknown name) is one ``error:`` line and a
non-zero exit (`root`), as for every verb.
"""

from __future__ import annotations

from typing import Annotated

import typer

from . import root
from .commands_evaluation import evaluation_app
from .output import dump_json, dump_yaml
from .root import OutputOption, ProjectOption, UsageError
from .statistics_text import comparison_lines

__all__ = ["evaluation_compare"]


@evaluation_app.command("compare")
def evaluation_compare(
    a: Annotated[str, typer.Argument(help="Evaluation group A.")],
    b: Annotated[str, typer.Argument(help="Evaluation group B, on the same batch.")],
    output: OutputOption = None,
    project: ProjectOption = None,
) -> None:
    """A minus B per task scored in both: pass rate and mean reward, with the 95% interval and n.

    Both must be evaluations of the same Environment version, split, seed and number of tasks.
    """
    if output not in (None, "yaml", "json"):
        raise UsageError(f"--output {output!r} is not one of yaml, json")
    comparison = root.client(project).compare_evaluations(a, b)
    if output == "json":
        typer.echo(dump_json(comparison), nl=True)
        return
    if output == "yaml":
        typer.echo(dump_yaml(comparison), nl=False)
        return
    typer.echo("\n".join(comparison_lines(comparison)))
