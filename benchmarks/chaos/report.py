"""The campaign's table: faults by kind, operations acknowledged, invariant violations."""

from __future__ import annotations

from collections import Counter

from .checker import Violation

__all__ = ["table"]

INVARIANTS = ("lost", "repeated", "billing", "cap", "maxActive", "dependencies", "ended")


def table(
    title: str,
    faults: Counter[str],
    ops: Counter[str],
    unanswered: Counter[str],
    violations: list[Violation],
    notes: list[str],
) -> str:
    lines = [f"## {title}", "", "| faults injected | count |", "| --- | --- |"]
    lines += [f"| {kind} | {count} |" for kind, count in sorted(faults.items())]
    lines += [f"| **total** | {sum(faults.values())} |", ""]
    lines += ["| operations acknowledged | count |", "| --- | --- |"]
    lines += [f"| {kind} | {count} |" for kind, count in sorted(ops.items())]
    if unanswered:
        lines += [f"| (not acknowledged: {kind}) | {count} |" for kind, count in sorted(unanswered.items())]
    lines += ["", "| invariant | violations |", "| --- | --- |"]
    found = Counter(v.invariant for v in violations)
    lines += [f"| {name} | {found.get(name, 0)} |" for name in INVARIANTS]
    lines += [f"| **total** | {len(violations)} |", ""]
    for violation in violations:
        lines.append(f"- VIOLATION {violation.invariant}: {violation.subject}: {violation.detail}")
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)
