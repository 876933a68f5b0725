"""What the run actor needs of the program package without loading it: whether an Agent is a
Python program, and the two ways a program's generation ends short of an answer.

A run's actor is a fresh process, and a Claude agent's run never serves a program: the
program's server, waits and model calls (and the wire protocol they import) are loaded only for
a program's run (issue 19). `server` and `wiring` re-export these names.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_program", "Parked", "ContinuedAsNew"]


def is_program(agent_spec: dict[str, Any]) -> bool:
    """Whether the Agent is a Python program (it has an entrypoint) rather than a Claude agent."""
    return bool(agent_spec.get("entrypoint"))


class Parked(Exception):  # noqa: N818 - a state the run waits in, not an error
    """The program waits for something that takes no process: a timer, a message, children.

    ``reason`` is the run's Waiting reason; ``wake_at`` (RFC 3339) when a timer starts it
    again; ``waiting_for`` what else does (``{"message": name, "after": seq}``, ``{"children"}``).
    """

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        wake_at: str | None = None,
        waiting_for: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.wake_at = wake_at
        self.waiting_for = waiting_for


class ContinuedAsNew(Exception):  # noqa: N818 - how the program ended, not an error
    """The program called ``continue_as_new``: its generation is journaled as ended and the
    control plane recorded the next one (`control.generations`), which the actor runs now:
    ``generation`` on an empty journal starting at ``first_seq``, with ``input_text``;
    ``prior_usd`` is what the run's earlier generations cost, ``read`` the last message seq
    the program took of each name (the next generation reads after them)."""

    def __init__(
        self,
        generation: int,
        input_text: str,
        first_seq: int,
        prior_usd: str,
        read: dict[str, int] | None = None,
        prior_sandbox_usd: str = "0",
    ) -> None:
        super().__init__(f"continued as new: generation {generation}")
        self.generation = generation
        self.input_text = input_text
        self.first_seq = first_seq
        self.prior_usd = prior_usd
        self.prior_sandbox_usd = prior_sandbox_usd  # the earlier generations' sandbox charges
        self.read = dict(read or {})
