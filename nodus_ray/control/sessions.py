"""Sessions: one live keep-alive run per ``(project, agent, session key)``.

``agent.submit(input, session_key=K)`` (an AgentRun whose ``spec.sessionKey`` is ``K``) sends
the input to the live run that holds ``K`` as a message, or, when no live run holds it, starts a
keep-alive run that does. A run that finished (or was deleted) frees its key: the next submit
starts a new run. Decision 48 (docs/decisions.md).

The index is derived, never stored on its own: every run's ``spec.sessionKey`` is in its
``run.json``, so a restarted control plane rebuilds it from the runs it loaded (`recover`), and
an entry is checked against the run (still there, unfinished) each time it is read. Submits of
one key are serialized under one lock, held from the look-up to the run's creation (or the
message's storage), so concurrent submits with the same key create one run.
"""

from __future__ import annotations

import copy
from typing import Any

from nodus.errors import Conflict, Invalid
from nodus.lifecycle import RUN_TERMINAL_PHASES
from nodus.resources import AgentRun, parse_resource
from nodus_ray.control.messages import MessageService
from nodus_ray.control.registry import Registry, check_project
from nodus_ray.control.runs import RunService

__all__ = ["SessionService", "SessionKey", "session_message_key"]

SessionKey = tuple[str, str, str]  # (project, agent, session key)


def session_message_key(run_name: str) -> str:
    """The message key of a submit delivered to a session's run: derived from the submitted
    run's name, so a submit sent again with the same name (an idempotency key) is delivered once."""
    return f"submit/{run_name}"


def _prepared(document: Any) -> dict[str, Any] | None:
    """A copy of a run document naming a session key, made keep-alive; None when it names none.

    A session's run waits for the next message after each answer: ``spec.keepAlive`` is set
    when left out, and refused when it is false.
    """
    if not isinstance(document, dict):
        return None
    spec = document.get("spec")
    if not isinstance(spec, dict) or spec.get("sessionKey") is None:
        return None
    if spec.get("keepAlive") is False:
        raise Invalid(
            "AgentRun spec.keepAlive: a run holding a session key is keep-alive (it waits for the "
            "session's next message after each answer); leave keepAlive out or set it true",
            details={"field": "spec.keepAlive", "kind": "AgentRun"},
        )
    prepared = copy.deepcopy(document)
    prepared["spec"]["keepAlive"] = True
    return prepared


class SessionService:
    """Creates a session's run, or delivers a submit to the live run that holds its key."""

    def __init__(self, registry: Registry, runs: RunService, messages: MessageService) -> None:
        self._registry = registry
        self._runs = runs
        self._messages = messages
        self._index: dict[SessionKey, str] = {}  # -> the name of the run created for the key last

    def recover(self) -> None:
        """Rebuild the index from the loaded runs: the unfinished run holding each key.

        Only unfinished runs are indexed (at most one per key, since creation is serialized),
        so a finished run never hides the live one.
        """
        self._index.clear()
        for (project, name), run in self._registry.runs.items():
            key = run["spec"].get("sessionKey")
            if key and run["status"]["phase"] not in RUN_TERMINAL_PHASES:
                self._index[(project, str(run["spec"]["agent"]), str(key))] = name

    def holder(self, project: str, agent: str, key: str) -> str | None:
        """The name of the live run that holds the session key, or None (the key is free)."""
        name = self._index.get((project, agent, key))
        if name is None:
            return None
        run = self._registry.runs.get((project, name))
        if (
            run is None
            or run["status"]["phase"] in RUN_TERMINAL_PHASES
            or run["spec"].get("sessionKey") != key
            or run["spec"].get("agent") != agent
        ):
            self._index.pop((project, agent, key), None)  # finished or deleted: the key is free
            return None
        return name

    async def create_run(
        self, project: str, document: dict[str, Any], mode: str = "create"
    ) -> dict[str, Any]:
        """Create a run; one naming a session key goes to the session (`submit`)."""
        prepared = _prepared(document)
        if prepared is None:
            return await self._runs.create_run(project, document, mode)
        return await self.submit(project, prepared, mode)

    async def submit(self, project: str, document: dict[str, Any], mode: str) -> dict[str, Any]:
        """Start the session's run, or deliver the input to the live run holding the key.

        Answers ``{"resource", "result"}`` as a create does: ``result`` is ``created`` (a new
        run holds the key), ``delivered`` (the input was stored as a message of the live run,
        ``message`` is its receipt) or ``unchanged`` (this very submit again: the run it created,
        or the message it delivered, already there).
        """
        check_project(project)
        run = parse_resource(document, expected_kind="AgentRun")  # refuses a bad key, naming it
        assert isinstance(run, AgentRun) and run.spec.sessionKey is not None
        agent, key, name = run.spec.agent, run.spec.sessionKey, run.metadata.name
        async with self._registry.locks[("session", project, agent, key)]:
            holder = self.holder(project, agent, key)
            if holder is not None and holder == name:
                return {"resource": self._registry.run(project, name), "result": "unchanged"}
            if holder is not None:
                try:
                    receipt = await self._messages.send_message(
                        project, holder, run.spec.input, session_message_key(name)
                    )
                except Conflict as refused:
                    if refused.code != "AgentRunFinished":
                        raise
                    # It finished between the look-up and the message: the key is free now.
                    self._index.pop((project, agent, key), None)
                else:
                    return {
                        "resource": self._registry.run(project, holder),
                        "result": "unchanged" if receipt["duplicate"] else "delivered",
                        "message": receipt,
                    }
            created = await self._runs.create_run(project, document, mode)
            resource = created["resource"]
            if resource["status"]["phase"] not in RUN_TERMINAL_PHASES:
                self._index[(project, agent, key)] = str(resource["metadata"]["name"])
            return created
