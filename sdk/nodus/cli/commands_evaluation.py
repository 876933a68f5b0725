"""``nodus evaluation results``: an evaluation group's graded cases, one line each, and the
evaluation's error bars under them (on stderr; ``compare`` is `commands_statistics`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..resources import API_VERSION
from . import root
from .output import dump_json, dump_yaml, print_table
from .root import OutputOption, ProjectOption, UsageError
from .statistics_text import statistics_lines

__all__ = ["evaluation_app"]


evaluation_app = typer.Typer(help="Read an evaluation group's graded cases.", no_args_is_help=True)


def _case_row(record: dict[str, Any], wide: bool, repeated: bool) -> list[str]:
    case = str(record.get("taskId", ""))
    if repeated:
        case += f"#{record.get('repetition')}"
    reward = record.get("reward")
    row = [
        case,
        str(record.get("run", "")),
        str(record.get("state", "")),
        record.get("verdict") or "-",
        "-" if reward is None else f"{float(reward):g}",
    ]
    if wide:
        row += [record.get("reason") or "-", record.get("evidence") or "-"]
    return row


@evaluation_app.command("results")
def evaluation_results(
    name: Annotated[str, typer.Argument(help="The evaluation group.")],
    output: OutputOption = None,
    project: ProjectOption = None,
) -> None:
    """One line per case: task, run, state, verdict and reward (-o wide adds the grader's evidence)."""
    if output not in (None, "wide", "yaml", "json"):
        raise UsageError(f"--output {output!r} is not one of wide, yaml, json")
    answer = root.client(project).group_results(name)
    items = list(answer.get("items") or [])
    if output in ("yaml", "json"):
        value = {
            "apiVersion": API_VERSION,
            "kind": "EvaluationResultList",
            "evaluation": answer.get("evaluation"),
            "items": items,
        }
        typer.echo(dump_yaml(value) if output == "yaml" else dump_json(value), nl=output == "json")
        return
    headers = ["CASE", "RUN", "STATE", "VERDICT", "REWARD"] + (
        ["REASON", "EVIDENCE"] if output == "wide" else []
    )
    repeated = any(int(item.get("repetition") or 1) > 1 for item in items)
    print_table(headers, [_case_row(item, output == "wide", repeated) for item in items])
    # The error bars go to stderr: a person sees them under the table, a pipe reads the table alone.
    evaluation = answer.get("evaluation") or {}
    for line in statistics_lines(evaluation.get("statistics")) if evaluation else []:
        typer.echo(line, err=True)
