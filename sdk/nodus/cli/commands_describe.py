"""``nodus describe agentgroup NAME``: a group's state in words, and the runs that wait.

``nodus get ag`` says how many runs wait (WAITING) and, with ``-o wide``, why (BLOCKED); this
says which runs those are, the reason of each, the step a person must resolve and the run's
own message (for a NeedsResolution run: what the interrupted command may have done, with its
connections). Only groups are described: a run's whole status is ``nodus get ar NAME -o yaml``.
"""

from __future__ import annotations

import io
from typing import Annotated, Any

import typer

from nodus.lifecycle import RunPhase

from . import root
from .output import dollars, print_table
from .root import ProjectOption, UsageError, parse_targets
from .statistics_text import statistics_lines

__all__ = ["describe", "describe_budget", "describe_group"]

_COUNTS = ("active", "waiting", "queued", "succeeded", "failed", "cancelled")


def _reasons(reasons: Any) -> str:
    """``NeedsResolution=1, MaxActiveReached=2``: the reasons that count, or ``none``."""
    if not isinstance(reasons, dict):
        return "none"
    return ", ".join(f"{reason}={count}" for reason, count in reasons.items() if count) or "none"


def describe_group(group: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """The text `describe` prints for ``group`` and its member ``runs``."""
    spec, status = group.get("spec") or {}, group.get("status") or {}
    counts = status.get("counts") or {}
    cost = status.get("cost") or {}
    limit = cost.get("limitUSD") or spec.get("maxCostUSD")
    spent = dollars(cost.get("totalUSD") or "0")
    lines = [
        f"Name:      {(group.get('metadata') or {}).get('name', '')}",
        f"Agent:     {spec.get('agent', '')}",
        f"Phase:     {status.get('phase') or 'Running'}"
        + (f" ({status['reason']})" if status.get("reason") else ""),
    ]
    if status.get("message"):
        lines.append(f"Message:   {status['message']}")
    lines += [
        f"Runs:      {counts.get('succeeded', 0)}/{counts.get('total', 0)} succeeded; "
        + ", ".join(f"{key} {counts.get(key, 0)}" for key in _COUNTS),
        f"Blocked:   {_reasons(status.get('blockedReasons'))}",
        f"Waiting:   {_reasons(status.get('waitingReasons'))}",
        f"Cost:      {spent} / {dollars(limit)}" if limit else f"Cost:      {spent}",
        # Sandbox compute is billed on its own (no group cap counts it; a project Budget does).
        f"Sandbox:   {dollars(cost.get('sandboxUSD') or '0')}"
        + (
            f" (grading {dollars(cost['gradingUSD'])})"
            if cost.get("gradingUSD") not in (None, "", "0")
            else ""
        ),
    ]
    evaluation = status.get("evaluation")
    if isinstance(evaluation, dict):  # its error bars (decision 60); nodus evaluation results for more
        lines += [f"Evaluation: {line}" for line in statistics_lines(evaluation.get("statistics"))[:2]]
    waiting = [run for run in runs if (run.get("status") or {}).get("phase") == RunPhase.WAITING]
    if not waiting:
        lines.append("")
        lines.append("No run waits.")
        return "\n".join(lines)
    lines.append("")
    lines.append("Waiting runs:")
    text = "\n".join(lines)
    rows = [
        [
            (run.get("metadata") or {}).get("name", ""),
            (run.get("status") or {}).get("reason") or "-",
            (run.get("status") or {}).get("step") or "-",
            (run.get("status") or {}).get("message") or "",
        ]
        for run in waiting
    ]
    return text + "\n" + _table(["NAME", "REASON", "STEP", "MESSAGE"], rows)


def describe_budget(budget: dict[str, Any]) -> str:
    """The text `describe` prints for a project's Budget: its cap, period, spent and left."""
    spec, status = budget.get("spec") or {}, budget.get("status") or {}
    period = spec.get("period") or "total"
    lines = [
        f"Name:      {(budget.get('metadata') or {}).get('name', '')}",
        f"Max cost:  {dollars(spec.get('maxCostUSD'))}",
        f"Period:    {period}"
        + (f" ({status.get('periodStart')} to {status.get('periodEnd')}, UTC)" if period != "total" else ""),
        f"Spent:     {dollars(status.get('spentUSD'))}",
        f"Reserved:  {dollars(status.get('reservedUSD'))}",
        f"Left:      {dollars(status.get('leftUSD'))}",
    ]
    return "\n".join(lines)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    buffer = io.StringIO()
    print_table(headers, rows, file=buffer)
    return buffer.getvalue().rstrip("\n")


def describe(
    target: Annotated[
        list[str],
        typer.Argument(
            help="agentgroup NAME, budget NAME (or KIND/NAME).", metavar="KIND/NAME", show_default=False
        ),
    ],
    project: ProjectOption = None,
) -> None:
    """Show a group in words: counts, why runs wait, and each waiting run's reason and step; or
    the project's Budget: its cap, period, spent and left."""
    if [part.strip().lower() for part in target] in (["budget"], ["budgets"]):  # the one there is
        budgets = root.client(project).list("budgets")
        if not budgets:
            raise UsageError("the project has no Budget; create one with `nodus apply -f budget.yaml`")
        typer.echo(describe_budget(budgets[0]))
        return
    targets = parse_targets(target, need_name=True)
    if len(targets) == 1 and targets[0][0] == "Budget":
        assert targets[0][2] is not None
        typer.echo(describe_budget(root.client(project).get("budgets", targets[0][2])))
        return
    if len(targets) != 1 or targets[0][0] != "AgentGroup":
        raise UsageError("describe shows one agentgroup or budget: `nodus describe ag NAME`")
    name = targets[0][2]
    assert name is not None
    client = root.client(project)
    group = client.get("agentgroups", name)
    runs = client.list("agentruns", params={"group": name})
    typer.echo(describe_group(group, [run for run in runs if (run.get("spec") or {}).get("group") == name]))
