"""What a run actor tells the control plane: its progress (`RunReport`) and its end (`RunOutcome`).

Both are partial statuses: only the fields the actor gave are merged into the run's status, and
a field given as None clears it (``reason=None`` when a run starts), so "not given" is a value
of its own, `UNSET`. They are dataclasses, not pydantic models: every run is a fresh process,
and building a run's first pydantic model there cost it the import of pydantic and its first
schema, about 50 ms a run (issue 19). What they check is what the models checked: an unknown
field is refused (``TypeError``), a phase must be a `RunPhase` (``ValueError``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any, Final

from nodus.lifecycle import RunPhase

__all__ = ["RunReport", "RunOutcome", "UNSET"]


class _Unset(enum.Enum):
    """A field the actor did not give (None is a value: it clears the status field)."""

    UNSET = "unset"


UNSET: Final = _Unset.UNSET  # an enum member: the same object after crossing to another process


def _given(partial: Any) -> dict[str, Any]:
    return {f.name: value for f in fields(partial) if (value := getattr(partial, f.name)) is not UNSET}


@dataclass(kw_only=True)
class RunReport:
    """A run actor's progress: the fields of the run's status it changes, and only those.

    ``reason=None`` set on purpose clears the reason (a run that starts); a field never set is
    not sent. Nested objects (``sandbox``, ``cost``) are merged into the stored ones.
    """

    phase: RunPhase | None | _Unset = UNSET
    reason: str | None | _Unset = UNSET
    message: str | None | _Unset = UNSET
    startedAt: str | None | _Unset = UNSET
    turns: list[dict[str, Any]] | None | _Unset = UNSET
    cost: dict[str, Any] | None | _Unset = UNSET
    sandbox: dict[str, Any] | None | _Unset = UNSET
    # The reporting actor's attempt (its fencing epoch): a report of an older attempt than the
    # run's is a zombie's, and is dropped. Not a status field: `RunService.report` takes it out.
    attempt: int | None | _Unset = UNSET

    def __post_init__(self) -> None:
        if self.phase is not UNSET and self.phase is not None:
            self.phase = RunPhase(self.phase)

    def to_patch(self) -> dict[str, Any]:
        """The status patch as stored: the set fields, the phase as its plain string."""
        patch = _given(self)
        if patch.get("phase") is not None:
            patch["phase"] = str(patch["phase"])
        return patch


@dataclass(kw_only=True)
class RunOutcome:
    """How a run's program ended, as its actor answers ``run()``: the other half of the seam.

    A terminal phase, or Waiting with the reason it parked on (and what resuming needs:
    ``step`` to resolve, ``messages.read``, ``creditsNeededUSD``). The supervisor checks the
    phase change against the lifecycle and merges `to_patch` into the run's status.
    """

    phase: RunPhase
    reason: str
    message: str | None | _Unset = UNSET
    turns: list[dict[str, Any]] | None | _Unset = UNSET
    cost: dict[str, Any] | None | _Unset = UNSET
    answer: dict[str, Any] | None | _Unset = UNSET
    finishedAt: str | None | _Unset = UNSET
    step: str | None | _Unset = UNSET  # NeedsResolution: the step a person resolves
    messages: dict[str, int] | None | _Unset = (
        UNSET  # AwaitingMessage: {"read": seq of the last message read}
    )
    creditsNeededUSD: str | None | _Unset = UNSET  # InsufficientCredits: what the next call needs
    budgetNeededUSD: str | None | _Unset = UNSET  # BudgetExceeded: what the next step needs of the Budget
    # A Python program parked: when a timer starts it again (Sleeping, a message wait's
    # timeout), and what else does (``{"message": name, "after": seq}``, ``{"children": [...]}``).
    wakeAt: str | None | _Unset = UNSET
    waitingFor: dict[str, Any] | None | _Unset = UNSET

    def __post_init__(self) -> None:
        self.phase = RunPhase(self.phase)
        if not isinstance(self.reason, str):
            raise ValueError(f"an outcome's reason is a string, not {self.reason!r}")

    def to_patch(self) -> dict[str, Any]:
        """The outcome as the status patch the supervisor merges (set fields, plain strings)."""
        patch = _given(self)
        patch["phase"] = str(self.phase)
        return patch
