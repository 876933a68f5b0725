"""How a sandboxed command's result reaches the model and the steps listing.

The conversation (`runtime.conversation`) runs the commands the model asks for; this is the
shape of what comes back: the ``tool_result`` block for the next model call, and the one line
``agentrun steps`` shows for the command's step.
"""

from __future__ import annotations

from typing import Any

from nodus_ray.sandbox import CommandResult

__all__ = ["tool_result", "tool_error", "command_summary"]


def tool_result(use: dict[str, Any], result: CommandResult) -> dict[str, Any]:
    """The ``tool_result`` block the model gets for a command it asked for (``use``)."""
    return {
        "type": "tool_result",
        "tool_use_id": use.get("id", ""),
        "content": result.for_model(),
        "is_error": result.exit_code != 0,
    }


def tool_error(use: dict[str, Any], message: str) -> dict[str, Any]:
    """A ``tool_result`` that refuses the command (``maxToolCalls`` reached), saying why."""
    return {"type": "tool_result", "tool_use_id": use.get("id", ""), "content": message, "is_error": True}


def command_summary(command: str, result: CommandResult, egress: list[dict[str, Any]]) -> str:
    """A command step's one-line summary: the command, how it ended, its connections."""
    shown = command if len(command) <= 80 else command[:77] + "..."
    ended = (
        f"stopped ({result.limit or 'killed'})" if result.exit_code is None else f"exit {result.exit_code}"
    )
    if egress:
        refused = sum(1 for connection in egress if connection.get("outcome") != "allowed")
        ended += f", {len(egress)} connection{'s' * (len(egress) != 1)}" + (
            f" ({refused} refused)" if refused else ""
        )
    return f"{shown} -> {ended}"
