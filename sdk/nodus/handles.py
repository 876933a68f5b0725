"""What the SDK's handles share: the base of the run and group handles (the resource as last
seen, its client, the polling waits) and the argument checks the definitions and handles use.

Everything that refuses an argument raises before anything is sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from decimal import Decimal
from typing import Any, ClassVar, Self

from .client import Client
from .durations import format_duration
from .errors import AgentRunFailed, Invalid, Unavailable, Unsupported, WaitTimeout
from .view import View

__all__: list[str] = []  # package-internal: the SDK's own modules import these by name

_LATER = "a later release builds durable Python runs"
# How long the waits keep polling through an unreachable API: runs survive a server restart, so
# a waiter should too, but not forever when the server is simply gone.
_UNAVAILABLE_GRACE = 30.0
# Poll pacing of the waits and of `Agent.map`: quick at first (most runs the user waits on right
# after submitting are short), then at most once a second so many waiters do not load the API.
_POLL_FIRST_DELAY = 0.1
_POLL_MAX_DELAY = 1.0


# -- argument checks ----------------------------------------------------------------------------


def _usd(value: Any, arg: str) -> str | None:
    """A dollar amount as the decimal string the API wants; floats go through repr (0.1 -> "0.1")."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise Invalid(f'{arg} must be an amount such as "0.50", not a bool', details={"field": arg})
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")
    if isinstance(value, (int, Decimal)):
        return format(Decimal(value), "f")
    raise Invalid(f'{arg} must be a str, Decimal, int or float amount such as "0.50"', details={"field": arg})


def _encode_input(value: Any) -> str:
    """Run input is text; anything else travels JSON-encoded so the agent can read it back."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise Invalid(
            f"input is not a str and cannot be JSON-encoded: {exc}", details={"field": "spec.input"}
        ) from None


def _format_deadline(value: str | timedelta | None) -> str | None:
    """A run's deadline as the document spells it; a `timedelta` becomes ``"1h30m"``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, timedelta):
        try:
            return format_duration(value)
        except ValueError as exc:
            raise Invalid(f"deadline {exc}", details={"field": "spec.deadline"}) from None
    raise Invalid(
        'deadline must be a duration such as "2h" or a timedelta', details={"field": "spec.deadline"}
    )


def _run_name(agent: str, suffix: str, limit: int = 63) -> str:
    """``<agent>-<suffix>`` cut to ``limit`` characters (a DNS label), keeping the whole suffix."""
    prefix = agent[: limit - 1 - len(suffix)].rstrip("-")
    return f"{prefix}-{suffix}"


def _unsupported(what: str, why: str, field: str) -> Unsupported:
    return Unsupported(f"{what} is not supported yet: {why}", details={"field": field})


def _run_failed(name: str, status: Mapping[str, Any]) -> AgentRunFailed:
    """The error of a run that ended without succeeding (or is parked at its cost cap)."""
    phase = status.get("phase") or "Pending"
    reason, message = status.get("reason"), status.get("message")
    text = f"agentrun/{name} ended {phase}"
    if reason:
        text += f" ({reason})"
    if message:
        text += f": {message}"
    return AgentRunFailed(text, details={"name": name, "phase": phase, "reason": reason, "message": message})


# -- the handles' base ----------------------------------------------------------------------------


class _ResourceHandle:
    """What the handles of runs and groups share: the resource as last seen, and its client.

    Built from a resource, a View of one, or just a name; `from_name` fetches it first.
    """

    _collection: ClassVar[str]
    _kind: ClassVar[str]
    name: str  # the resource's metadata.name (000 lists it: ``AgentRun.name``, ``AgentGroup.name``)

    def __init__(
        self,
        obj: Mapping[str, Any] | View | str,
        *,
        project: str | None = None,
        client: Client | None = None,
    ) -> None:
        resource: dict[str, Any]
        if isinstance(obj, str):
            resource = {"metadata": {"name": obj}}
        else:
            resource = obj.to_dict() if isinstance(obj, View) else dict(obj)
        name = (resource.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            raise Invalid(f"an {self._kind} needs metadata.name", details={"field": "metadata.name"})
        self._resource = resource
        self.name = name
        self._project = project
        self._client = client or Client(project=project)

    @classmethod
    def from_name(cls, name: str, project: str | None = None, *, client: Client | None = None) -> Self:
        """The handle of one that exists (e.g. applied from YAML); raises `errors.NotFound`."""
        client = client or Client(project=project)
        return cls(client.get(cls._collection, name, project=project), project=project, client=client)

    @property
    def agent(self) -> str | None:
        """Its agent, as last seen."""
        return (self._resource.get("spec") or {}).get("agent")

    def _refresh(self) -> dict[str, Any]:
        self._resource = self._client.get(self._collection, self.name, project=self._project)
        return self._resource

    def status(self) -> View:
        """The latest resource (``.status.phase``, ``.status.cost``, ...), fetched now."""
        return View(self._refresh())

    def __repr__(self) -> str:
        phase = (self._resource.get("status") or {}).get("phase")
        shown = f", phase={phase!r}" if phase else ""
        return f"{self._kind}(name={self.name!r}, project={self._project or self._client.project!r}{shown})"

    def _poll_status(
        self,
        done: Callable[[dict[str, Any]], bool],
        timeout: float | None,
        still: Callable[[str], str],
    ) -> dict[str, Any]:
        """Poll the resource until ``done(status)`` and return that status.

        Polls back off from 0.1 s to 1 s. An unreachable API (a server restart) is waited out
        for up to 30 s, since runs and groups survive one; ``timeout`` raises `errors.WaitTimeout`
        with ``still(phase)`` as its message.
        """
        start = time.monotonic()
        delay = min(_POLL_FIRST_DELAY, _POLL_MAX_DELAY)
        unreachable_since: float | None = None
        phase = "unknown"
        while True:
            try:
                status = self._refresh().get("status") or {}
                unreachable_since = None
                phase = status.get("phase") or phase
                if done(status):
                    return status
            except Unavailable:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > _UNAVAILABLE_GRACE:
                    raise
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                raise WaitTimeout(still(phase), details={"name": self.name, "phase": phase})
            pause = delay if timeout is None else min(delay, max(timeout - elapsed, 0.0))
            time.sleep(pause)
            delay = min(delay * 1.5, _POLL_MAX_DELAY)
