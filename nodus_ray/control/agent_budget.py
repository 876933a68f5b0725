"""An Agent's ``spec.maxCostUSD``: what all of its runs together may spend.

A new run's cap (``status.cost.limitUSD``) is the Agent's per-run cap, lowered to what the
Agent's cap has left: every other run of the Agent holds what it cost when it has finished, and
its own cap while it has not (it may still spend up to it). With nothing left the run is
refused (``Conflict`` ``MaxCostReached``, naming ``spec.maxCostUSD``) rather than created
with a cap of nothing. Runs being written (not yet in the registry) hold their cap here, so two
creates, or two runs of one batch, never both take the last of it.

A child run (``status.parent``) is carved out of its parent's cap (its program gives it at most
what the parent has left), so while its parent is unfinished it is inside the parent's hold and
is not counted again; a new child is not checked here either. Once the parent has finished, it
holds only its own cost and its children count for themselves.
"""

from __future__ import annotations

from decimal import Decimal

from nodus.errors import Conflict
from nodus.lifecycle import RUN_TERMINAL_PHASES
from nodus_ray.control.registry import Key, Registry, is_terminal_run

__all__ = ["AgentBudget"]


class AgentBudget:
    """The runs' caps within their Agent's ``maxCostUSD``."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._holding: dict[Key, tuple[str, Decimal]] = {}  # run -> (its agent, its cap)

    def limit(self, project: str, agent: str, run: str, limit: Decimal) -> Decimal:
        """The cap of new run ``run`` of ``agent`` (at most ``limit``); taken synchronously."""
        found = self._registry.agents.get((project, agent))
        max_cost = (found or {}).get("spec", {}).get("maxCostUSD")
        if max_cost is None:
            return limit
        left = Decimal(str(max_cost)) - self.held(project, agent)
        if left <= 0:
            raise Conflict(
                f"agent {agent!r} has no room for another run: its runs hold or have spent all "
                f"of its spec.maxCostUSD ({max_cost}); raise it, or wait for its runs to end",
                code="MaxCostReached",
                details={"kind": "Agent", "name": agent, "field": "spec.maxCostUSD"},
            )
        limit = min(limit, left)
        self._holding[(project, run)] = (agent, limit)
        return limit

    def held(self, project: str, agent: str) -> Decimal:
        """What the Agent's runs hold: finished ones their cost, unfinished ones their cap."""
        held = sum(
            (hold for (p, _), (name, hold) in self._holding.items() if p == project and name == agent),
            Decimal(0),
        )
        runs = self._registry.runs
        for (p, _), other in runs.items():
            if p != project or other["spec"]["agent"] != agent:
                continue
            parent = other["status"].get("parent")
            if parent and not is_terminal_run(runs.get((p, parent))):
                continue  # inside its unfinished parent's hold
            cost = other["status"]["cost"]
            unfinished = other["status"]["phase"] not in RUN_TERMINAL_PHASES and cost.get("limitUSD")
            held += Decimal(cost["limitUSD"] if unfinished else cost.get("totalUSD") or "0")
        return held

    def written(self, key: Key) -> None:
        """The run is in the registry now (or was not written): it holds as a run from here."""
        self._holding.pop(key, None)
