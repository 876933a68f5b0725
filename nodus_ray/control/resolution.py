"""Resolving a step whose outcome is unknown: a person decides what happened.

A sandbox command (or a model call on the user's own key) that was started and never ended
parks its run with ``NeedsResolution`` (`durable`). The control plane mixes this in to take
the decision, write it to the run's journal (the run holds no actor while it waits, so the
control plane is the journal's only writer then) and start the run again:

* ``Completed``: the step did happen; the person records its result, and replay returns it;
* ``NoEffect``: the step did nothing; replay runs it again as the next attempt;
* ``Cancelled``: the run fails (``StepCancelled``) and the step is recorded as failed.

A decision names the run's ``metadata.resourceVersion`` it was made on: of two people who
looked at the same uncertain step, only the first decision is taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nodus.errors import Conflict, Invalid
from nodus_ray.durable.journal import Journal
from nodus_ray.runtime.run_actor import run_storage_prefix
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import utc_now

__all__ = ["RunResolution", "DECISIONS"]

Key = tuple[str, str]

DECISIONS = ("Completed", "NoEffect", "Cancelled")
_MAX_TEXT = 64 * 1024


def _text(value: Any, field: str, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value) or len(value.encode("utf-8")) > _MAX_TEXT:
        raise Invalid(
            f"{field}: {'required; ' if required else ''}text of at most {_MAX_TEXT} bytes",
            details={"field": field},
        )
    return value


def _command_result(result: Any) -> dict[str, Any]:
    """A command's result as a person states it (``exitCode``, ``output``), as the journal keeps it."""
    if not isinstance(result, dict) or set(result) - {"exitCode", "output"}:
        raise Invalid(
            'result: a command\'s result is {"exitCode": 0, "output": "..."}', details={"field": "result"}
        )
    exit_code = result.get("exitCode")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise Invalid(
            "result.exitCode: a whole number, or null for a command that was killed",
            details={"field": "result.exitCode"},
        )
    output = _text(result.get("output", ""), "result.output", required=False) or ""
    return {
        "exit_code": exit_code,
        "output": output,
        "truncated": False,
        "timed_out": False,
        "cancelled": False,
        "duration_seconds": 0.0,
        "limit": None,
    }


class RunResolution:
    """The ``resolve`` verb; the control plane provides what is declared here."""

    storage: Storage
    _runs: dict[Key, dict[str, Any]]
    _locks: Any
    get_run: Callable[..., Awaitable[dict[str, Any]]]
    _persist_run: Callable[[Key], Awaitable[None]]
    _supervise: Callable[[Key], None]
    _tell_group: Callable[[Key], Awaitable[None]]

    async def resolve_run(self, project: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Record a person's decision on the run's uncertain step, then let the run go on (or fail)."""
        unknown = sorted(set(body) - {"step", "decision", "result", "evidence", "revision"})
        if unknown:
            raise Invalid(
                f"{unknown[0]}: unknown field (a resolution has step, decision, result, evidence, revision)",
                details={"field": unknown[0]},
            )
        step = _text(body.get("step"), "step", required=True)
        decision = body.get("decision")
        if decision not in DECISIONS:
            raise Invalid(
                f"decision: one of {', '.join(DECISIONS)}, not {str(decision)[:40]!r}",
                details={"field": "decision"},
            )
        revision = body.get("revision")
        if isinstance(revision, bool) or not isinstance(revision, int):
            raise Invalid(
                "revision: the run's metadata.resourceVersion the decision was made on (a whole number)",
                details={"field": "revision"},
            )
        evidence = _text(body.get("evidence"), "evidence", required=False)
        run = await self.get_run(project, name)
        key = (project, name)
        async with self._locks[key]:
            status = run["status"]
            uncertain = (
                status.get("step")
                if (status["phase"], status.get("reason")) == ("Waiting", "NeedsResolution")
                else None
            )
            if uncertain is None:
                raise Conflict(
                    f"agentrun {name!r} has no step to resolve (phase {status['phase']}"
                    f"{', ' + status['reason'] if status.get('reason') else ''})",
                    code="StepNotUncertain",
                    details={"kind": "AgentRun", "name": name, "field": "step"},
                )
            if step != uncertain:
                raise Conflict(
                    f"step {step!r} of agentrun {name!r} is not uncertain; {uncertain!r} is",
                    code="StepNotUncertain",
                    details={"kind": "AgentRun", "name": name, "field": "step"},
                )
            current = int(run["metadata"].get("resourceVersion") or 0)
            if revision != current:
                raise Conflict(
                    f"revision {revision} is stale: agentrun {name!r} is at revision {current}; "
                    "read it again before deciding",
                    code="RevisionMismatch",
                    details={"kind": "AgentRun", "name": name, "field": "revision", "current": current},
                )
            journal = Journal(self.storage, f"{run_storage_prefix(*key)}/journal")
            records = await asyncio.to_thread(journal.load)
            last = next(record for record in reversed(records) if record.step_id == step)
            resolution = {"decision": decision, "evidence": evidence, "resolvedAt": utc_now()}
            if decision == "Completed":
                if last.kind != "command":
                    raise Invalid(
                        f"decision: a {last.kind} step can be resolved NoEffect or Cancelled; "
                        "Completed records a command's result",
                        details={"field": "decision"},
                    )
                recorded = _command_result(body.get("result"))
                await asyncio.to_thread(
                    journal.append,
                    step,
                    last.kind,
                    "Resolved",
                    {
                        "result": recorded,
                        "resolution": resolution,
                        "summary": f"resolved Completed by a person (exit {recorded['exit_code']})",
                    },
                    attempt=last.attempt,
                )
            elif decision == "NoEffect":
                await asyncio.to_thread(
                    journal.append,
                    step,
                    last.kind,
                    "NoEffect",
                    {"resolution": resolution, "summary": "resolved NoEffect by a person: it runs again"},
                    attempt=last.attempt,
                )
            else:
                error = {"reason": "StepCancelled", "message": f"step {step} was resolved Cancelled"}
                await asyncio.to_thread(
                    journal.append,
                    step,
                    last.kind,
                    "Failed",
                    {"error": error, "resolution": resolution, "summary": "resolved Cancelled by a person"},
                    attempt=last.attempt,
                )
            if decision == "Cancelled":
                status.update(
                    {
                        "phase": "Failed",
                        "reason": "StepCancelled",
                        "finishedAt": utc_now(),
                        "message": f"step {step} was resolved Cancelled"
                        + (f": {evidence}" if evidence else ""),
                    }
                )
            else:
                status.update(
                    {
                        "phase": "Running",
                        "reason": None,
                        "step": None,
                        "message": f"step {step} was resolved {decision}",
                    }
                )
            await self._persist_run(key)
        await self._tell_group(key)
        if decision != "Cancelled":
            self._supervise(key)
        return run
