"""A turn of a run as its actor keeps it: the fields of ``status.turns[]``, as a dataclass.

The API's `nodus.schema_run.Turn` is the contract (a pydantic model); the run actor only fills
the fields in and reports them as a dict, so it keeps them in a plain dataclass: building a
pydantic model costs a run's fresh process the import and pydantic's first schema (about 50 ms a
run, issue 19). `tests/unit/test_turn_record.py` checks that both have the same fields and that
what the actor reports is a valid `Turn`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["TurnRecord"]


@dataclass
class TurnRecord:
    """One prompt of the conversation: who served it, how it was chosen, what it cost."""

    index: int
    prompt: str = ""
    family: str | None = None
    model: str | None = None
    routing: Literal["jev", "fallback", "pinned"] | None = None
    inputTokens: int = 0
    outputTokens: int = 0
    cacheCreationTokens: int = 0
    cacheReadTokens: int = 0
    toolCalls: int = 0
    costUSD: str = "0"
    # BYOK only (nothing is billed there): the turn's model calls at the price table's list
    # prices; None with ``unpricedModels`` when a model it called has no list price.
    listCostUSD: str | None = None
    unpricedModels: list[str] | None = None
    stopReason: str | None = None
    startedAt: str | None = None
    finishedAt: str | None = None

    def to_status(self) -> dict[str, Any]:
        """The turn as ``status.turns[]`` stores it."""
        return asdict(self)
