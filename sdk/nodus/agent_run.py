"""`AgentRun`, the handle of one run (wait, result, answer, steps, send, resolve, cancel, logs;
for a Python agent's run also children, outputs, retry, suspend and resume), and `RunContext`,
what a durable Python entrypoint receives.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from .client import Client
from .errors import Invalid, NotFound
from .events import afollow_events, log_line
from .handles import _encode_input, _ResourceHandle, _run_failed
from .resources import TERMINAL_PHASES, at_cost_cap, awaiting_message
from .view import View

__all__ = ["AgentRun", "RunContext", "RunOutput", "RunOutputs"]

# Waiting reasons a run leaves without a person: a message, a timer, its children, a resume.
_GOES_ON_BY_ITSELF = frozenset(
    {"AwaitingMessage", "Sleeping", "AwaitingChildren", "Suspended", "RateLimited"}
)
# How often `logs(follow=True)` of a Python run reads its program log again (seconds).
_PROGRAM_LOG_POLL = 0.5


def _evidence(evidence: Any) -> dict[str, str]:
    """``resolve``'s evidence as sent: a mapping whose keys and values are text, checked here."""
    if not isinstance(evidence, Mapping):
        raise Invalid(
            'evidence: a mapping of text, e.g. {"receipt": "r-42"}, not ' + type(evidence).__name__,
            details={"field": "evidence"},
        )
    for key, value in evidence.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise Invalid(
                f"evidence[{key!r}]: every entry is a name and a text value, not {type(value).__name__}",
                details={"field": "evidence"},
            )
    return dict(evidence)


class RunOutput:
    """One output a Python run saved (``ctx.save_output``): read it, or save it to a file."""

    def __init__(self, run: str, name: str, size: int, *, client: Client, project: str | None) -> None:
        self.run = run
        self.name = name
        self.bytes = size
        self._client = client
        self._project = project

    def read_bytes(self) -> bytes:
        return self._client.run_output(self.run, self.name, project=self._project)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def save(self, path: str | Path) -> Path:
        """Write the output to ``path`` (a directory: a file of the output's name in it)."""
        target = Path(path)
        if target.is_dir():
            target = target / self.name
        target.write_bytes(self.read_bytes())
        return target

    def __repr__(self) -> str:
        return f"RunOutput(run={self.run!r}, name={self.name!r}, bytes={self.bytes})"


class RunOutputs(Mapping[str, RunOutput]):
    """``run.outputs``: the run's saved outputs by name, listed when asked (a live view)."""

    def __init__(self, run: str, *, client: Client, project: str | None) -> None:
        self._run = run
        self._client = client
        self._project = project

    def _listing(self) -> dict[str, int]:
        items = self._client.run_outputs(self._run, project=self._project)
        return {str(item["name"]): int(item.get("bytes") or 0) for item in items}

    def __getitem__(self, name: str) -> RunOutput:
        listing = self._listing()
        if name not in listing:
            saved = ", ".join(sorted(listing)) or "none"
            raise NotFound(
                f"agentrun/{self._run} has no output {name!r} (saved: {saved})",
                details={"kind": "AgentRun", "name": self._run, "output": name},
            )
        return RunOutput(self._run, name, listing[name], client=self._client, project=self._project)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._listing()))

    def __len__(self) -> int:
        return len(self._listing())

    def __repr__(self) -> str:
        return f"RunOutputs(run={self._run!r})"


class AgentRun(_ResourceHandle):
    """One AgentRun: `wait`, `result` (the answer text), `answer`, `steps`, `cancel`, `delete`."""

    _collection = "agentruns"
    _kind = "AgentRun"
    # The sequence number of the last message this handle sent: a keep-alive run has caught up
    # (its answer is the answer to that message) once it has read it.
    _sent_seq = 0

    def _caught_up(self, status: dict[str, Any]) -> bool:
        if status.get("program") == "Python":  # a program waiting for a message is mid-run, not done
            return False
        read = (status.get("messages") or {}).get("read") or 0
        return awaiting_message(status) and int(read) >= self._sent_seq

    def wait(self, timeout: float | None = None) -> View:
        """Block until the run is terminal, or (keep-alive) has answered every message this handle
        sent and waits for the next; return its status.

        Raises `errors.AgentRunFailed` for Failed or Cancelled, and for a run parked at its cost
        cap (``Waiting``, ``MaxCostReached``), which only a cancel or its deadline can end; and
        `errors.WaitTimeout` after ``timeout`` seconds. A briefly unreachable API (a server restart) is waited out.
        """
        status = self._poll_status(
            lambda now: now.get("phase") in TERMINAL_PHASES or at_cost_cap(now) or self._caught_up(now),
            timeout,
            lambda phase: f"agentrun/{self.name} is still {phase} after {timeout:g}s",
        )
        phase = status.get("phase")
        if phase != "Succeeded" and not awaiting_message(status):
            raise _run_failed(self.name, status)
        return View(status)

    def result(self) -> str:
        """The answer text, after waiting for the run; raises `errors.AgentRunFailed` unless it succeeded."""
        self.wait()
        return self.answer()

    def answer(self) -> str:
        """The run's full answer text, waiting while it is being written.

        It waits until the run ends, waits for a person or for funds, or (keep-alive) has answered
        the last message this handle sent, so ``run.send(...)`` then ``run.answer()`` gives the
        answer to that message. Unlike `result` it does not raise for a failed run that has an
        answer; a run that stopped without one raises `errors.Conflict` (``AnswerNotReady``).
        """
        self._poll_status(
            lambda now: (
                now.get("phase") in TERMINAL_PHASES
                or self._caught_up(now)
                or (now.get("phase") == "Waiting" and now.get("reason") not in _GOES_ON_BY_ITSELF)
            ),
            None,
            lambda phase: f"agentrun/{self.name} is still {phase}",
        )
        return str(self._client.run_answer(self.name, project=self._project).get("answer") or "")

    def steps(self) -> list[View]:
        """The journaled steps in order: sandbox, routing and model calls, commands, the answer."""
        return [View(step) for step in self._client.run_steps(self.name, project=self._project)]

    def export(self, format: str = "atif", *, to: str | os.PathLike[str] | None = None) -> bytes | int:
        """The trajectory as ``atif`` (ATIF JSON) or ``jsonl`` (journal records), secrets masked:
        its bytes, or with ``to`` the bytes written to that file (docs/export.md)."""
        return self._client.export_run(self.name, format, to=to, project=self._project)

    def cancel(self) -> None:
        """Stop the run and delete its sandbox; it ends Cancelled."""
        self._client.cancel_run(self.name, project=self._project)

    def delete(self) -> None:
        """Cancel the run if unfinished, then delete it with its journal and sandbox."""
        self._client.delete("agentruns", self.name, project=self._project)

    def send(self, name: str, payload: Any, message_key: str | None = None) -> View:
        """Send a keep-alive run a message (``name`` is its kind, usually ``"message"``).

        The run reads it after its current turn, or now if it waits for one. The same
        ``message_key`` again is delivered once. A finished run refuses it with
        `errors.Conflict` (code ``AgentRunFinished``). Non-text payloads travel JSON-encoded.
        """
        text = _encode_input(payload)
        sent = self._client.send_message(
            self.name, text, message_key=message_key, message_name=name, project=self._project
        )
        self._sent_seq = max(self._sent_seq, int(sent.get("seq") or 0))
        return View(sent)

    def resolve(
        self,
        step_id: str,
        decision: str,
        evidence: dict[str, str] | None = None,
        result: Any = None,
        checkpoint_seq: int | None = None,
        expected_revision: int | None = None,
    ) -> View:
        """Decide a step whose outcome is unknown (the run waits with ``NeedsResolution``).

        ``decision`` is ``Completed`` (the step did take effect; ``result`` is what it returned:
        a Python step's JSON value, or ``{"exitCode": 0, "output": "..."}`` for a command),
        ``NoEffect`` (it did nothing: it runs again) or ``Cancelled`` (the run fails).
        ``evidence`` says how you know: a mapping of text (``{"receipt": "r-42"}``), kept with
        the step. ``expected_revision`` is the run's ``metadata.resourceVersion`` the decision
        was made on (default: the run as it is now); a stale one is refused with
        `errors.Conflict` (``RevisionMismatch``), so two people cannot both decide.
        ``checkpoint_seq`` is the journal position the decision was made on (the ``seq`` of the
        last of `steps`): when the journal has moved on since, `errors.Conflict`
        (``StaleCheckpoint``); a position it has not reached, `errors.Invalid`.
        """
        body: dict[str, Any] = {"step": step_id, "decision": decision}
        if evidence is not None:
            body["evidence"] = _evidence(evidence)
        for arg, value in (("checkpoint_seq", checkpoint_seq), ("expected_revision", expected_revision)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise Invalid(f"{arg}: a whole number, not {value!r}", details={"field": arg})
        if checkpoint_seq is not None:
            body["checkpointSeq"] = checkpoint_seq
        if expected_revision is None:
            expected_revision = int((self._refresh().get("metadata") or {}).get("resourceVersion") or 0)
        body["expectedRevision"] = expected_revision
        if result is not None:
            body["result"] = dict(result) if isinstance(result, Mapping) else result
        self._resource = self._client.resolve_run(self.name, body, project=self._project)
        return View(self._resource)

    def retry(self) -> None:
        """Run a Failed run again from its journal: its completed steps are kept, not run again."""
        self._resource = self._client.retry_run(self.name, project=self._project)

    def fork(self, at: int | str, name: str | None = None, input: str | None = None) -> AgentRun:
        """A new run from this one's step ``at`` (its number in `steps`, from 1, or its id): the
        steps before it kept, not run again, the workspace as it was there; it runs step ``at``
        again and goes on, with ``input`` as the next prompt or message when given (docs/fork.md)."""
        forked = self._client.fork_run(self.name, at, new_name=name, input=input, project=self._project)
        return AgentRun(forked, project=self._project, client=self._client)

    def suspend(self) -> None:
        """Park the run with no process (``Waiting``, ``Suspended``; its deadline still runs)."""
        self._resource = self._client.suspend_run(self.name, project=self._project)

    def resume(self) -> None:
        """Start a suspended run again; it replays its journal and goes on."""
        self._resource = self._client.resume_run(self.name, project=self._project)

    def children(self) -> list[AgentRun]:
        """The child runs this run spawned (``ctx.spawn``, ``ctx.map``), in creation order."""
        return [
            AgentRun(child, project=self._project, client=self._client)
            for child in self._client.run_children(self.name, project=self._project)
        ]

    @property
    def outputs(self) -> RunOutputs:
        """The outputs the run saved: ``run.outputs["report"].read_text()``, ``.save(path)``;
        a name it did not save raises `errors.NotFound` naming it."""
        return RunOutputs(self.name, client=self._client, project=self._project)

    def _is_program(self) -> bool:
        return (self._resource.get("status") or {}).get("program") == "Python" or (
            (self._refresh().get("status") or {}).get("program") == "Python"
        )

    async def logs(self, follow: bool = False) -> AsyncIterator[str]:
        """The run's log, line by line. A Python run's is what its program printed (a replay's
        output is not repeated); another run's is its steps, phase changes, turns and answer.

        With ``follow`` it goes on until the run ends (reconnecting by itself if the connection
        drops, without losing or repeating a line); without, it ends once caught up.
        """
        if await asyncio.to_thread(self._is_program):
            async for printed in self._program_log(follow):
                yield printed
            return
        path = self._client._path("agentruns", self._project, self.name, "events")
        async with self._client.async_http() as http:
            async for event in afollow_events(http, path, follow=follow):
                line = log_line(event)
                if line is not None:
                    yield line

    async def _program_log(self, follow: bool) -> AsyncIterator[str]:
        shown = 0  # characters of the log already yielded (the log only grows)
        while True:
            # Terminal first: a log read after the run ended is complete.
            done = (
                not follow
                or (await asyncio.to_thread(self._refresh)).get("status", {}).get("phase") in TERMINAL_PHASES
            )
            text = await asyncio.to_thread(self._client.run_logs, self.name, project=self._project)
            complete = text[: text.rfind("\n") + 1] if not done else text
            for line in complete[shown:].splitlines():
                yield line
            shown = max(shown, len(complete))
            if done:
                return
            await asyncio.sleep(_PROGRAM_LOG_POLL)


# -- RunContext -------------------------------------------------------------------------------


class RunContext(Protocol):
    """What an agent entrypoint receives as ``ctx``; the agent runtime provides the implementation."""

    idempotency_key: str

    @property
    def state_dir(self) -> Path:
        """A directory that persists across replays and node moves (created when first read)."""
        ...

    def step(self, name: str, fn: Callable[[], Any], effect: str = "pure") -> Any: ...

    def sleep(self, duration: str | float) -> None: ...

    def sleep_until(self, time: str) -> None: ...

    def wait_for_message(self, name: str, timeout: str | float | None = None) -> Any: ...

    def send(self, target: str, name: str, payload: Any) -> None: ...

    def spawn(self, input: Any, key: str, permissions: Any = None, deadline: str | None = None) -> Any: ...

    def gather(self, children: list[Any], return_exceptions: bool = False) -> list[Any]: ...

    def map(self, inputs: Iterable[Any]) -> list[Any]: ...

    def child_output(self, child: Any, name: str) -> Any: ...

    def save_output(self, name: str, path: str) -> None: ...

    def continue_as_new(self, input: Any) -> None: ...
