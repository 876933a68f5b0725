"""Rendering for the CLI: kubectl-like tables, YAML that reads well, JSON, dollars and ages."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml
from rich.console import Console
from rich.table import Table

__all__ = [
    "dump_yaml",
    "dump_json",
    "print_table",
    "shorten",
    "dollars",
    "format_age",
    "format_running",
    "step_summary",
]


class _Dumper(yaml.SafeDumper):  # type: ignore[misc,unused-ignore]  # PyYAML may have no stubs
    """Multi-line strings (system prompts, answers) as ``|`` blocks instead of escaped one-liners."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and not value.endswith((" ", "\t")) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(value: Any, *, multi: bool = False) -> str:
    """One YAML document, or a ``---``-separated stream when ``multi`` and given a list."""
    if multi:
        return str(yaml.dump_all(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
    return str(yaml.dump(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True))


def dump_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def dollars(value: Any) -> str:
    """``$0.012`` for an amount, ``-`` for none: the COST columns of every table."""
    return f"${value}" if value not in (None, "") else "-"


def shorten(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters, so a table row never wraps a long summary."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, file: TextIO | None = None) -> None:
    """A borderless table with upper-case headers, three spaces between columns, like kubectl.

    Markup and highlighting are off because cells hold user data (``[brackets]`` are not styles),
    and the width is unbounded because cutting a name or cost to fit a pipe hides data; rich lays
    the columns out, and trailing padding is cut so the output diffs and greps cleanly.
    """
    console = Console(
        file=io.StringIO(), markup=False, highlight=False, emoji=False, color_system=None, width=100_000
    )
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 3, 0, 0), header_style="")
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*[str(cell) for cell in row])
    with console.capture() as captured:
        console.print(table)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    print(text, file=file or sys.stdout)


def format_age(timestamp: str | None, now: datetime | None = None) -> str:
    """kubectl's AGE column: ``45s``, ``12m``, ``3h``, ``5d``; ``<unknown>`` without a timestamp."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:  # kubectl keeps the smaller unit below two of the larger
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def format_running(seconds: Any) -> str:
    """How long a step in progress has run: ``running 12s``, ``running 3m04s``, ``running 2h05m``."""
    try:
        total = max(0, int(seconds))
    except (TypeError, ValueError):
        return "running"
    if total < 60:
        return f"running {total}s"
    if total < 3600:
        return f"running {total // 60}m{total % 60:02d}s"
    return f"running {total // 3600}h{total % 3600 // 60:02d}m"


def step_summary(step: dict[str, Any], limit: int | None = None) -> str:
    """A step's SUMMARY cell: what it did, or for a step in progress what it does and for how
    long (``$ sleep 417 (running 12s)``; the server says how long only while the run is Running).
    ``limit`` shortens what it does, never how long."""
    summary = " ".join(str(step.get("summary") or "").split())
    running = ""
    if step.get("state") == "Started" and step.get("runningSeconds") is not None:
        running = format_running(step["runningSeconds"])
    if limit is not None:
        summary = shorten(summary, max(10, limit - len(running) - 3) if running else limit)
    if running:
        return f"{summary} ({running})" if summary else running
    return summary
