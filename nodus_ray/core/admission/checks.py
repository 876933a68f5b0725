"""The checks a member or a batch passes before admission takes it in; refusals name the field.

All of them raise `AdmissionError` and change nothing. Cycles and the order after a restart come
from the SDK's dependency-graph helper (:mod:`nodus.dependencies`), so the SDK and the API
name the same cycle for the same tasks.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Sequence
from decimal import Decimal

from nodus.dependencies import dependency_order, find_cycle
from nodus_ray.core.admission.errors import _check_money, _conflict, _invalid, _usd
from nodus_ray.core.admission.model import _STATES, QUEUED, Member

__all__ = ["_checked_member", "_check_rebuild", "_check_batch", "_refuse_cycles", "_stable_topological"]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def _checked_member(member: Member, index: int, *, rebuilding: bool) -> Member:
    """A checked private copy, so a caller's later edits cannot bypass the rules."""
    if not isinstance(member, Member):
        raise _invalid("InvalidMember", f"expected a Member, not {type(member).__name__}", None, index)
    if not isinstance(member.key, str) or not _DNS_LABEL.match(member.key):
        raise _invalid(
            "InvalidTaskKey",
            f"task key {member.key!r} is not a DNS label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)",
            "spec.taskKey",
            index,
        )
    if not isinstance(member.run, str) or not member.run:
        raise _invalid("InvalidRunName", f"run name {member.run!r} is not a name", "metadata.name", index)
    _check_money(member.cap, "spec.perRunMaxCostUSD", "a run's cap", index)
    _check_money(member.spent, "status.cost.totalUSD", "a run's spend", index)
    if isinstance(member.depends_on, str) or not isinstance(member.depends_on, Iterable):
        raise _invalid("InvalidDependsOn", "dependsOn must be a list of task keys", "spec.dependsOn", index)
    depends_on = tuple(member.depends_on)
    for position, dependency in enumerate(depends_on):
        if not isinstance(dependency, str):
            raise _invalid(
                "InvalidDependsOn",
                f"dependsOn entries are task keys, not {dependency!r}",
                f"spec.dependsOn[{position}]",
                index,
            )
    if rebuilding:
        if member.state not in _STATES:
            raise _invalid("InvalidState", f"unknown state {member.state!r}", "status.phase", index)
        state, reason, spent = member.state, member.reason, member.spent
    else:
        if member.state != QUEUED or member.spent != 0:
            raise _invalid(
                "InvalidState",
                f"a new run starts Queued with nothing spent, not {member.state} with ${_usd(member.spent)}",
                "status.phase",
                index,
            )
        state, reason, spent = QUEUED, None, Decimal(0)
    # Repeats in dependsOn mean the same thing once; keep the first occurrence's order.
    return Member(
        key=member.key,
        run=member.run,
        cap=member.cap,
        depends_on=tuple(dict.fromkeys(depends_on)),
        state=state,
        reason=reason,
        spent=spent,
    )


def _check_rebuild(copies: Sequence[Member]) -> None:
    """Refuse a restart's members (checked copies) that repeat a key or run, or name an unknown
    key or a cycle."""
    keys: dict[str, int] = {}
    runs: set[str] = set()
    for index, member in enumerate(copies):
        if member.key in keys:
            raise _invalid(
                "DuplicateTaskKey", f"task key {member.key!r} appears twice", "spec.taskKey", index
            )
        if member.run in runs:
            raise _invalid("DuplicateRunName", f"run {member.run!r} appears twice", "metadata.name", index)
        keys[member.key] = index
        runs.add(member.run)
    for index, member in enumerate(copies):
        for position, dependency in enumerate(member.depends_on):
            if dependency not in keys:
                raise _invalid(
                    "UnknownDependency",
                    f"run {member.run!r} depends on task key {dependency!r}, which is not in the group",
                    f"spec.dependsOn[{position}]",
                    index,
                )
    _refuse_cycles(copies)


def _check_batch(batch: list[Member], *, group_keys: Container[str], group_runs: Container[str]) -> None:
    """Refuse a batch of checked copies whose keys, run names or dependencies do not fit the group.

    ``group_keys`` and ``group_runs`` are the task keys and run names already in the group. A
    dependency must name a key in the group or earlier in the batch.
    """
    keys_in_batch: dict[str, int] = {}
    runs_in_batch: set[str] = set()
    for index, member in enumerate(batch):
        if member.key in group_keys:
            raise _conflict(
                "DuplicateTaskKey",
                f"task key {member.key!r} is already in the group",
                "spec.taskKey",
                index,
            )
        if member.key in keys_in_batch:
            raise _invalid(
                "DuplicateTaskKey",
                f"task key {member.key!r} appears twice in the batch (runs {keys_in_batch[member.key]} and {index})",
                "spec.taskKey",
                index,
            )
        if member.run in group_runs or member.run in runs_in_batch:
            raise _conflict("DuplicateRunName", f"run {member.run!r} already exists", "metadata.name", index)
        keys_in_batch[member.key] = index
        runs_in_batch.add(member.run)
    _refuse_cycles(batch)
    for index, member in enumerate(batch):
        for position, dependency in enumerate(member.depends_on):
            if dependency in group_keys:
                continue
            later = keys_in_batch.get(dependency)
            if later is not None and later < index:
                continue
            where = (
                f"comes later in the batch (run {later}); list it before the runs that depend on it"
                if later is not None
                else "is not in the group; create the runs it depends on first"
            )
            raise _invalid(
                "UnknownDependency",
                f"run {member.run!r} depends on task key {dependency!r}, which {where}",
                f"spec.dependsOn[{position}]",
                index,
            )


# -- the kept-up-to-date state --------------------------------------------------------


def _refuse_cycles(members: Sequence[Member]) -> None:
    """Raise `AdmissionError` naming the first dependency cycle among ``members``, if any.

    Edges to keys outside ``members`` are ignored (they are checked as unknown dependencies).
    """
    cycle = find_cycle([member.key for member in members], [member.depends_on for member in members])
    if cycle is not None:
        raise _invalid("DependencyCycle", cycle.message, f"spec.dependsOn[{cycle.position}]", cycle.index)


def _stable_topological(members: Sequence[Member]) -> list[Member]:
    """``members`` with every dependency before its dependents, otherwise in the given order.

    The earliest ready member goes first, so an already valid order is returned unchanged.
    Cycles are refused before this is called.
    """
    order = dependency_order([member.key for member in members], [member.depends_on for member in members])
    return [members[index] for index in order]
