"""Child runs of a durable Python program: ``ctx.spawn``, ``gather`` and ``map`` in the control plane.

A child is an ordinary run named ``<parent>-<key>``: of the parent's Agent at the SAME revision
the parent pinned (its pinned Agent document is copied, so a redeploy never changes what a tree
of runs executes), with ``status.parent`` naming the parent. The key makes a spawn idempotent
across replays: the same key with the same input is the child created before; with another
input it is refused (``ChildKeyReused``), since a replay that asks for different work under one
key is a program that changed, and silently reusing the old child would hide that.

The service also keeps a tree moving and bounded:

* a child's end starts its parent again when the parent is parked ``AwaitingChildren`` for it
  (once every child it waits for has ended: a ``map`` over 100 children wakes it once);
* a cancelled (or deleted) parent cancels its unfinished children, and so on down the tree.

A child of a group member is not a group member: it is the member's own work, not the group's.
"""

from __future__ import annotations

import asyncio
import logging
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from nodus.errors import Conflict, Invalid
from nodus.lifecycle import RUN_TERMINAL_PHASES, RunPhase, RunReason, run_transition
from nodus.resources import AgentRun, AgentRunSpec, ObjectMeta
from nodus_ray.control.new_runs import ChildOf
from nodus_ray.control.registry import Key, Registry, children_ended, is_terminal_run
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.control.runs import RunService
from nodus_ray.store import layout

__all__ = ["ChildService", "CHILD_CANCELLED_MESSAGE"]

logger = logging.getLogger(__name__)

CHILD_CANCELLED_MESSAGE = "its parent run was cancelled"
_MAX_RUN_NAME = 63  # a run's name is a DNS label
_KEY = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def _check_key(parent: str, key: Any) -> str:
    if not isinstance(key, str) or not _KEY.match(key):
        raise Invalid(
            f"key: {str(key)[:80]!r} is not a child key (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit)",
            details={"field": "key", "key": str(key)[:80]},
        )
    name = f"{parent}-{key}"
    if len(name) > _MAX_RUN_NAME:
        raise Invalid(
            f"key: the child run's name {name!r} is {len(name)} characters; a run's name is at "
            f"most {_MAX_RUN_NAME} (use a shorter key, at most {_MAX_RUN_NAME - len(parent) - 1} here)",
            details={"field": "key", "key": key},
        )
    return name


def _check_cap(cap_usd: Any) -> str | None:
    if cap_usd is None:
        return None
    try:
        value = Decimal(str(cap_usd))
        if not value.is_finite() or value < 0:
            raise InvalidOperation
    except InvalidOperation:
        raise Invalid(
            f"capUSD: {str(cap_usd)[:40]!r} is not an amount of dollars", details={"field": "capUSD"}
        ) from None
    return str(value)


class ChildService:
    """Spawning children, reporting on them, and the tree's wake-ups and cancels."""

    def __init__(self, registry: Registry, runs: RunService, supervisor: RunSupervisor) -> None:
        self._registry = registry
        self._runs = runs
        self._supervisor = supervisor
        self._cancelling: set[asyncio.Task[None]] = set()
        registry.on_run_changed(self._run_changed)
        runs.connect(self.cancel_children)

    async def spawn_child(
        self,
        project: str,
        parent: str,
        key: str,
        input_text: str,
        deadline: str | None = None,
        cap_usd: str | None = None,
    ) -> dict[str, Any]:
        """Create child run ``<parent>-<key>`` once; the same key again answers it (same input)."""
        parent_run = self._registry.run(project, parent)
        name = _check_key(parent, key)
        cap = _check_cap(cap_usd)
        async with self._registry.locks[("child", project, name)]:
            existing = self._registry.runs.get((project, name))
            if existing is not None:
                return self._existing(existing, parent, key, input_text)
            phase = parent_run["status"]["phase"]
            if phase in RUN_TERMINAL_PHASES:
                raise Conflict(
                    f"agentrun {parent!r} has finished ({phase}) and starts no children",
                    code="AgentRunFinished",
                    details={"kind": "AgentRun", "name": parent, "phase": phase},
                )
            pinned = await asyncio.to_thread(
                self._registry.storage.read_json, layout.run_agent(project, parent)
            )
            try:
                spec = AgentRunSpec(agent=parent_run["spec"]["agent"], input=input_text, deadline=deadline)
            except ValueError as error:
                field = "deadline" if "deadline" in str(error) else "input"
                raise Invalid(f"{field}: {error}", details={"field": field}) from None
            run = AgentRun(metadata=ObjectMeta(name=name), spec=spec)
            child_of = ChildOf(parent, cap, parent_run["status"].get("deadlineAt"))
            await self._runs.create_child(project, run, pinned, child_of)
        if parent_run["status"]["phase"] == RunPhase.CANCELLED:  # cancelled while the child was written
            await self._supervisor.cancel((project, name), RunReason.CANCELLED.value, CHILD_CANCELLED_MESSAGE)
        return {"name": name}

    def _existing(self, run: dict[str, Any], parent: str, key: str, input_text: str) -> dict[str, Any]:
        name = run["metadata"]["name"]
        if run["status"].get("parent") != parent:
            raise Conflict(
                f"agentrun {name!r} exists and is not a child of {parent!r}; use another key",
                code="AlreadyExists",
                details={"kind": "AgentRun", "name": name, "field": "key", "key": key},
            )
        if run["spec"].get("input", "") != input_text:
            raise Conflict(
                f"child key {key!r} of agentrun {parent!r} was used for another input (child run "
                f"{name!r}); a key names one child: use a new key for new work",
                code="ChildKeyReused",
                details={"field": "key", "key": key},
            )
        return {"name": name}

    async def children_status(self, project: str, parent: str, names: list[str]) -> list[dict[str, Any]]:
        """Each named child's phase, reason, message and cost, in order (a deleted one: Cancelled)."""
        self._registry.run(project, parent)
        answer = []
        for name in names:
            run = self._registry.runs.get((project, str(name)))
            if run is None:
                answer.append(
                    {
                        "name": name,
                        "phase": RunPhase.CANCELLED.value,
                        "reason": "NotFound",
                        "message": f"agentrun {name!r} was deleted",
                        "costUSD": "0",
                    }
                )
                continue
            status = run["status"]
            answer.append(
                {
                    "name": name,
                    "phase": str(status["phase"]),
                    "reason": status.get("reason"),
                    "message": status.get("message"),
                    "costUSD": str(status["cost"].get("totalUSD") or "0"),
                }
            )
        return answer

    def children_of(self, project: str, parent: str) -> list[Key]:
        return [
            key
            for key, run in self._registry.runs.items()
            if key[0] == project and run["status"].get("parent") == parent
        ]

    async def cancel_children(self, project: str, parent: str) -> None:
        """Cancel the parent's unfinished children (each cancel cancels its own children in turn)."""
        for key in self.children_of(project, parent):
            if not self._registry.is_over(key):
                await self._supervisor.cancel(key, RunReason.CANCELLED.value, CHILD_CANCELLED_MESSAGE)

    async def _run_changed(self, key: Key) -> None:
        """A child that ended may wake its parent; a parent cancelled cancels its children.

        Cancels go in tasks of their own: the listener runs inside whoever cancelled the parent,
        which must not wait for every actor of the tree to stop.
        """
        run = self._registry.runs.get(key)
        if run is None:
            return
        project, name = key
        if run["status"]["phase"] == RunPhase.CANCELLED and self.children_of(project, name):
            task = asyncio.get_running_loop().create_task(self.cancel_children(project, name))
            self._cancelling.add(task)
            task.add_done_callback(self._cancelling.discard)
        parent = run["status"].get("parent")
        if parent and is_terminal_run(run):
            await self._wake_parent((project, parent))

    async def _wake_parent(self, key: Key, *, child_ended: bool = True) -> None:
        """Start the parent again when it waits for its children and they have all ended (a
        parent that named none is woken by any child's end, and replays to see which)."""
        registry = self._registry
        async with registry.locks[key]:
            parent = registry.runs.get(key)
            if parent is None:
                return
            status = parent["status"]
            if (status["phase"], status.get("reason")) != (RunPhase.WAITING, RunReason.AWAITING_CHILDREN):
                return
            awaited = [str(name) for name in (status.get("waitingFor") or {}).get("children") or []]
            if not (awaited or child_ended) or not children_ended(registry.runs, key[0], awaited):
                return  # one ended; the others still run
            status.update(run_transition(status, RunPhase.RUNNING, None, "its children ended"))
            await registry.persist_run(key)
        await registry.run_changed(key)
        self._supervisor.supervise(key)

    async def recover(self) -> None:
        """After a (re)start: a parent whose last child ended just before the control plane
        stopped (the child's end written, the parent's wake-up not) is woken now."""
        for key, run in list(self._registry.runs.items()):
            status = run["status"]
            if (status["phase"], status.get("reason")) == (RunPhase.WAITING, RunReason.AWAITING_CHILDREN):
                await self._wake_parent(key, child_ended=False)

    async def settled(self) -> None:
        """Wait for the cancels under way (tests, and an orderly shutdown)."""
        while self._cancelling:
            await asyncio.gather(*list(self._cancelling), return_exceptions=True)
