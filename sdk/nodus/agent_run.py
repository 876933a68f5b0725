"""`AgentRun`, the handle of one run (wait, result, answer, steps, send, resolve, cancel, logs),
and `RunContext`, what a durable Python entrypoint will receive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn, Protocol

from .events import afollow_events, log_line
from .handles import _LATER, _encode_input, _ResourceHandle, _run_failed, _unsupported
from .resources import TERMINAL_PHASES, at_cost_cap, awaiting_message
from .view import View

__all__ = ["AgentRun", "RunContext"]


class AgentRun(_ResourceHandle):
    """One AgentRun: `wait`, `result` (the answer text), `answer`, `steps`, `cancel`, `delete`."""

    _collection = "agentruns"
    _kind = "AgentRun"
    # The sequence number of the last message this handle sent: a keep-alive run has caught up
    # (its answer is the answer to that message) once it has read it.
    _sent_seq = 0

    def _caught_up(self, status: dict[str, Any]) -> bool:
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
                or (now.get("phase") == "Waiting" and now.get("reason") != "AwaitingMessage")
            ),
            None,
            lambda phase: f"agentrun/{self.name} is still {phase}",
        )
        return str(self._client.run_answer(self.name, project=self._project).get("answer") or "")

    def steps(self) -> list[View]:
        """The journaled steps in order: sandbox, routing and model calls, commands, the answer."""
        return [View(step) for step in self._client.run_steps(self.name, project=self._project)]

    def cancel(self) -> None:
        """Stop the run and delete its sandbox; it ends Cancelled."""
        self._client.cancel_run(self.name, project=self._project)

    def delete(self) -> None:
        """Cancel the run if unfinished, then delete it with its journal and sandbox."""
        self._client.delete("agentruns", self.name, project=self._project)

    def _later(self, what: str) -> NoReturn:
        raise _unsupported(f"AgentRun.{what}", f"the API does not serve it yet; {_LATER}", what)

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
        *,
        evidence: str | None = None,
        result: Mapping[str, Any] | None = None,
        revision: int | None = None,
    ) -> View:
        """Decide a step whose outcome is unknown (the run waits with ``NeedsResolution``).

        ``decision`` is ``Completed`` (the command did run; ``result={"exitCode": 0, "output":
        "..."}`` is what it returned), ``NoEffect`` (it did nothing: it runs again) or
        ``Cancelled`` (the run fails). ``revision`` is the run's ``metadata.resourceVersion``
        the decision was made on (default: the run as it is now); a stale one is refused with
        `errors.Conflict` (``RevisionMismatch``), so two people cannot both decide.
        """
        if revision is None:
            revision = int((self._refresh().get("metadata") or {}).get("resourceVersion") or 0)
        body: dict[str, Any] = {"step": step_id, "decision": decision, "revision": revision}
        if evidence is not None:
            body["evidence"] = evidence
        if result is not None:
            body["result"] = dict(result)
        self._resource = self._client.resolve_run(self.name, body, project=self._project)
        return View(self._resource)

    def retry(self) -> NoReturn:
        self._later("retry")

    def suspend(self) -> NoReturn:
        self._later("suspend")

    def resume(self) -> NoReturn:
        self._later("resume")

    def children(self) -> NoReturn:
        self._later("children")

    @property
    def outputs(self) -> NoReturn:
        self._later("outputs")

    async def logs(self, follow: bool = False) -> AsyncIterator[str]:
        """The run's log, line by line: its steps, phase changes, turns and answer.

        With ``follow`` it goes on until the run ends (reconnecting by itself if the connection
        drops, without losing or repeating a line); without, it ends once caught up.
        """
        path = self._client._path("agentruns", self._project, self.name, "events")
        async with self._client.async_http() as http:
            async for event in afollow_events(http, path, follow=follow):
                line = log_line(event)
                if line is not None:
                    yield line


# -- RunContext -------------------------------------------------------------------------------


class RunContext(Protocol):
    """What an agent entrypoint receives as ``ctx``; the agent runtime provides the implementation."""

    idempotency_key: str
    state_dir: Path

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
