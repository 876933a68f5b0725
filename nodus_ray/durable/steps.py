"""Journaled steps: execute once, replay forever.

A journaled program (the Claude conversation today, durable Python agents later) calls
`Steps.run` for every action with an effect. The rules are the design's:

- ``Completed`` in the journal: return the recorded result, do not execute again.
- ``Failed`` in the journal: raise the recorded failure again, so replay takes the same path.
- ``Started`` with no end: the outcome is unknown. An ``idempotent`` step (routing, a model
  call on the server's key, creating the sandbox) runs again as a new attempt. An
  ``external`` step (a sandbox command, a model call on the user's key) is not repeated
  blindly: the journal records ``NeedsResolution`` and the run parks until someone decides.
- Nothing in the journal: write ``Started``, execute, write ``Completed`` or ``Failed``.
- A person resolves an uncertain step (`run_resolution`): ``Resolved`` returns the result they
  recorded, ``NoEffect`` runs the step again as a new attempt.

Step ids are deterministic positions in the program (``turn-1/command-2``), never random,
so a replay finds its own records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from nodus_ray.durable.journal import Journal, JournalRecord, StepState
from nodus_ray.faults import crash_point

__all__ = ["Effect", "StepFailed", "NeedsResolution", "Steps"]

Effect = Literal["idempotent", "external"]


class StepFailed(Exception):
    """A step ended in failure; carries the recorded error so replay raises the same one."""

    def __init__(self, step_id: str, error: dict[str, Any]):
        super().__init__(f"step {step_id} failed: {error.get('message', error)}")
        self.step_id = step_id
        self.error = error


class NeedsResolution(Exception):
    """A step with an external effect was started and never ended; someone must decide."""

    def __init__(self, step_id: str, kind: str):
        super().__init__(f"step {step_id} ({kind}) was interrupted and its outcome is unknown")
        self.step_id = step_id
        self.kind = kind


class Steps:
    """The replay index over one journal, and the executor of new steps."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self._last: dict[str, JournalRecord] = {}
        self._attempts: dict[str, int] = {}
        for record in journal.records:
            self._index(record)

    def _index(self, record: JournalRecord) -> None:
        self._last[record.step_id] = record
        if record.state == "Started":
            self._attempts[record.step_id] = record.attempt

    def recorded(self, step_id: str) -> JournalRecord | None:
        return self._last.get(step_id)

    def is_done(self, step_id: str) -> bool:
        """Whether replay returns this step's recorded result (so it needs no checks again)."""
        last = self._last.get(step_id)
        return last is not None and last.state in ("Completed", "Resolved")

    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far, from the journal's message records, in order."""
        return [r.payload for r in self.journal.records if r.kind == "message"]

    async def _append(
        self, step_id: str, kind: str, state: StepState, payload: Any, *, attempt: int, cost_usd: str = "0"
    ) -> JournalRecord:
        record = await asyncio.to_thread(
            self.journal.append, step_id, kind, state, payload, attempt=attempt, cost_usd=cost_usd
        )
        self._index(record)
        return record

    async def record_message(self, index: int, message: dict[str, Any]) -> None:
        """Store a conversation message once; on replay it is already there."""
        step_id = f"message-{index}"
        if step_id not in self._last:
            await self._append(step_id, "message", "Completed", message, attempt=1)

    async def run(
        self,
        step_id: str,
        kind: str,
        action: Callable[[], Awaitable[dict[str, Any]]],
        *,
        effect: Effect = "idempotent",
        started: dict[str, Any] | None = None,
        cost_of: Callable[[dict[str, Any]], str] | None = None,
        summary_of: Callable[[dict[str, Any]], str] | None = None,
    ) -> dict[str, Any]:
        """Run ``action`` as the step ``step_id`` unless the journal already decided it."""
        last = self._last.get(step_id)
        if last is not None:
            if last.state == "Completed" or last.state == "Resolved":
                return dict(last.payload.get("result", {}))
            if last.state == "Failed":
                raise StepFailed(step_id, dict(last.payload.get("error", {})))
            if last.state == "NoEffect":
                pass  # resolved as "it did nothing": run it again, as the next attempt
            elif last.state == "NeedsResolution" or effect == "external":
                if last.state != "NeedsResolution":
                    await self._append(
                        step_id,
                        kind,
                        "NeedsResolution",
                        {"summary": "interrupted; outcome unknown"},
                        attempt=last.attempt,
                    )
                raise NeedsResolution(step_id, kind)
        attempt = self._attempts.get(step_id, 0) + 1
        await self._append(step_id, kind, "Started", dict(started or {}), attempt=attempt)
        try:
            result = await action()
        except StepFailed as failure:
            await self._append(
                step_id,
                kind,
                "Failed",
                {"error": failure.error, "summary": failure.error.get("message", "")},
                attempt=attempt,
            )
            raise
        crash_point("step-effect-done", f"{self.journal.prefix}/{step_id}")
        payload: dict[str, Any] = {"result": result}
        if summary_of is not None:
            payload["summary"] = summary_of(result)
        cost = cost_of(result) if cost_of is not None else "0"
        await self._append(step_id, kind, "Completed", payload, attempt=attempt, cost_usd=cost)
        return result
