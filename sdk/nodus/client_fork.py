"""Forking a run from Python: `Client.fork_run` (``POST .../agentruns/{name}/fork``, decision 58).

A mixin of `client.Client`. ``at`` is a step as ``Client.run_steps`` lists it: its ``id``
(``"turn-1/command-1-2"``) or its position in that list counting from 1. The server decides
whether it is a step boundary and refuses, as `errors.Invalid` naming the field ``at``, a step
that does not exist or is not one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._client_core import ClientCore
from .errors import Invalid

if TYPE_CHECKING:
    pass

__all__ = ["ForkCalls", "fork_body"]


def fork_body(at: int | str, name: str | None = None, input: str | None = None) -> dict[str, Any]:
    """The request body; `Invalid` for an ``at`` that is neither a step number nor an ID."""
    if isinstance(at, bool) or not isinstance(at, int | str) or (isinstance(at, str) and not at.strip()):
        raise Invalid("at: a step's ID or its number in the steps listing (from 1)", details={"field": "at"})
    if isinstance(at, int) and at < 1:
        raise Invalid(f"at: step numbers start at 1, not {at}", details={"field": "at"})
    body: dict[str, Any] = {"at": at}
    if name is not None:
        body["name"] = name
    if input is not None:
        body["input"] = input
    return body


class ForkCalls(ClientCore):
    """`Client`'s fork."""

    def fork_run(
        self,
        name: str,
        at: int | str,
        *,
        new_name: str | None = None,
        input: str | None = None,
        project: str | None = None,
    ) -> dict[str, Any]:
        """A new run whose journal is ``name``'s before step ``at`` and whose workspace is the
        snapshot taken there; it runs that step again and goes on, with ``input`` as the next
        user input when given. Returns the new AgentRun resource (the original is untouched)."""
        body = fork_body(at, new_name, input)
        return self._object(self._request("POST", self._path("agentruns", project, name, "fork"), json=body))
