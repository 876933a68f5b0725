"""An Agent's ``spec.maxWorkers``: how many of its runs hold a run actor at once.

A run holds a worker while its supervision keeps an actor on it (`run_supervisor`): from the
moment the supervision starts until the run parks (Waiting for a message, a timer, children,
credits, a person: no actor) or ends. A run that would take one more than the Agent's limit
(created, woken, resumed, retried, or a group member its group admitted) does not start: it
stays ``Pending`` with reason ``MaxWorkersReached`` (status.message ``"N of M workers busy"``)
and is started, oldest first (by ``createdAt``), when one of the Agent's runs gives its worker
back. A group's own admission is not changed by this: a member the group admitted may still
wait here.

The counts are in memory and re-derived after a restart from the runs' status: the control
plane's recovery takes the runs that hold an actor (``status.actorName``) first, whatever the
limit, then the others oldest first (`recovery_order`), so the queue comes back as it was.
The limit read is the Agent's current one, so raising it lets more start at the next change.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from nodus.lifecycle import RUN_TERMINAL_PHASES, RunPhase, RunReason, queue_transition
from nodus_ray.control.registry import Key, Registry
from nodus_ray.store.timestamps import parse_timestamp

__all__ = ["AgentWorkers", "queued_for_worker", "recovery_order"]

logger = logging.getLogger(__name__)

_LONG_AGO = datetime.min.replace(tzinfo=UTC)


def queued_for_worker(run: dict[str, Any]) -> bool:
    """A run that waits for one of its Agent's workers (it holds no actor)."""
    status = run["status"]
    return bool(status["phase"] == RunPhase.PENDING and status.get("reason") == RunReason.MAX_WORKERS_REACHED)


def _holds_actor(run: dict[str, Any]) -> bool:
    return bool(run["status"].get("actorName"))


def _age(name: str, run: dict[str, Any]) -> tuple[datetime, str]:
    """Creation time, then name: the queue's order (parsed: the stored text drops ``.000000``)."""
    created = run["status"].get("createdAt")
    return (parse_timestamp(created) if created else _LONG_AGO, name)


def recovery_order(item: tuple[Key, dict[str, Any]]) -> tuple[bool, datetime, str]:
    """Sort key of the runs a restarted control plane supervises again: the ones that hold an
    actor first (they keep their worker), then the rest oldest first (the queue's order)."""
    (_, name), run = item
    return (not _holds_actor(run), *_age(name, run))


class AgentWorkers:
    """Who holds each Agent's workers, and who waits for one (`take`, `release`)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._busy: defaultdict[Key, set[str]] = defaultdict(set)  # (project, agent) -> runs
        self._waiting: defaultdict[Key, set[str]] = defaultdict(set)

    def limit(self, project: str, agent: str) -> int | None:
        """The Agent's ``spec.maxWorkers`` now (None: no limit)."""
        found = self._registry.agents.get((project, agent))
        value = (found or {}).get("spec", {}).get("maxWorkers")
        return None if value is None else int(value)

    def busy(self, project: str, agent: str) -> int:
        return len(self._busy.get((project, agent), ()))

    def take(self, key: Key) -> bool:
        """Whether the run may hold an actor now (then it counts); else it is queued, Pending
        ``MaxWorkersReached``. Synchronous, so two runs never both take the last worker."""
        run = self._registry.runs.get(key)
        if run is None or run["status"]["phase"] in RUN_TERMINAL_PHASES:
            return True  # nothing to hold: its supervision ends at once
        agent = (key[0], str(run["spec"]["agent"]))
        busy, waiting = self._busy[agent], self._waiting[agent]
        if key[1] in busy or run["status"]["phase"] not in (RunPhase.PENDING, RunPhase.RUNNING):
            return True  # counted already, or parked (its supervision ends at once)
        limit = self.limit(*agent)
        room = limit is None or len(busy) < limit
        older = any(
            _age(other, found) < _age(key[1], run)
            for other in list(waiting)
            if other != key[1] and (found := self._valid_waiter(agent, other)) is not None
        )
        if _holds_actor(run) or (room and not older):
            busy.add(key[1])
            waiting.discard(key[1])
            if queued_for_worker(run):
                run["status"].update({"reason": None, "message": None})  # admitted: its actor reports Running
                self._persist_soon(key)
            return True
        waiting.add(key[1])
        message = f"{len(busy)} of {limit} workers busy: agent {agent[1]!r} is at spec.maxWorkers"
        status = run["status"]
        if status["phase"] == RunPhase.PENDING:
            status.update({"reason": RunReason.MAX_WORKERS_REACHED.value, "message": message})
        else:  # woken, resumed or retried (Running, no actor yet): it waits for a worker first
            status.update(queue_transition(status, message))
        self._persist_soon(key)
        return False

    def release(self, key: Key) -> list[Key]:
        """The run gave its worker back (it parked, ended or went); the queued runs that start now."""
        run = self._registry.runs.get(key)
        for agent, busy in self._busy.items():
            if agent[0] == key[0] and key[1] in busy and (run is None or run["spec"]["agent"] == agent[1]):
                busy.discard(key[1])
                return self.startable(*agent)
        return []

    def startable(self, project: str, agent: str) -> list[Key]:
        """The oldest queued runs of the Agent that fit in its free workers (still queued: the
        caller supervises them, which takes their worker)."""
        key = (project, agent)
        limit = self.limit(project, agent)
        valid = [
            (name, run) for name in list(self._waiting.get(key, ())) if (run := self._valid_waiter(key, name))
        ]
        valid.sort(key=lambda item: _age(*item))
        free = len(valid) if limit is None else max(0, limit - len(self._busy.get(key, ())))
        for name, _ in valid[:free]:
            self._waiting[key].discard(name)  # the oldest one first: `take` admits it
        return [(project, name) for name, _ in valid[:free]]

    def startable_for(self, key: Key) -> list[Key]:
        """`startable` of the run's Agent: a raised limit shows when its next run queues."""
        run = self._registry.runs.get(key)
        return [] if run is None else self.startable(key[0], str(run["spec"]["agent"]))

    def _valid_waiter(self, agent: Key, name: str) -> dict[str, Any] | None:
        """The queued run, or None (and forgotten) when it was cancelled, suspended or deleted."""
        run = self._registry.runs.get((agent[0], name))
        if run is not None and run["spec"]["agent"] == agent[1] and queued_for_worker(run):
            return run
        self._waiting[agent].discard(name)
        return None

    def _persist_soon(self, key: Key) -> None:
        asyncio.get_running_loop().create_task(self._persist(key))

    async def _persist(self, key: Key) -> None:
        """Write the run's changed reason (a restarted control plane reads its queue back)."""
        try:
            async with self._registry.locks[key]:
                run = self._registry.runs.get(key)
                if run is None:
                    return
                await self._registry.persist_run(key)
            await self._registry.run_changed(key)
        except Exception:  # noqa: BLE001 - the next change of the run writes it again
            logger.warning("could not write run %s/%s's worker state", *key, exc_info=True)
