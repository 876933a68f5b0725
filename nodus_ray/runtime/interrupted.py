"""Which command a new actor of a run finds interrupted, and whether it can be undone.

The journal records each command attempt's ``Started`` and, when the run itself finished it,
its ``Completed``. A new actor reads from that which workspace states fit the journal
(`sandbox.snapshots.accepted_states`) and, for a run whose sandbox reaches nothing outside,
which interrupted command to undo and to which state (decision 38).
"""

from __future__ import annotations

from nodus_ray.durable.journal import JournalRecord
from nodus_ray.sandbox.snapshots import NO_COMMAND

__all__ = ["command_attempts", "undoable_command"]


def command_attempts(records: list[JournalRecord]) -> list[tuple[int, bool]]:
    """Each command attempt's Started seq, and whether the run itself completed that attempt
    (only a step's last attempt can have been completed)."""
    last_state: dict[str, str] = {}
    last_start: dict[str, int] = {}
    starts: list[JournalRecord] = []
    for record in records:
        last_state[record.step_id] = record.state
        if record.kind == "command" and record.state == "Started":
            starts.append(record)
            last_start[record.step_id] = record.seq
    return [
        (start.seq, last_state[start.step_id] == "Completed" and last_start[start.step_id] == start.seq)
        for start in starts
    ]


def undoable_command(
    records: list[JournalRecord], attempts: list[tuple[int, bool]]
) -> tuple[int, int] | None:
    """When the journal ends with a command started and never ended: its Started seq and the
    workspace state before it (the last command the run itself completed, or `NO_COMMAND`).

    None when there is nothing to undo, or when the state before it is not the run's own: a
    command a person resolved as Completed since then left the workspace as it found it, which
    no snapshot holds for certain, so that run waits for a person as before.
    """
    if not attempts or attempts[-1][1]:
        return None
    interrupted = attempts[-1][0]
    step = next(record for record in records if record.seq == interrupted)
    if [r.state for r in records if r.step_id == step.step_id][-1] != "Started":
        return None  # already parked for a person, or decided
    before = NO_COMMAND
    for seq, completed in reversed(attempts[:-1]):
        if completed:
            before = seq
            break
    for record in records:  # between that state and now, every other command did nothing
        if record.kind == "command" and before < record.seq < interrupted and record.state == "Resolved":
            return None
    return interrupted, before
