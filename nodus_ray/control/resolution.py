"""Resolving a step whose outcome is unknown: a person decides what happened.

A sandbox command (or a model call on the user's own key) that was started and never ended
parks its run with ``NeedsResolution`` (`durable`). The resolution service takes the decision,
writes it to the run's journal (the run holds no actor while it waits, so the control plane is
the journal's only writer then) and starts the run again:

* ``Completed``: the step did happen; the person records its result, and replay returns it;
* ``NoEffect``: the step did nothing; replay runs it again as the next attempt;
* ``Cancelled``: the run fails (``StepCancelled``) and the step is recorded as failed.

A decision names the run's ``metadata.resourceVersion`` it was made on (``expectedRevision``;
``revision`` is its older name): of two people who looked at the same uncertain step, only the
first decision is taken. It may also name the journal position it was made on
(``checkpointSeq``, the seq of the journal's last record, as ``steps`` shows it): a decision made
before the run's journal moved on (a message came, another decision was recorded) is refused
``StaleCheckpoint``, and a position the journal has not reached is refused as invalid.
``evidence`` is text or an object of text (SDK: ``dict[str, str]``), kept with the step.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nodus.errors import Conflict, Invalid
from nodus.lifecycle import RunPhase, RunReason, run_transition
from nodus_ray.control.generations import run_journal
from nodus_ray.control.registry import Registry
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.durable.fencing import JournalConflict
from nodus_ray.durable.journal import Journal
from nodus_ray.store.timestamps import utc_now

__all__ = ["ResolutionService", "DECISIONS", "journal_position"]

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


_FIELDS = ("step", "decision", "result", "evidence", "revision", "expectedRevision", "checkpointSeq")
_MAX_EVIDENCE_KEYS = 64


def _evidence(value: Any) -> str | dict[str, str] | None:
    """Text, or an object whose keys and values are text (``evidence.KEY`` names a bad entry)."""
    if value is None or isinstance(value, str):
        return _text(value, "evidence", required=False)
    if not isinstance(value, dict) or len(value) > _MAX_EVIDENCE_KEYS:
        raise Invalid(
            f"evidence: text, or an object of at most {_MAX_EVIDENCE_KEYS} text values "
            '({"receipt": "r-42"})',
            details={"field": "evidence"},
        )
    for key, item in value.items():
        if not isinstance(key, str) or not key or not isinstance(item, str):
            raise Invalid(
                f"evidence.{str(key)[:40]}: every evidence entry is a name and a text value",
                details={"field": f"evidence.{str(key)[:40]}"},
            )
    if len(json.dumps(value, ensure_ascii=False).encode("utf-8")) > _MAX_TEXT:
        raise Invalid(f"evidence: at most {_MAX_TEXT} bytes in all", details={"field": "evidence"})
    return dict(value)


def _whole(body: dict[str, Any], field: str, what: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Invalid(f"{field}: {what} (a whole number)", details={"field": field})
    return value


def _expected_revision(body: dict[str, Any]) -> int:
    """``expectedRevision`` (or its older name ``revision``): one is required, both must agree."""
    what = "the run's metadata.resourceVersion the decision was made on"
    revision = _whole(body, "revision", what)
    expected = _whole(body, "expectedRevision", what)
    if revision is not None and expected is not None and revision != expected:
        raise Invalid(
            "expectedRevision: revision is its older name; send one of them",
            details={"field": "expectedRevision"},
        )
    chosen = expected if expected is not None else revision
    if chosen is None:
        raise Invalid(f"expectedRevision: required, {what}", details={"field": "expectedRevision"})
    return chosen


def _check_checkpoint(name: str, checkpoint: int | None, position: int) -> None:
    """The decision was made on the journal as it is now: not before it moved on, not ahead."""
    if checkpoint is None or checkpoint == position:
        return
    if checkpoint > position:
        raise Invalid(
            f"checkpointSeq: {checkpoint} is ahead of agentrun {name!r}'s journal, which is at seq "
            f"{position}; send the seq of its last recorded step (checkpoint_seq in the SDK)",
            details={"field": "checkpointSeq", "current": position},
        )
    raise Conflict(
        f"checkpointSeq {checkpoint} is stale: agentrun {name!r}'s journal moved on to seq {position} "
        "since the decision was made (checkpoint_seq in the SDK); read its steps again before deciding",
        code="StaleCheckpoint",
        details={"kind": "AgentRun", "name": name, "field": "checkpointSeq", "current": position},
    )


async def _append(journal: Journal, name: str, *args: Any, **kwargs: Any) -> None:
    """Write the decision; a record another writer put at that seq first means the run moved on."""
    try:
        await asyncio.to_thread(journal.append, *args, **kwargs)
    except JournalConflict:
        raise Conflict(
            f"agentrun {name!r} wrote its journal while the decision was being recorded; "
            "read it again before deciding",
            code="RevisionMismatch",
            details={"kind": "AgentRun", "name": name, "field": "revision"},
        ) from None


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


def journal_position(records: list[Any]) -> int:
    """The seq of the journal's last record (-1 for none: a run waiting for a person has some)."""
    return int(records[-1].seq) if records else -1


class ResolutionService:
    """The ``resolve`` verb: a person's decision on a run's uncertain step."""

    def __init__(self, registry: Registry, supervisor: RunSupervisor) -> None:
        self._registry = registry
        self._supervisor = supervisor

    async def resolve_run(self, project: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Record a person's decision on the run's uncertain step, then let the run go on (or fail)."""
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            raise Invalid(
                f"{unknown[0]}: unknown field (a resolution has {', '.join(_FIELDS)})",
                details={"field": unknown[0]},
            )
        step = _text(body.get("step"), "step", required=True)
        assert step is not None  # required
        decision = body.get("decision")
        if decision not in DECISIONS:
            raise Invalid(
                f"decision: one of {', '.join(DECISIONS)}, not {str(decision)[:40]!r}",
                details={"field": "decision"},
            )
        revision = _expected_revision(body)
        checkpoint = _whole(body, "checkpointSeq", "the seq of the journal's last record when deciding")
        evidence = _evidence(body.get("evidence"))
        run = self._registry.run(project, name)
        key = (project, name)
        async with self._registry.locks[key]:
            status = run["status"]
            uncertain = (
                status.get("step")
                if (status["phase"], status.get("reason")) == (RunPhase.WAITING, RunReason.NEEDS_RESOLUTION)
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
            journal = run_journal(self._registry.storage, key, run["status"])
            records = await asyncio.to_thread(journal.load)
            _check_checkpoint(name, checkpoint, journal_position(records))
            last = next(record for record in reversed(records) if record.step_id == step)
            resolution = {"decision": decision, "evidence": evidence, "resolvedAt": utc_now()}
            if decision == "Completed" and last.kind == "step":
                # A Python program's external step: its result is whatever JSON the person
                # states, and the program's replay returns it (`runtime.program`).
                if "result" not in body:
                    raise Invalid(
                        "result: Completed records the step's result (a JSON value)",
                        details={"field": "result"},
                    )
                await _append(
                    journal,
                    name,
                    step,
                    last.kind,
                    "Resolved",
                    {
                        "result": body["result"],
                        "resolution": resolution,
                        "summary": "resolved Completed by a person",
                    },
                    attempt=last.attempt,
                )
            elif decision == "Completed":
                if last.kind != "command":
                    raise Invalid(
                        f"decision: a {last.kind} step can be resolved NoEffect or Cancelled; "
                        "Completed records a command's result",
                        details={"field": "decision"},
                    )
                recorded = _command_result(body.get("result"))
                await _append(
                    journal,
                    name,
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
                await _append(
                    journal,
                    name,
                    step,
                    last.kind,
                    "NoEffect",
                    {"resolution": resolution, "summary": "resolved NoEffect by a person: it runs again"},
                    attempt=last.attempt,
                )
            else:
                error = {"reason": "StepCancelled", "message": f"step {step} was resolved Cancelled"}
                await _append(
                    journal,
                    name,
                    step,
                    last.kind,
                    "Failed",
                    {"error": error, "resolution": resolution, "summary": "resolved Cancelled by a person"},
                    attempt=last.attempt,
                )
            if decision == "Cancelled":
                said = evidence if isinstance(evidence, str) or not evidence else json.dumps(evidence)
                message = f"step {step} was resolved Cancelled" + (f": {said}" if said else "")
                failed = run_transition(status, RunPhase.FAILED, RunReason.STEP_CANCELLED, message)
                status.update({**failed, "finishedAt": utc_now()})
            else:
                resumed = run_transition(
                    status, RunPhase.RUNNING, None, f"step {step} was resolved {decision}"
                )
                status.update({**resumed, "step": None})
            await self._registry.persist_run(key)
        await self._registry.run_changed(key)
        if decision != "Cancelled":
            self._supervisor.supervise(key)
        return run
