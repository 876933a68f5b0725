"""Pre-started run actors, so that an admitted run does not wait for a new process.

A new Ray actor costs a fresh worker process here (about 0.65 s, plus about 0.35 s importing
the engine). The pool keeps a few run actors per node whose process has started and whose
modules are imported, each parked inside its own ``__init__``: it asks the control plane
(`ControlPlane.claim_slot`) for the run it is to serve and blocks until it gets one.

Parking in ``__init__`` is deliberate. Ray records an actor's ``__repr__`` (what the
dashboard's Actors view shows) once, when ``__init__`` returns; an actor that had finished
``__init__`` idle would show "idle" forever. A parked slot returns from ``__init__`` only with
its run, so the dashboard shows ``RunActor(run=..., group=..., agent=...)`` like any other run
actor. Each slot serves exactly one run and is never returned to the pool.

A slot is named ``runslot.<node>.<id>`` (names cannot change once given); the run records that
name in ``status.actorName``, which is how the control plane finds the actor again after its
own restart. A slot whose control plane goes away fails its ``__init__`` and ends; the next
control plane fills a new pool.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .run_actor import RemoteRunActor, RunConfig
from .settings import NAMESPACE

__all__ = ["RunActorPool", "Slot"]

logger = logging.getLogger(__name__)


@dataclass
class Slot:
    """One parked run actor: its name, its handle, and the node it was placed on."""

    name: str
    node: str
    handle: Any
    waiter: asyncio.Future[RunConfig | None] | None = field(default=None, repr=False)


class RunActorPool:
    """Keeps ``per_node`` parked run actors on every alive node; hands them out one run each."""

    def __init__(self, per_node: int) -> None:
        self.per_node = per_node
        self._slots: dict[str, Slot] = {}  # created and not yet handed out

    def __len__(self) -> int:
        return sum(1 for slot in self._slots.values() if self._ready(slot))

    @staticmethod
    def _ready(slot: Slot) -> bool:
        return slot.waiter is not None and not slot.waiter.done()

    def fill(self) -> None:
        """Start slots where a node has fewer than ``per_node`` (ready or still starting)."""
        if self.per_node <= 0:
            return
        try:
            nodes = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
        except Exception:  # noqa: BLE001 - without a node list there is nothing to fill now
            logger.warning("could not list Ray nodes; the run pool is not refilled", exc_info=True)
            return
        for slot_name in [name for name, slot in self._slots.items() if slot.node not in nodes]:
            self._slots.pop(slot_name, None)  # its node is gone, and the slot with it
        for node in nodes:
            have = sum(1 for slot in self._slots.values() if slot.node == node)
            for _ in range(self.per_node - have):
                name = f"runslot.{node[:8]}.{uuid.uuid4().hex[:12]}"
                handle = RemoteRunActor.options(
                    name=name,
                    namespace=NAMESPACE,
                    lifetime="detached",
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=True),
                ).remote(name)
                self._slots[name] = Slot(name=name, node=node, handle=handle)

    async def claim(self, name: str) -> RunConfig | None:
        """A slot's ``__init__`` waits here for its run; None tells an unknown slot to end."""
        slot = self._slots.get(name)
        if slot is None or slot.waiter is not None:
            return None
        slot.waiter = asyncio.get_running_loop().create_future()
        try:
            return await slot.waiter
        finally:
            if self._slots.get(name) is slot and not self._handed_out(slot):
                self._slots.pop(name, None)  # the slot's call ended without a run: it is gone

    @staticmethod
    def _handed_out(slot: Slot) -> bool:
        return slot.waiter is not None and slot.waiter.done() and not slot.waiter.cancelled()

    def take(self) -> Slot | None:
        """A parked slot, taken out of the pool (the caller must `assign` or `discard` it)."""
        for name, slot in list(self._slots.items()):
            if self._ready(slot):
                del self._slots[name]
                return slot
        return None

    @staticmethod
    def assign(slot: Slot, config: RunConfig) -> bool:
        """Wake the slot with its run; False when the slot died in the meantime."""
        if slot.waiter is None or slot.waiter.done():
            return False
        slot.waiter.set_result(config)
        return True

    @staticmethod
    def discard(slot: Slot) -> None:
        if slot.waiter is not None and not slot.waiter.done():
            slot.waiter.set_result(None)
        ray.kill(slot.handle, no_restart=True)
