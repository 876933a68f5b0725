"""Journaled steps: execute once, replay forever.

A journaled program (the Claude conversation today, durable Python agents later) calls
`Steps.run` for every action with an effect. The rules are the design's:

- ``Completed`` in the journal: return the recorded result, do not execute again.
- ``Failed`` in the journal: raise the recorded failure again, so replay takes the same path.
- ``Started`` with no end: the outcome is unknown. An ``idempotent`` step (routing, a model
  call on the server's key, creating the sandbox) runs again as a new attempt. An
  ``external`` step (a sandbox command, a model call on the user's key) is not repeated
  blindly: the journal records ``NeedsResolution`` and the run parks until someone decides.
- Nothing in the journal: write ``Started``, execute, write ``Completed`` or ``Failed``. A
  ``pure`` step (and an ``idempotent`` one a program asks for without a ``Started`` payload,
  `begin` with ``write_started=False``) writes only its end: interrupted, it simply runs again,
  and the step costs one journal object instead of two.
- A step's ``Completed`` and the conversation message it produced are one write
  (``message`` of `run`): the message may then refer to the step's result (``contentOf``)
  instead of holding the same text again, and the two share one fsync.
- A person resolves an uncertain step (`control.resolution`): ``Resolved`` returns the result they
  recorded, ``NoEffect`` runs the step again as a new attempt.

Step ids are deterministic positions in the program (``turn-1/command-2``), never random,
so a replay finds its own records.

Replay also checks that it is replaying the same program (as Temporal and DBOS do): the
journal's steps, in the order they first appear, are the sequence the program asked for
when it recorded them, so the n-th step the program asks for on replay must be the n-th
recorded step, with the same id and kind. When it is not (the agent's code or spec changed
under a run, or the program branches on something it did not journal) the recorded results
no longer describe what the program is doing, and `NonDeterministic` stops the run naming
the step, rather than returning one step's result to another. Messages (``message-N``) are
conversation content, not steps the program asks for, and are outside that sequence; a step
re-run as a new attempt (Started with no end, resolved ``NoEffect``) keeps its position.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from nodus.lifecycle import RunReason
from nodus_ray.durable.journal import Entry, Journal, JournalRecord, StepState
from nodus_ray.faults import crash_point

__all__ = [
    "CHARGE_KIND",
    "Effect",
    "Message",
    "StepFailed",
    "NeedsResolution",
    "NonDeterministic",
    "Begun",
    "Steps",
    "message_content",
]

Effect = Literal["pure", "idempotent", "external"]
# Records outside the sequence of steps the program asks for: conversation messages, and
# charges (a Python program process's sandbox compute, `record_charge`), which the actor
# writes when a process ends, not where the program's code asked for anything.
CHARGE_KIND = "charge"
_OUTSIDE_ORDER = frozenset({"message", CHARGE_KIND})

Message = Callable[[dict[str, Any]], tuple[int, dict[str, Any]] | None]
"""Given a step's result, the conversation message it produced: ``(index, message)``, or None."""


def message_content(payload: Any, records: dict[str, JournalRecord]) -> Any:
    """A message record's message: as stored, or, when it refers to a step's result
    (``{"role", "contentOf": step_id, "key": field}``), with ``content`` taken from there."""
    if not isinstance(payload, dict) or "contentOf" not in payload:
        return payload
    source = records.get(str(payload["contentOf"]))
    result = source.payload.get("result") if source is not None and isinstance(source.payload, dict) else None
    content = result.get(str(payload.get("key", "content"))) if isinstance(result, dict) else None
    return {"role": payload.get("role"), "content": content}


class StepFailed(Exception):
    """A step ended in failure; carries the recorded error so replay raises the same one."""

    def __init__(self, step_id: str, error: dict[str, Any]):
        super().__init__(f"step {step_id} failed: {error.get('message', error)}")
        self.step_id = step_id
        self.error = error


class NeedsResolution(Exception):
    """A step with an external effect was started and never ended; someone must decide."""

    def __init__(self, step_id: str, kind: str, evidence: dict[str, Any] | None = None):
        super().__init__(f"step {step_id} ({kind}) was interrupted and its outcome is unknown")
        self.step_id = step_id
        self.kind = kind
        self.evidence = dict(evidence or {})  # what the NeedsResolution record keeps for a person


class NonDeterministic(Exception):  # noqa: N818 - the run's reason name, as the documents spell it
    """Replay asked for a different step than the journal recorded at that position.

    ``recorded`` is the journal's ``(step id, kind)`` at ``position`` (None when the program
    asks again for a step it already asked for earlier), ``requested`` what the program asks
    for now. Nothing is journaled or executed for the requested step.
    """

    reason = RunReason.NON_DETERMINISTIC

    def __init__(self, position: int, recorded: tuple[str, str] | None, requested: tuple[str, str]):
        asked = f"{requested[0]} ({requested[1]})"
        if recorded is None:
            what = f"the program asked again for step {asked}, which it already ran earlier"
        else:
            what = (
                f"the journal recorded step {recorded[0]} ({recorded[1]}) and the program "
                f"asked for step {asked}"
            )
        super().__init__(f"replay diverged at step {position + 1}: {what}")
        self.step_id = requested[0]
        self.position = position
        self.recorded = recorded
        self.requested = requested


@dataclass(frozen=True)
class Begun:
    """What `Steps.begin` decided for a step.

    ``recorded``: the journal holds its end; ``value`` is its result, or ``error`` its recorded
    failure. Otherwise the step is to execute now as ``attempt``, then `Steps.end` or
    `Steps.fail`; ``started`` is the payload of its open ``Started`` record (the one written
    now, or the one found when ``keep_started`` resumed it), else None.
    """

    recorded: bool
    value: Any = None
    error: dict[str, Any] | None = None
    attempt: int = 1
    started: dict[str, Any] | None = None
    nested: tuple[str, ...] = ()  # the steps it made, replayed with it (`_skip_nested`)


class Steps:
    """The replay index over one journal, and the executor of new steps."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self._last: dict[str, JournalRecord] = {}
        self._attempts: dict[str, int] = {}
        # The steps in the order they first appear, and how many of them `run` has been asked
        # for: replay must ask for the recorded ones in this order (`NonDeterministic`).
        self._order: list[tuple[str, str]] = []
        self._asked = 0
        for record in journal.records:
            self._index(record)

    def _index(self, record: JournalRecord) -> None:
        if record.step_id not in self._last and record.kind not in _OUTSIDE_ORDER:
            self._order.append((record.step_id, record.kind))
        self._last[record.step_id] = record
        if record.state == "Started":
            self._attempts[record.step_id] = record.attempt

    def recorded(self, step_id: str) -> JournalRecord | None:
        return self._last.get(step_id)

    def is_done(self, step_id: str) -> bool:
        """Whether replay returns this step's recorded result (so it needs no checks again)."""
        last = self._last.get(step_id)
        return last is not None and last.state in ("Completed", "Resolved")

    @property
    def replaying(self) -> bool:
        """Whether the journal holds recorded steps after the ones asked for so far."""
        return self._asked < len(self._order)

    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far, from the journal's message records, in order (a message that
        refers to a step's result, ``contentOf``, gets its content from there)."""
        return [message_content(r.payload, self._last) for r in self.journal.records if r.kind == "message"]

    async def _append(
        self, step_id: str, kind: str, state: StepState, payload: Any, *, attempt: int, cost_usd: str = "0"
    ) -> JournalRecord:
        return (await self._append_many([(step_id, kind, state, payload, attempt, cost_usd)]))[0]

    async def _append_many(self, entries: list[Entry]) -> list[JournalRecord]:
        if self.journal.is_local:
            # A local append is one small fsync'd write: a hop to a thread and back would cost a
            # third of it again on every step (`benchmarks/python_agents.py`).
            records = self.journal.append_many(entries)
        else:  # a request to S3: the event loop must not wait on it
            records = await asyncio.to_thread(self.journal.append_many, entries)
        for record in records:
            self._index(record)
        return records

    def _check_position(self, step_id: str, kind: str) -> None:
        position = self._asked
        requested = (step_id, kind)
        if position < len(self._order):
            if self._order[position] != requested:
                raise NonDeterministic(position, self._order[position], requested)
        elif step_id in self._last:
            raise NonDeterministic(position, None, requested)
        self._asked += 1

    async def mark_started(self, step_id: str, kind: str, payload: dict[str, Any], *, attempt: int) -> None:
        """Write ``Started`` for a step already begun without one (a pure step that goes on to make
        steps of its own): it then comes before them in the journal's order, as it did in the program."""
        last = self._last.get(step_id)
        if last is None or last.state != "Started":
            await self._append(step_id, kind, "Started", payload, attempt=attempt)

    def _skip_nested(self, step_id: str) -> tuple[str, ...]:
        """A step replayed whole also replays the steps it made (``{step_id}/model-1``, a model
        call inside a program's step): the program does not ask for them again. Their ids."""
        prefix = step_id + "/"
        skipped: list[str] = []
        while self._asked < len(self._order) and self._order[self._asked][0].startswith(prefix):
            skipped.append(self._order[self._asked][0])
            self._asked += 1
        return tuple(skipped)

    async def record_message(self, index: int, message: dict[str, Any]) -> None:
        """Store a conversation message once; on replay it is already there."""
        step_id = f"message-{index}"
        if step_id not in self._last:
            await self._append(step_id, "message", "Completed", message, attempt=1)

    async def record_charge(self, step_id: str, result: dict[str, Any], summary: str) -> bool:
        """Journal a charge once (kind ``charge``, ``Completed``), outside the program's step
        order; False when ``step_id`` was recorded already (nothing is written again)."""
        if step_id in self._last:
            return False
        await self._append(
            step_id, CHARGE_KIND, "Completed", {"result": result, "summary": summary}, attempt=1
        )
        return True

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
        retry_interrupted: Callable[[JournalRecord], bool] | None = None,
        evidence_of: Callable[[JournalRecord], dict[str, Any]] | None = None,
        write_started: bool | None = None,
        message: Message | None = None,
    ) -> dict[str, Any]:
        """Run ``action`` as the step ``step_id`` unless the journal already decided it.

        ``write_started=False``: an ``idempotent`` step that needs no ``Started`` (routing,
        reading the inbox) is one record, its end. ``message``: the conversation message the
        result produces, journaled in the same write as ``Completed`` (`end`).

        ``retry_interrupted`` is asked about an ``external`` step found started and never
        ended: True means its effect was undone (a hermetic command's workspace put back), so
        the journal records ``NoEffect`` and the step runs again instead of waiting for a person.
        ``evidence_of`` is asked, with that ``Started`` record, what the person deciding needs
        (a command's connections); it is kept in the ``NeedsResolution`` record.

        Raises `NonDeterministic` (and runs nothing) when the journal recorded another step at
        this position of the program, or this step at another position.
        """
        begun = await self.begin(
            step_id,
            kind,
            effect=effect,
            started=started,
            write_started=write_started,
            retry_interrupted=retry_interrupted,
            evidence_of=evidence_of,
        )
        if begun.recorded:
            if begun.error is not None:
                raise StepFailed(step_id, begun.error)
            return dict(begun.value or {})
        try:
            result = await action()
        except StepFailed as failure:
            await self.fail(step_id, kind, failure.error, attempt=begun.attempt)
            raise
        crash_point("step-effect-done", f"{self.journal.prefix}/{step_id}")
        summary = summary_of(result) if summary_of is not None else None
        cost = cost_of(result) if cost_of is not None else "0"
        produced = message(result) if message is not None else None
        await self.end(
            step_id, kind, result, attempt=begun.attempt, summary=summary, cost_usd=cost, message=produced
        )
        return result

    async def begin(
        self,
        step_id: str,
        kind: str,
        *,
        effect: Effect = "idempotent",
        started: dict[str, Any] | None = None,
        write_started: bool | None = None,
        keep_started: bool = False,
        retry_interrupted: Callable[[JournalRecord], bool] | None = None,
        evidence_of: Callable[[JournalRecord], dict[str, Any]] | None = None,
    ) -> Begun:
        """Decide a step from the journal: its recorded end, or execute it now (see `Begun`).

        ``write_started`` (default: unless ``pure``) writes ``Started`` before the effect, then
        checks the fence; an ``external`` step always writes it. ``keep_started``: a ``Started``
        found with no end is resumed as it is (a timer keeps the wake time it first recorded)
        instead of starting a new attempt. Raises `NonDeterministic` and `NeedsResolution` as
        `run` does.
        """
        self._check_position(step_id, kind)
        last = self._last.get(step_id)
        if last is not None:
            if last.state == "Completed" or last.state == "Resolved":
                payload = last.payload if isinstance(last.payload, dict) else {}
                return Begun(
                    recorded=True, value=payload.get("result", {}), nested=self._skip_nested(step_id)
                )
            if last.state == "Failed":
                nested = self._skip_nested(step_id)
                return Begun(recorded=True, error=dict(last.payload.get("error", {})), nested=nested)
            if last.state == "NoEffect":
                pass  # resolved as "it did nothing": run it again, as the next attempt
            elif last.state == "Started" and retry_interrupted is not None and retry_interrupted(last):
                await self._append(
                    step_id,
                    kind,
                    "NoEffect",
                    {"summary": "interrupted; its effect was undone (workspace restored): it runs again"},
                    attempt=last.attempt,
                )
            elif last.state == "NeedsResolution" or effect == "external":
                if last.state != "NeedsResolution":
                    evidence = evidence_of(last) if evidence_of is not None else {}
                    last = await self._append(
                        step_id,
                        kind,
                        "NeedsResolution",
                        {**evidence, "summary": "interrupted; outcome unknown"},
                        attempt=last.attempt,
                    )
                kept = last.payload if isinstance(last.payload, dict) else {}
                raise NeedsResolution(step_id, kind, {k: v for k, v in kept.items() if k != "summary"})
            elif last.state == "Started" and keep_started:
                payload = last.payload if isinstance(last.payload, dict) else {}
                return Begun(recorded=False, attempt=last.attempt, started=payload)
        # A step that writes no Started (pure) counts its attempts from its last record too.
        attempt = max(self._attempts.get(step_id, 0), last.attempt if last is not None else 0) + 1
        if write_started is None:
            write_started = effect != "pure"
        if not (write_started or effect == "external"):
            return Begun(recorded=False, attempt=attempt)
        record = await self._append(step_id, kind, "Started", dict(started or {}), attempt=attempt)
        crash_point("step-started", f"{self.journal.prefix}/{step_id}")
        # A newer actor may have taken the run over while this one wrote Started (this one
        # froze, or its node was cut off): then it stops here, before the effect (`fencing`).
        await asyncio.to_thread(self.journal.check_fence, f"before the effect of {step_id}")
        return Begun(recorded=False, attempt=attempt, started=record.payload)

    async def end(
        self,
        step_id: str,
        kind: str,
        result: Any,
        *,
        attempt: int,
        summary: str | None = None,
        cost_usd: str = "0",
        message: tuple[int, dict[str, Any]] | None = None,
    ) -> None:
        """Journal a step's result (``Completed``); replay returns it from now on. ``message``
        (``(index, message)``) is journaled with it, in the same write, unless already there."""
        payload: dict[str, Any] = {"result": result}
        if summary is not None:
            payload["summary"] = summary
        entries: list[Entry] = [(step_id, kind, "Completed", payload, attempt, cost_usd)]
        if message is not None and f"message-{message[0]}" not in self._last:
            entries.append((f"message-{message[0]}", "message", "Completed", message[1], 1, "0"))
        await self._append_many(entries)
        crash_point("step-recorded", f"{self.journal.prefix}/{step_id}")

    async def fail(self, step_id: str, kind: str, error: dict[str, Any], *, attempt: int) -> None:
        """Journal a step's failure (``Failed``); replay raises it again from now on."""
        await self._append(
            step_id, kind, "Failed", {"error": error, "summary": error.get("message", "")}, attempt=attempt
        )
