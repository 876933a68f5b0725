"""Pre-started run actors kept for one Agent: its ``spec.minWorkers`` and ``spec.scaledownWindow``.

The run pool (`run_pool`) keeps ``NODUS_RUN_POOL`` generic parked run actors per node for any
run. An Agent with ``minWorkers`` also gets that many of its own, parked the same way and
spread over the nodes: its runs take those first (then generic ones), so its first runs never
wait for a process start even while other agents' runs drain the generic pool, and the pool
starts a replacement as soon as one is taken.

A reserved actor beyond what its Agent needs (``minWorkers`` lowered, the Agent stopped or
deleted) is retired once it has stayed idle for the Agent's ``scaledownWindow``; without one
(or once the Agent is gone) at the pool's next check. Generic actors keep the pool's behaviour.

`plan` is pure (what to start, what to retire), so it is tested without Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nodus.durations import parse_duration

__all__ = ["Reservation", "reservations", "plan"]

AgentKey = tuple[str, str]  # (project, agent)


@dataclass(frozen=True)
class Reservation:
    """How many parked actors an Agent keeps (``minimum``), and how long one beyond that stays
    idle (``window`` seconds; None: it retires at the next check)."""

    minimum: int
    window: float | None = None


class SlotLike(Protocol):
    name: str
    node: str
    agent: AgentKey | None
    idle_since: float


def reservations(agents: Mapping[AgentKey, Mapping[str, Any]]) -> dict[AgentKey, Reservation]:
    """The reservations of the Agents that set ``minWorkers`` or ``scaledownWindow``; a Stopped
    Agent keeps none (it takes no runs), though its window still applies to what it had."""
    wanted: dict[AgentKey, Reservation] = {}
    for key, agent in agents.items():
        spec = agent.get("spec") or {}
        minimum = int(spec.get("minWorkers") or 0) if spec.get("state") != "Stopped" else 0
        window_text = spec.get("scaledownWindow")
        window = parse_duration(str(window_text)).total_seconds() if window_text else None
        if minimum or window is not None:
            wanted[key] = Reservation(minimum, window)
    return wanted


def plan(
    slots: Iterable[SlotLike],
    nodes: list[str],
    wanted: Mapping[AgentKey, Reservation],
    now: float,
    ready: Callable[[Any], bool],
) -> tuple[list[tuple[str, AgentKey]], list[str]]:
    """The reserved actors to start, as ``(node, agent)``, and the names of those to retire.

    Starting ones count as had (no second start while one is on its way); only a ready one
    (parked, idle) retires, the longest idle first.
    """
    by_agent: dict[AgentKey, list[SlotLike]] = {}
    for slot in slots:
        if slot.agent is not None:
            by_agent.setdefault(slot.agent, []).append(slot)
    start: list[tuple[str, AgentKey]] = []
    if nodes:
        for agent, reservation in wanted.items():
            per_node = {node: 0 for node in nodes}
            for slot in by_agent.get(agent, []):
                if slot.node in per_node:
                    per_node[slot.node] += 1
            for _ in range(reservation.minimum - len(by_agent.get(agent, []))):
                node = min(nodes, key=lambda n: per_node[n])  # spread over the nodes
                per_node[node] += 1
                start.append((node, agent))
    retire: list[str] = []
    for agent, have in by_agent.items():
        kept = wanted.get(agent)
        excess = len(have) - (kept.minimum if kept is not None else 0)
        if excess <= 0:
            continue
        window = kept.window if kept is not None and kept.window is not None else 0.0
        idle = sorted((slot for slot in have if ready(slot)), key=lambda slot: slot.idle_since)
        retire += [slot.name for slot in idle[:excess] if now - slot.idle_since >= window]
    return start, retire
