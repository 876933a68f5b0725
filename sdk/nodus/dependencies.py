"""Task dependencies as a graph: a stable order, and the first cycle, named.

One helper for both sides of a group's ``dependsOn``: the SDK orders a ``submit_many`` batch
and refuses a cycle before sending anything, and the engine's admission core
(:mod:`nodus_ray.core.admission`) refuses a cycle and orders members after a restart. Both must
name the same cycle for the same tasks, so they share this code.

Tasks are given as two parallel sequences, ``keys[i]`` and ``depends_on[i]`` (task keys), and
are referred to by index. A dependency on a key that is not among ``keys`` is ignored here:
whether it exists elsewhere (earlier in the group) is the caller's question. Keys are assumed
unique; callers refuse repeats first, with their own messages.

Standard library only (no Ray, no engine): the SDK imports this, and so may the engine.
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Cycle", "DependencyCycle", "find_cycle", "dependency_order"]


@dataclass(frozen=True)
class Cycle:
    """A dependency cycle: where it closes, and the keys along it (the first key repeated last).

    ``index`` is the task whose ``depends_on`` closes the cycle and ``position`` the entry in it
    that does, so a refusal can point at the offending field (``dependsOn[position]`` of task
    ``index``).
    """

    index: int
    position: int
    keys: tuple[str, ...]

    def __str__(self) -> str:
        return " -> ".join(self.keys)

    @property
    def message(self) -> str:
        """The refusal's words, the same in the SDK and the API: ``dependency cycle: a -> b -> a``."""
        return f"dependency cycle: {self}"


class DependencyCycle(ValueError):
    """Raised by :func:`dependency_order` when the tasks form a cycle; ``cycle`` says which."""

    def __init__(self, cycle: Cycle) -> None:
        super().__init__(cycle.message)
        self.cycle = cycle


def _edges(keys: Sequence[str], depends_on: Sequence[Sequence[str]]) -> list[list[tuple[int, int]]]:
    """For each task, ``(position in its depends_on, index of the task it names)``, known keys only."""
    if len(keys) != len(depends_on):
        raise ValueError(f"{len(keys)} keys but {len(depends_on)} dependency lists")
    index_of = {key: index for index, key in enumerate(keys)}
    return [
        [(position, index_of[key]) for position, key in enumerate(deps) if key in index_of]
        for deps in depends_on
    ]


def find_cycle(keys: Sequence[str], depends_on: Sequence[Sequence[str]]) -> Cycle | None:
    """The first dependency cycle, or None; deterministic for the same input.

    A depth-first search from each task in order, following each task's dependencies in the
    order it lists them: the first edge that leads back onto the current path closes the cycle.
    A task that lists itself is a cycle of one (``a -> a``).
    """
    edges = _edges(keys, depends_on)
    colour = [0] * len(keys)  # 0 unseen, 1 on the current path, 2 done
    for root in range(len(keys)):
        if colour[root]:
            continue
        path: list[int] = [root]
        next_edge: list[int] = [0]
        colour[root] = 1
        while path:
            node = path[-1]
            if next_edge[-1] >= len(edges[node]):
                colour[node] = 2
                path.pop()
                next_edge.pop()
                continue
            position, target = edges[node][next_edge[-1]]
            next_edge[-1] += 1
            if colour[target] == 2:
                continue
            if colour[target] == 1:
                loop = path[path.index(target) :]
                return Cycle(node, position, tuple(keys[i] for i in loop) + (keys[target],))
            colour[target] = 1
            path.append(target)
            next_edge.append(0)
    return None


def dependency_order(keys: Sequence[str], depends_on: Sequence[Sequence[str]]) -> list[int]:
    """Task indexes with every task after the tasks it depends on, otherwise in the given order.

    Stable: among the tasks free to go, the earliest goes first, so an order that is already
    valid comes back unchanged. Raises :class:`DependencyCycle` (naming the cycle
    :func:`find_cycle` finds) when there is no such order.
    """
    cycle = find_cycle(keys, depends_on)
    if cycle is not None:
        raise DependencyCycle(cycle)
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for index, task_edges in enumerate(_edges(keys, depends_on)):
        sorter.add(index, *(target for _position, target in task_edges))
    sorter.prepare()
    # graphlib hands out every task that became ready at once; taking the smallest index of
    # those ready, one at a time, is what keeps the order stable.
    ready = list(sorter.get_ready())
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        sorter.done(index)
        for task in sorter.get_ready():
            heapq.heappush(ready, task)
    return order
