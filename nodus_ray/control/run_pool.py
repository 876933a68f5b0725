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
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nodus_ray.control.agent_slots import Reservation, plan, reservations
from nodus_ray.runtime.run_actor import RemoteRunActor, RunConfig
from nodus_ray.settings import NAMESPACE

if TYPE_CHECKING:
    from nodus_ray.control.agents import AgentService
    from nodus_ray.control.registry import Registry
    from nodus_ray.control.secrets import SecretStore

__all__ = ["RunActorPool", "RunPoolService", "Slot"]

logger = logging.getLogger(__name__)

_NODES_TTL = 10.0
_REFILL_DELAY = 0.25
_POOL_CHECK_SECONDS = 10.0  # how soon a node that joined gets parked run actors


@dataclass
class Slot:
    """One parked run actor: its name, its handle, the node it was placed on, and the Agent it
    is kept for (`agent_slots`; None: any run's)."""

    name: str
    node: str
    handle: Any
    waiter: asyncio.Future[RunConfig | None] | None = field(default=None, repr=False)
    agent: tuple[str, str] | None = None
    idle_since: float = field(default_factory=time.monotonic)


class RunActorPool:
    """Keeps ``per_node`` parked run actors on every alive node; hands them out one run each."""

    def __init__(self, per_node: int) -> None:
        self.per_node = per_node
        self._slots: dict[str, Slot] = {}  # created and not yet handed out
        self._nodes: tuple[float, list[str]] | None = None
        self._filling = False
        self._last_node: str | None = None  # where the last slot taken was (`take` spreads runs)
        # Whether parked actors import the Anthropic SDK ahead (about 1 s of CPU each): only
        # when runs may use it (the server has a key, or an agent brings its own).
        self.warm_anthropic = False
        # Parked actors kept for one Agent each (spec.minWorkers, spec.scaledownWindow).
        self.reservations: dict[tuple[str, str], Reservation] = {}

    def __len__(self) -> int:
        return sum(1 for slot in self._slots.values() if self._ready(slot))

    def _alive_nodes(self) -> list[str]:
        """Alive node ids, asked of Ray's GCS at most every ``_NODES_TTL`` seconds."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > _NODES_TTL:
            self._nodes = (now, [node["NodeID"] for node in ray.nodes() if node.get("Alive")])  # type: ignore[no-untyped-call]
        return self._nodes[1]

    @staticmethod
    def _ready(slot: Slot) -> bool:
        return slot.handle is not None and slot.waiter is not None and not slot.waiter.done()

    def fill(self) -> None:
        """Start slots where a node has fewer than ``per_node`` (ready or still starting).

        Creating a named actor is a synchronous round trip to Ray's GCS, so the creations run
        in a thread, and a moment later than asked: a refill must not hold up the control
        plane's event loop, nor compete with the first steps of the run that just took a slot.
        """
        if (self.per_node <= 0 and not self.reservations and not self._reserved()) or self._filling:
            return
        self._filling = True
        loop = asyncio.get_running_loop()
        loop.call_later(_REFILL_DELAY, lambda: loop.create_task(self._refill()))

    async def _refill(self) -> None:
        try:
            nodes = await asyncio.to_thread(self._alive_nodes)
            for slot_name in [name for name, slot in self._slots.items() if slot.node not in nodes]:
                self._slots.pop(slot_name, None)  # its node is gone, and the slot with it
            wanted: list[Slot] = []
            for node in nodes:
                have = sum(1 for slot in self._slots.values() if slot.node == node and slot.agent is None)
                for _ in range(self.per_node - have):
                    slot = Slot(name=f"runslot.{node[:8]}.{uuid.uuid4().hex[:12]}", node=node, handle=None)
                    self._slots[slot.name] = slot  # known before it exists: its claim may come first
                    wanted.append(slot)
            start, retire = plan(
                self._slots.values(), nodes, self.reservations, time.monotonic(), self._ready
            )
            for node, agent in start:
                slot = Slot(f"runslot.{node[:8]}.{uuid.uuid4().hex[:12]}", node, None, agent=agent)
                self._slots[slot.name] = slot
                wanted.append(slot)
            for slot_name in retire:  # idle for its Agent's scaledownWindow, and not needed
                self.discard(self._slots.pop(slot_name))
            if wanted:
                await asyncio.to_thread(self._create, wanted, self.warm_anthropic)
        except Exception:  # noqa: BLE001 - a failed refill leaves fewer slots; runs start fresh actors
            logger.warning("could not refill the run pool", exc_info=True)
        finally:
            self._filling = False

    @staticmethod
    def _create(slots: list[Slot], warm_anthropic: bool) -> None:
        for slot in slots:
            slot.handle = RemoteRunActor.options(
                name=slot.name,
                namespace=NAMESPACE,
                lifetime="detached",
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=slot.node, soft=True),
            ).remote(slot.name, warm_anthropic=warm_anthropic)

    async def claim(self, name: str) -> RunConfig | None:
        """A slot's ``__init__`` waits here for its run; None tells an unknown slot to end."""
        slot = self._slots.get(name)
        if slot is None or slot.waiter is not None:
            return None
        slot.waiter = asyncio.get_running_loop().create_future()
        slot.idle_since = time.monotonic()
        try:
            return await slot.waiter
        finally:
            if self._slots.get(name) is slot and not self._handed_out(slot):
                self._slots.pop(name, None)  # the slot's call ended without a run: it is gone

    @staticmethod
    def _handed_out(slot: Slot) -> bool:
        return slot.waiter is not None and slot.waiter.done() and not slot.waiter.cancelled()

    def _reserved(self) -> bool:
        return any(slot.agent is not None for slot in self._slots.values())

    def take(self, agent: tuple[str, str] | None = None) -> Slot | None:
        """A parked slot, taken out of the pool (the caller must `assign` or `discard` it).

        One kept for the run's ``agent`` first (`agent_slots`); else a generic one, from the node
        with the most parked slots, and of equals not the node of the last one taken: runs
        spread over the cluster's nodes instead of filling the first one listed.
        """
        for name, slot in self._slots.items():
            if agent is not None and slot.agent == agent and self._ready(slot):
                return self._slots.pop(name)
        ready: dict[str, list[str]] = {}
        for name, slot in self._slots.items():
            if self._ready(slot) and slot.agent is None:
                ready.setdefault(slot.node, []).append(name)
        if not ready:
            return None
        most = max(len(names) for names in ready.values())
        nodes = [node for node, names in ready.items() if len(names) == most]
        node = next((n for n in nodes if n != self._last_node), nodes[0])
        self._last_node = node
        return self._slots.pop(ready[node][0])

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


class RunPoolService:
    """The pool as the control plane runs it: filled at start, topped up as nodes join.

    Parked actors import the Anthropic SDK ahead only when runs may use it: the server has a
    key of its own, or an agent brings one (BYOK).
    """

    def __init__(
        self, pool: RunActorPool, secrets: SecretStore, agents: AgentService, registry: Registry | None = None
    ) -> None:
        self.pool = pool
        self._secrets = secrets
        self._agents = agents
        self._registry = registry  # whose Agents' spec.minWorkers the pool keeps actors for

    async def refill(self) -> None:
        server_key = await asyncio.to_thread(self._secrets.server_key)
        self.pool.warm_anthropic = self._agents.uses_byok() or bool(server_key)
        if self._registry is not None:
            self.pool.reservations = reservations(self._registry.agents)
        self.pool.fill()

    async def keep_filled(self) -> None:
        """Nodes join and leave: every few seconds a node short of parked run actors gets them."""
        while True:
            await asyncio.sleep(_POOL_CHECK_SECONDS)
            try:
                await self.refill()
            except Exception:  # noqa: BLE001 - the next round tries again
                logger.warning("could not check the run pool", exc_info=True)

    async def claim_slot(self, slot: str) -> RunConfig | None:
        """A pre-started run actor waits here (inside its ``__init__``) for the run it will serve."""
        return await self.pool.claim(slot)
