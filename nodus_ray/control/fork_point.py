"""Where a fork starts: the step a user names, the journal prefix it keeps, and its next input.

Pure (no storage, no Ray): given a run's journal records and ``--at``, `fork_point` decides what
a fork of the run copies (decision 58). ``--at`` names a step as ``nodus agentrun steps`` lists
it: its ID (``turn-1/command-1-2``) or its row number, counting from 1. The fork keeps every
step *before* that one and runs that step again: the step named is the first one the fork
does itself, as a Temporal reset re-runs the workflow task at its reset point and a LangGraph
fork from a checkpoint runs that checkpoint's ``next`` nodes.

That is a *step boundary* only when every step before it has ended (``Completed``, ``Resolved``
or ``Failed``) before it began: a step still going on there (a Python program's step around the
model calls it made, a command whose outcome is unknown) cannot be cut in two, and is refused.
Only records the journal holds count, and a record is in storage only once it is durable, so
forking a run that is still going on reads a consistent prefix.

The copied records cost the fork nothing: the model calls and commands they record were paid
by the original run and are not made again, so their billed figures (a record's ``cost_usd``,
a result's ``billedUSD`` and ``sandboxUSD``) are zero in the copy, and a project's credits, a
Budget and the fork's own cap count only what the fork does itself.

``--input`` replaces a user message, so it needs a point where one is read: a Claude run's
prompt (the first step, ``sandbox``, or ``turn-1/route``: the fork keeps no step, as a new
run with that prompt would start) or a
keep-alive run's message (``turn-K/message`` or ``turn-K/route``: the fork keeps turns before K
and reads the new input as turn K's message). A Python program reads its input once, at its
start: with ``--input`` it forks only at step 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from nodus.errors import Invalid
from nodus_ray.durable.journal import JournalRecord, step_views

__all__ = ["ForkPoint", "fork_point", "free_of_charge", "TERMINAL_STATES"]

TERMINAL_STATES = frozenset({"Completed", "Resolved", "Failed"})
_TURN_STEP = re.compile(r"^turn-(\d+)/(route|message)$")
_BILLED_KEYS = ("billedUSD", "sandboxUSD")


@dataclass(frozen=True)
class ForkPoint:
    """What a fork keeps: the records before ``boundary_seq`` (``records``, free of charge)."""

    step: str  # the step named: the first one the fork runs itself
    number: int  # its row in the steps listing, from 1
    boundary_seq: int  # the first seq the fork does not copy
    records: tuple[JournalRecord, ...]
    # With --input: "prompt" (spec.input is replaced) or "message" (the fork's inbox gets it
    # after the messages the prefix read); None without --input.
    replaces: str | None = None
    read_seq: int = 0  # the last inbox message the prefix read (0: none)


def _refuse(message: str, **details: Any) -> Invalid:
    return Invalid(message, details={"field": "at", **details})


def _named(views: list[dict[str, Any]], at: str) -> int:
    """The index in ``views`` of the step ``at`` names (its ID, or its row from 1)."""
    text = at.strip()
    count = len(views)
    listing = f"the run has {count} step{'s' * (count != 1)}" + (
        f" (1-{count}, or their IDs, as `nodus agentrun steps` lists them)" if count else ""
    )
    if text.isdigit():
        number = int(text)
        if 1 <= number <= count:
            return number - 1
        raise _refuse(f"at: step {number} does not exist: {listing}", steps=count)
    for index, view in enumerate(views):
        if view["id"] == text:
            return index
    raise _refuse(f"at: step {text!r} does not exist: {listing}", steps=count)


def _check_boundary(views: list[dict[str, Any]], index: int, records: list[JournalRecord]) -> None:
    """Every step before ``views[index]`` ended before it began (see the module)."""
    boundary = int(views[index]["seq"])
    before = {str(view["id"]) for view in views[:index]}
    last: dict[str, JournalRecord] = {}
    for record in records:
        if record.seq < boundary:
            last[record.step_id] = record
        elif record.step_id in before:
            raise _refuse(
                f"at: step {index + 1} ({views[index]['id']}) is not a step boundary: step "
                f"{record.step_id} began before it and ended after it began",
                step=views[index]["id"],
            )
    for view in views[:index]:
        ended = last.get(str(view["id"]))
        if ended is None or ended.state not in TERMINAL_STATES:
            state = ended.state if ended is not None else "not started"
            raise _refuse(
                f"at: step {index + 1} ({views[index]['id']}) is not a step boundary: step "
                f"{view['id']} before it has not ended there ({state})",
                step=views[index]["id"],
            )


def _read_seq(records: list[JournalRecord], boundary: int) -> int:
    """The last inbox message read before ``boundary`` (its seq in the run's inbox)."""
    read = 0
    for record in records:
        if record.seq >= boundary or record.kind != "inbox" or record.state != "Completed":
            continue
        result = record.payload.get("result") if isinstance(record.payload, dict) else None
        seq = result.get("seq") if isinstance(result, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool):
            read = max(read, seq)
    return read


def _input_boundary(
    views: list[dict[str, Any]], index: int, records: list[JournalRecord], *, program: bool, keep_alive: bool
) -> tuple[int, str]:
    """Where a fork with ``--input`` starts (a step index) and what the input replaces."""
    step = str(views[index]["id"])
    where = f"step {index + 1} ({step})"
    if program:
        if index != 0:
            raise _refuse(
                f"at: a Python program reads its input once, at its start: --input forks only at "
                f"step 1, not {where}",
                step=step,
            )
        return 0, "prompt"
    if index == 0:
        return 0, "prompt"
    turn = _TURN_STEP.match(step)
    if turn is None:
        raise _refuse(
            f"at: --input replaces a user message, and {where} is not where one is read: fork at "
            "step 1 or turn-1/route (the prompt), or at a turn's turn-K/message step (a keep-alive "
            "run's message)",
            step=step,
        )
    number = int(turn.group(1))
    if number == 1:
        return 0, "prompt"
    if not keep_alive:  # pragma: no cover - a run that is not keep-alive has one turn
        raise _refuse(f"at: {where} is past the run's only turn", step=step)
    read = f"turn-{number}/message"
    for position, view in enumerate(views):
        if view["id"] == read:
            return position, "message"
    raise _refuse(f"at: turn {number} read no message ({read} is not in the journal)", step=step)


def free_of_charge(record: JournalRecord) -> JournalRecord:
    """The record as the fork holds it: its billed figures zero (the original paid them)."""
    payload = record.payload
    if isinstance(payload, dict) and isinstance(payload.get("result"), dict):
        result = payload["result"]
        if any(key in result for key in _BILLED_KEYS):
            result = {**result, **{key: "0" for key in _BILLED_KEYS if key in result}}
            payload = {**payload, "result": result}
    return replace(record, cost_usd="0", payload=payload)


def fork_point(
    records: list[JournalRecord],
    at: str,
    *,
    has_input: bool = False,
    program: bool = False,
    keep_alive: bool = False,
) -> ForkPoint:
    """Decide a fork of a journal at ``at`` (see the module); `Invalid` (field ``at``) when
    that step does not exist or is not a step boundary, or ``--input`` cannot go there."""
    if not isinstance(at, str) or not at.strip():
        raise _refuse("at: required, a step's ID or its number in `nodus agentrun steps` (from 1)")
    views = step_views(records)
    index = _named(views, at)
    _check_boundary(views, index, records)
    named = str(views[index]["id"])
    replaces: str | None = None
    start = index
    if has_input:
        start, replaces = _input_boundary(views, index, records, program=program, keep_alive=keep_alive)
    # A new prompt keeps nothing (the fork starts as a new run would, with that prompt).
    boundary = int(views[start]["seq"]) if views else 0
    kept = tuple(free_of_charge(record) for record in records if record.seq < boundary)
    return ForkPoint(
        step=named,
        number=index + 1,
        boundary_seq=boundary,
        records=kept,
        replaces=replaces,
        read_seq=_read_seq(records, boundary),
    )
