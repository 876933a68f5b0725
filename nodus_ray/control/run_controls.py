"""A person's controls over a run: suspend, resume, retry (``AgentRun.suspend/resume/retry``).

* ``suspend``: a Running or Waiting run parks (``Waiting``/``Suspended``): its actor, and with it
  the sandbox's process, is ended and not replaced (its workspace stays), no timer, message or
  child's end moves it, and its deadline still runs. Suspending a suspended run changes nothing.
* ``resume``: a suspended run goes on in a new actor, which replays its journal; a program that
  was sleeping sleeps again if its time has not come, one that waited for a message waits again.
* ``retry``: a Failed run runs again from its journal. Every step whose last record is
  ``Failed`` gets a ``NoEffect`` record (it runs again, as its next attempt); completed steps are
  kept and replay their results, so nothing that succeeded is done twice. Its cost goes on from
  its journal (the actor's totals are the journal's), so the credits ledger, which charges a
  run's ``status.cost.totalUSD``, stays right. A group's member is retried by its group, not here.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from nodus.errors import Conflict
from nodus.lifecycle import RUN_TERMINAL_PHASES, RunPhase, RunReason, retry_transition, run_transition
from nodus.resources import parse_duration
from nodus_ray.control.generations import run_journal
from nodus_ray.control.registry import Key, Registry, suspended
from nodus_ray.control.retention_policy import check_payloads
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.durable.fencing import JournalConflict
from nodus_ray.store.timestamps import format_timestamp, utc_now

__all__ = ["RunControls"]


def _phase_words(status: dict[str, Any]) -> str:
    reason = status.get("reason")
    return f"{status['phase']}{', ' + str(reason) if reason else ''}"


class RunControls:
    """The suspend, resume and retry verbs."""

    def __init__(self, registry: Registry, supervisor: RunSupervisor) -> None:
        self._registry = registry
        self._supervisor = supervisor

    async def suspend_run(self, project: str, name: str, by: str = "on request") -> dict[str, Any]:
        """Park the run until `resume_run`: no actor, no process; the deadline still runs."""
        run = self._registry.run(project, name)
        key = (project, name)
        async with self._registry.locks[key]:
            status = run["status"]
            if suspended(run):
                return run
            phase = status["phase"]
            if phase not in (RunPhase.RUNNING, RunPhase.WAITING):
                raise Conflict(
                    f"agentrun {name!r} cannot be suspended: it is {_phase_words(status)} "
                    "(only a Running or Waiting run can)",
                    code="AgentRunFinished" if phase in RUN_TERMINAL_PHASES else "NotStarted",
                    details={"kind": "AgentRun", "name": name, "phase": phase},
                )
            message = f"suspended {by}; resume it to go on"
            if phase == RunPhase.RUNNING:
                status.update(run_transition(status, RunPhase.WAITING, RunReason.SUSPENDED, message))
            else:  # parked already: the reason changes, the phase stays (replay restores the wait)
                status.update({"reason": RunReason.SUSPENDED.value, "message": message})
            # Whatever it waited for is replaced by the suspension; a replay sets it again.
            status.update({"wakeAt": None, "waitingFor": None, "actorName": None})
            await self._registry.persist_run(key)
        self._supervisor.wake_timers.disarm(key)
        await self._registry.run_changed(key)
        # Its supervision sees the run parked and stops, counting no lost actor.
        self._supervisor.kill_actor(key)
        await self._supervisor.settle_cost(key)
        self._supervisor.arm_deadline(key)
        return run

    async def resume_run(self, project: str, name: str) -> dict[str, Any]:
        """A suspended run goes on: a new actor replays its journal."""
        run = self._registry.run(project, name)
        key = (project, name)
        async with self._registry.locks[key]:
            status = run["status"]
            if not suspended(run):
                raise Conflict(
                    f"agentrun {name!r} is not suspended (it is {_phase_words(status)})",
                    code="NotSuspended",
                    details={"kind": "AgentRun", "name": name, "phase": status["phase"]},
                )
            status.update(run_transition(status, RunPhase.RUNNING, None, "resumed on request"))
            # An actor started while the suspend was under way was ended by its supervision: it
            # is no lost actor, and the resumed run's supervision must not count it as one.
            status["actorName"] = None
            await self._registry.persist_run(key)
        await self._registry.run_changed(key)
        self._supervisor.supervise(key)
        return run

    async def retry_run(self, project: str, name: str) -> dict[str, Any]:
        """A Failed run runs again from its journal: failed steps run again, completed ones are kept."""
        run = self._registry.run(project, name)
        key = (project, name)
        async with self._registry.locks[key]:
            status = run["status"]
            group = run["spec"].get("group")
            if group:
                raise Conflict(
                    f"agentrun {name!r} is a run of group {group!r}; a group's run is not retried alone",
                    code="InGroup",
                    details={"kind": "AgentRun", "name": name, "group": group},
                )
            if status["phase"] != RunPhase.FAILED:
                raise Conflict(
                    f"agentrun {name!r} is {_phase_words(status)}; only a Failed run can be retried",
                    code="NotFailed",
                    details={"kind": "AgentRun", "name": name, "phase": status["phase"]},
                )
            # Retention (decision 46): a journal without its values, or without the workspace its
            # commands changed, cannot be replayed faithfully; refused, nothing changed.
            check_payloads(run, "journal values (a retry replays them)")
            deleted = (status.get("sandbox") or {}).get("workspaceDeletedAt")
            if deleted or (status.get("retention") or {}).get("workspace") in ("Deleting", "Deleted"):
                raise Conflict(
                    f"agentrun {name!r} cannot be retried: its workspace was deleted"
                    f"{f' at {deleted}' if deleted else ''} "
                    "(NODUS_WORKSPACE_RETENTION after it finished), and a retry would replay its "
                    "commands' results on files that are gone; create a new run instead",
                    code="WorkspaceDeleted",
                    details={"kind": "AgentRun", "name": name, "field": "status.sandbox.workspaceDeletedAt"},
                )
            try:
                retried = await asyncio.to_thread(self._forget_failures, key)
            except JournalConflict:
                raise Conflict(
                    f"agentrun {name!r} wrote its journal while it was being retried; try again",
                    code="RevisionMismatch",
                    details={"kind": "AgentRun", "name": name},
                ) from None
            again = f"; {len(retried)} failed step(s) run again" if retried else ""
            message = f"retried on request (it was {_phase_words(status)}){again}"
            status.update(retry_transition(status, message))
            status.update({"finishedAt": None, "answer": None, "actorName": None, "step": None})
            deadline = run["spec"].get("deadline")
            if deadline:  # a new try gets its time again, from now
                due = datetime.now(UTC) + parse_duration(deadline)
                status["deadlineAt"] = format_timestamp(due)
            status["retries"] = int(status.get("retries") or 0) + 1
            await self._registry.persist_run(key)
        self._supervisor.forget_losses(key)
        await self._registry.run_changed(key)
        self._supervisor.supervise(key)
        return run

    def _forget_failures(self, key: Key) -> list[str]:
        """Append ``NoEffect`` to every step whose last record is ``Failed``; their ids, in order.

        The control plane is the journal's only writer here: a Failed run holds no actor.
        """
        journal = run_journal(self._registry.storage, key, self._registry.runs[key]["status"])
        last: dict[str, Any] = {}
        for record in journal.load():
            last[record.step_id] = record
        failed = [record for record in last.values() if record.state == "Failed" and record.kind != "message"]
        for record in failed:
            journal.append(
                record.step_id,
                record.kind,
                "NoEffect",
                {
                    "resolution": {"decision": "NoEffect", "evidence": "retry", "resolvedAt": utc_now()},
                    "summary": "the run was retried: this failed step runs again",
                },
                attempt=record.attempt,
            )
        return [record.step_id for record in failed]
