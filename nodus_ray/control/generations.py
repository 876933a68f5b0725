"""A Python run's journal generations: ``ctx.continue_as_new(input)`` in the control plane.

A long-lived program (a chat that reads messages for weeks) would replay an ever longer
journal; ``continue_as_new`` ends the program's current generation with a new input and starts
it again on an empty journal, so its history stays bounded. Generation 0 is the run's journal
(`layout.journal_folder`); generation n >= 1 lives in `layout.journal_generation_folder` and
starts with what `layout.run_generation` holds (its input, its journal's first seq, which
continues the previous generation's seqs, and the last message seq of each name the program
took, so a message is read once over the whole run). ``status.generation`` names the current one, and
``status.cost.priorUSD`` is what the earlier ones cost (the run's cap covers the whole run);
``status.cost.priorSandboxUSD`` their sandbox charges (`money.sandbox_billing`).

The switch, under the run's lock, in an order a crash cannot break:

1. the run actor journals the request (``continue-as-new``, with the new input) as its
   generation's last record, then calls `GenerationService.continue_as_new`;
2. the plane writes generation n+1's record (input, first seq), then ``status.generation =
   n+1`` with the older generations' cost: from here on every actor runs generation n+1;
3. only then are the older generations' journals deleted (again by the next actor of the run,
   if the plane stopped before).

A crash before 2 leaves generation n, whose replay reaches its recorded request and asks again
(the same input: the journal's); a crash after 2 starts generation n+1 with its recorded input.
The same request again (a lost answer) is answered with the switch it made; an older actor's
(a zombie's) and one for another generation are refused. Fencing epochs stay per run.
"""

from __future__ import annotations

import asyncio
import logging
from decimal import Decimal
from typing import Any

from nodus.errors import Conflict, NotFound
from nodus.lifecycle import RUN_TERMINAL_PHASES
from nodus_ray.control.registry import Key, Registry
from nodus_ray.durable.journal import Journal
from nodus_ray.money.sandbox_billing import cost_fields, journaled_sandbox_cost
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

__all__ = [
    "GenerationService",
    "generation_of",
    "prior_cost",
    "prior_sandbox_cost",
    "run_journal",
    "journaled_cost",
    "journaled_costs",
    "read_generation",
    "starting_generation",
    "delete_older_generations",
]

logger = logging.getLogger(__name__)


def generation_of(status: dict[str, Any]) -> int:
    """The run's current journal generation (0 until its program continues as new)."""
    return int(status.get("generation") or 0)


def prior_cost(status: dict[str, Any]) -> Decimal:
    """What the run's earlier generations cost (their journals may be gone)."""
    return Decimal(str((status.get("cost") or {}).get("priorUSD") or "0"))


def prior_sandbox_cost(status: dict[str, Any]) -> Decimal:
    """What the run's earlier generations' sandbox charges came to."""
    return Decimal(str((status.get("cost") or {}).get("priorSandboxUSD") or "0"))


def run_journal(storage: Storage, key: Key, status: dict[str, Any]) -> Journal:
    """A reader of the run's current generation's journal (``steps``, events, resolve, retry)."""
    return Journal(storage, layout.journal_generation_folder(*key, generation_of(status)))


def _generation_cost(records: list[Any]) -> Decimal:
    return sum((Decimal(record.cost_usd) for record in records if record.state == "Completed"), Decimal(0))


def journaled_cost(storage: Storage, key: Key, status: dict[str, Any]) -> Decimal:
    """What the run cost by its journals: the earlier generations' and its current one's."""
    return prior_cost(status) + _generation_cost(run_journal(storage, key, status).load())


def journaled_costs(storage: Storage, key: Key, status: dict[str, Any]) -> dict[str, str]:
    """The run's ``status.cost`` figures by its journals (`sandbox_billing.cost_fields`): the
    model spend as `journaled_cost` sums it, and the sandbox charges its steps recorded."""
    records = run_journal(storage, key, status).load()
    model = prior_cost(status) + _generation_cost(records)
    sandbox = prior_sandbox_cost(status) + journaled_sandbox_cost(records)
    return cost_fields(model, sandbox)


def read_generation(storage: Storage, project: str, name: str, generation: int) -> dict[str, Any] | None:
    """Generation ``generation``'s record (``{"input", "firstSeq", ...}``); None for 0."""
    if generation <= 0:
        return None
    record: dict[str, Any] = storage.read_json(layout.run_generation(project, name, generation))
    return record


def starting_generation(storage: Storage, project: str, name: str, generation: int) -> dict[str, Any] | None:
    """`read_generation`, for a new actor of the run: what a switch that stopped before its
    deletes left of the older generations goes first (best effort)."""
    if generation > 0:
        try:
            delete_older_generations(storage, project, name, generation)
        except Exception:  # noqa: BLE001 - the next actor, or the next switch, tries again
            logger.warning("run %s/%s: could not delete its older journals", project, name, exc_info=True)
    return read_generation(storage, project, name, generation)


def delete_older_generations(storage: Storage, project: str, name: str, generation: int) -> None:
    """Delete the journals (and records) of the generations before ``generation``: a run's
    history stays bounded. Safe from anyone at any time once ``status.generation`` says
    ``generation``: generations only increase, and nothing reads an older one."""
    for older in range(generation - 1, -1, -1):
        folder = layout.journal_generation_folder(project, name, older)
        if not storage.list_dir(folder):
            if older < generation - 1:
                break  # deleted before, with everything older
            continue
        storage.delete_tree(folder)
        if older > 0:
            storage.delete(layout.run_generation(project, name, older))


class GenerationService:
    """Switches a run to its next journal generation (see the module docstring)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    async def continue_as_new(
        self,
        project: str,
        name: str,
        attempt: int,
        generation: int,
        input_text: str,
        read: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """End ``generation`` of the run with ``input_text`` as the next one's input.

        Returns ``{"generation", "firstSeq", "priorUSD"}`` of the new generation. ``attempt``
        is the asking actor's: an older one than the run's (a zombie) is refused. ``read`` is
        the last message seq of each name the program took, kept with the new generation.
        """
        key = (project, name)
        storage = self._registry.storage
        async with self._registry.locks[key]:
            run = self._registry.runs.get(key)
            if run is None:
                raise NotFound(f"agentrun {name!r} not found", details={"kind": "AgentRun", "name": name})
            status = run["status"]
            if status["phase"] in RUN_TERMINAL_PHASES:
                raise Conflict(
                    f"agentrun {name!r} is {status['phase']}: it cannot continue as new",
                    code="RunFinished",
                    details={"kind": "AgentRun", "name": name},
                )
            if int(status.get("attempts") or 0) > attempt:
                raise Conflict(
                    f"attempt {attempt} of agentrun {name!r} is no longer its actor",
                    code="StaleAttempt",
                    details={"kind": "AgentRun", "name": name, "field": "attempt"},
                )
            current = generation_of(status)
            if current == generation + 1:  # asked again (its answer was lost): the switch it made
                record = await asyncio.to_thread(read_generation, storage, project, name, current)
                if record is not None and record.get("input") == input_text:
                    return _answer(current, record, status)
            if current != generation:
                raise Conflict(
                    f"agentrun {name!r} is at generation {current}, not {generation}",
                    code="GenerationMismatch",
                    details={"kind": "AgentRun", "name": name, "field": "generation", "current": current},
                )
            records = await asyncio.to_thread(run_journal(storage, key, status).load)
            first_seq = records[-1].seq + 1 if records else 0
            prior = prior_cost(status) + _generation_cost(records)
            prior_sandbox = prior_sandbox_cost(status) + journaled_sandbox_cost(records)
            record = {
                "input": input_text,
                "firstSeq": first_seq,
                "read": {str(k): int(v) for k, v in (read or {}).items()},
                "from": {"generation": current, "attempt": attempt},
            }
            # The new input first: once the status names the generation, its input must be there.
            await asyncio.to_thread(
                storage.write_json, layout.run_generation(project, name, current + 1), record
            )
            status["generation"] = current + 1
            cost = status.setdefault("cost", {})
            cost["priorUSD"] = str(prior)
            cost["priorSandboxUSD"] = str(prior_sandbox)
            if Decimal(str(cost.get("totalUSD") or "0")) < prior:
                cost["totalUSD"] = str(prior)
            if Decimal(str(cost.get("sandboxUSD") or "0")) < prior_sandbox:
                cost["sandboxUSD"] = str(prior_sandbox)
            model = Decimal(str(cost.get("totalUSD") or "0"))
            cost["modelUSD"] = str(model)
            cost["billedUSD"] = str(model + Decimal(str(cost.get("sandboxUSD") or "0")))
            await self._registry.persist_run(key)
            answer = _answer(current + 1, record, status)
        try:  # the switch is durable: the old journal can go (the next actor retries if not)
            await asyncio.to_thread(delete_older_generations, storage, project, name, current + 1)
        except Exception:  # noqa: BLE001 - left for the next actor of the run to delete
            logger.warning("run %s/%s: could not delete its older journals", project, name, exc_info=True)
        await self._registry.run_changed(key)
        return answer


def _answer(generation: int, record: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {
        "generation": generation,
        "firstSeq": int(record.get("firstSeq") or 0),
        "priorUSD": str(prior_cost(status)),
        "priorSandboxUSD": str(prior_sandbox_cost(status)),
    }
