"""The program's requests the actor carries out itself: timers, messages, children, outputs.

Each is one journaled step. What makes them durable is what they record the first time they
run: a timer's wake time (a ``Started`` record, never rewritten, so a replay an hour later
still wakes at the same moment), the message a wait took (its seq, so the next wait of that
name reads after it), a child's name, a send's message key. A wait that cannot be answered
yet raises `Parked`: the run waits with no actor and no process, and the control plane
starts a new actor when the timer, the message or the children's end arrives.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from nodus._runtime import protocol as wire
from nodus.errors import NodusError
from nodus.lifecycle import RunPhase, RunReason
from nodus_ray.durable.steps import StepFailed, Steps
from nodus_ray.runtime.conversation import RunFailure
from nodus_ray.runtime.program.server import ContinuedAsNew, Parked
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import format_timestamp, parse_timestamp

__all__ = ["ProgramControlPlane", "MAX_OUTPUT_BYTES", "ProgramWaits", "decoded_input", "encoded_payload"]

MAX_OUTPUT_BYTES = 64 << 20  # a saved output, whole, in one storage object
_ENDED = {RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED}


def decoded_input(text: Any) -> Any:
    """A run's input, or a message's payload, as the program gets it: the JSON value the SDK
    encoded (``run.send("approval", True)`` arrives as ``True``), else the text itself."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def encoded_payload(value: Any) -> str:
    """What ``ctx.send`` stores: a message is text, so a non-str payload travels as its JSON,
    the same encoding `AgentRun.send` uses (and `decoded_input` reverses)."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


class ProgramControlPlane(Protocol):
    """The control-plane calls a program's run makes (`control.client.ControlPlaneClient`)."""

    async def next_message(
        self, project: str, name: str, after_seq: int, message_name: str | None = None
    ) -> dict[str, Any] | None: ...

    async def send_message(
        self,
        project: str,
        name: str,
        payload: Any,
        message_key: str | None = None,
        message_name: str = "message",
    ) -> dict[str, Any]: ...

    async def spawn_child(
        self,
        project: str,
        parent: str,
        key: str,
        input_text: str,
        deadline: str | None,
        cap_usd: str | None,
    ) -> dict[str, Any]: ...

    async def children_status(self, project: str, parent: str, names: list[str]) -> list[dict[str, Any]]: ...

    async def continue_as_new(
        self,
        project: str,
        name: str,
        attempt: int,
        generation: int,
        input_text: str,
        read: dict[str, int] | None = None,
    ) -> dict[str, Any]: ...


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class ProgramWaits:
    """Timers, messages, children, sends and outputs of one run's program, over its `Steps`.

    ``cap_usd`` is the run's own cap (None: uncapped); ``spent`` says what the run itself has
    spent so far. A child's cap is what is left of the run's after its own spend and the caps
    of its unfinished children (a finished child counts what it cost), so a tree of runs
    never spends past its root's cap.
    """

    steps: Steps
    control: ProgramControlPlane
    storage: Storage
    project: str
    run: str
    workspace: Path
    cap_usd: Decimal | None = None
    spent: Callable[[], Decimal] = lambda: Decimal(0)
    clock: Callable[[], datetime] = _now
    attempt: int = 0  # the actor's (a zombie's continue_as_new is refused)
    generation: int = 0  # the journal generation this program runs in
    # The last message seq of each name the earlier generations took: a message is read once
    # over the whole run, not once per generation.
    read_before: dict[str, int] = field(default_factory=dict)
    _consumed: dict[str, int] = field(default_factory=dict)  # message name -> last seq taken
    _children: dict[str, Decimal | None] = field(default_factory=dict)  # child -> committed USD
    _spawned: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (child, input JSON)

    def __post_init__(self) -> None:
        for name, seq in self.read_before.items():
            self._consumed[name] = max(self._consumed.get(name, 0), int(seq))

    # -- timers ----------------------------------------------------------------------------
    async def sleep(self, step_id: str, request: wire.Sleep) -> Any:
        if request.until is not None:
            try:
                wake = parse_timestamp(request.until)
            except ValueError:
                raise StepFailed(
                    step_id, _error("ValueError", f"not an RFC 3339 time: {request.until!r}")
                ) from None
            if wake.tzinfo is None:
                wake = wake.replace(tzinfo=UTC)
        else:
            wake = self.clock() + timedelta(seconds=max(0.0, float(request.seconds or 0)))
        begun = await self.steps.begin(
            step_id,
            "sleep",
            effect="idempotent",
            started={"wakeAt": format_timestamp(wake)},
            keep_started=True,
        )
        if begun.recorded:
            return None
        wake_at = str((begun.started or {}).get("wakeAt") or format_timestamp(wake))
        if self.clock() < parse_timestamp(wake_at):
            raise Parked(RunReason.SLEEPING, f"sleeping until {wake_at}", wake_at=wake_at)
        await self.steps.end(
            step_id, "sleep", {"wakeAt": wake_at}, attempt=begun.attempt, summary=f"woke at {wake_at}"
        )
        return None

    # -- messages --------------------------------------------------------------------------
    async def wait_for_message(self, step_id: str, request: wire.WaitForMessage) -> Any:
        name = request.name
        after = self._consumed.get(name, 0)
        started: dict[str, Any] = {"message": name}
        if request.timeout_seconds is not None:
            started["timeoutAt"] = format_timestamp(self.clock() + timedelta(seconds=request.timeout_seconds))
        begun = await self.steps.begin(
            step_id, "inbox", effect="idempotent", started=started, keep_started=True
        )
        if begun.recorded:
            return self._took(name, begun.value)
        arrived = await self.control.next_message(self.project, self.run, after, message_name=name)
        if arrived is not None:
            value: dict[str, Any] = {
                "seq": int(arrived["seq"]),
                "payload": arrived.get("payload"),
                "messageKey": arrived.get("messageKey"),
            }
            summary = f"message {value['seq']} ({name})"
        else:
            timeout_at = (begun.started or {}).get("timeoutAt")
            if timeout_at is None or self.clock() < parse_timestamp(str(timeout_at)):
                raise Parked(
                    RunReason.AWAITING_MESSAGE,
                    f"waiting for a message {name!r}",
                    wake_at=None if timeout_at is None else str(timeout_at),
                    waiting_for={"message": name, "after": after},
                )
            value, summary = {"timedOut": True}, f"no message {name!r} before {timeout_at}"
        await self.steps.end(step_id, "inbox", value, attempt=begun.attempt, summary=summary)
        return self._took(name, value)

    def _took(self, name: str, value: Any) -> Any:
        if not isinstance(value, dict) or value.get("timedOut"):
            return {"timedOut": True}
        self._consumed[name] = max(self._consumed.get(name, 0), int(value.get("seq") or 0))
        return decoded_input(value.get("payload"))

    async def send(self, step_id: str, request: wire.Send) -> Any:
        async def deliver() -> Any:
            # The key makes the delivery once: a replay that sends again is the same message.
            sent = await self.control.send_message(
                self.project,
                request.target,
                encoded_payload(request.payload),
                f"{self.run}/{step_id}",
                request.name,
            )
            return {"target": request.target, "seq": sent.get("seq") if isinstance(sent, dict) else None}

        return await self._once(step_id, "send", deliver, lambda v: f"to {v['target']}")

    # -- children --------------------------------------------------------------------------
    def _child_cap(self) -> Decimal | None:
        if self.cap_usd is None:
            return None
        committed = sum((c for c in self._children.values() if c is not None), Decimal(0))
        return max(Decimal(0), self.cap_usd - self.spent() - committed)

    async def spawn(self, step_id: str, request: wire.Spawn) -> Any:
        text = json.dumps(request.input, separators=(",", ":"))
        earlier = self._spawned.get(request.key)
        if earlier is not None:
            # The same key again in this program: the same child (no second step), or, with
            # another input, the control plane's ChildKeyReused, without asking it.
            if earlier[1] != text:
                raise StepFailed(
                    step_id,
                    _error(
                        "nodus.errors.Conflict",
                        f"child key {request.key!r} was spawned with another input (ChildKeyReused)",
                    ),
                )
            return {"name": earlier[0]}
        begun = await self.steps.begin(step_id, "spawn", effect="idempotent", write_started=False)
        if begun.recorded:
            if begun.error is not None:
                raise StepFailed(step_id, begun.error)
            value = begun.value if isinstance(begun.value, dict) else {}
        else:
            cap = self._child_cap()
            try:
                created = await self.control.spawn_child(
                    self.project,
                    self.run,
                    request.key,
                    text,
                    request.deadline,
                    None if cap is None else str(cap),
                )
            except Exception as refused:  # noqa: BLE001 - the program gets it as the step's error
                error = _error(type(refused).__name__, str(getattr(refused, "message", refused)))
                await self.steps.fail(step_id, "spawn", error, attempt=begun.attempt)
                raise StepFailed(step_id, error) from None
            value = {"name": str(created["name"]), "capUSD": None if cap is None else str(cap)}
            await self.steps.end(
                step_id, "spawn", value, attempt=begun.attempt, summary=f"child {value['name']}"
            )
        cap_text = value.get("capUSD")
        self._children[str(value.get("name"))] = None if cap_text is None else Decimal(str(cap_text))
        self._spawned[request.key] = (str(value.get("name")), text)
        return {"name": value.get("name")}

    async def gather(self, step_id: str, request: wire.Gather) -> Any:
        begun = await self.steps.begin(step_id, "gather", effect="idempotent", write_started=False)
        if begun.recorded:
            results = begun.value if isinstance(begun.value, list) else []
            self._settle_children(request.children, results)
            return results
        statuses = await self.control.children_status(self.project, self.run, list(request.children))
        waiting = [s["name"] for s in statuses if s.get("phase") not in _ENDED]
        if waiting:
            raise Parked(
                RunReason.AWAITING_CHILDREN,
                f"waiting for {len(waiting)} of {len(statuses)} children",
                waiting_for={"children": waiting},
            )
        results = [await asyncio.to_thread(self._child_result, s) for s in statuses]
        await self.steps.end(
            step_id,
            "gather",
            results,
            attempt=begun.attempt,
            summary=f"{sum(1 for r in results if r['ok'])} of {len(results)} children succeeded",
        )
        self._settle_children(request.children, results)
        return results

    def _settle_children(self, names: list[str], results: list[Any]) -> None:
        """A gathered child's commitment becomes what it actually cost."""
        for name, result in zip(names, results, strict=False):
            if isinstance(result, dict) and name in self._children:
                self._children[name] = Decimal(str(result.get("costUSD") or "0"))

    def _child_result(self, status: dict[str, Any]) -> dict[str, Any]:
        name = str(status["name"])
        cost = str(status.get("costUSD") or "0")
        if status.get("phase") == RunPhase.SUCCEEDED:
            try:
                value = json.loads(self.storage.read_bytes(layout.run_result(self.project, name)))
            except FileNotFoundError:
                value = None
            return {"ok": True, "value": value, "name": name, "costUSD": cost}
        error = {
            "type": "nodus.errors.AgentRunFailed",
            "message": f"{name}: {status.get('phase')} ({status.get('reason')}): {status.get('message') or ''}",
            "run": name,
            "phase": status.get("phase"),
            "reason": status.get("reason"),
        }
        return {"ok": False, "error": error, "name": name, "costUSD": cost}

    async def child_output(self, step_id: str, request: wire.ChildOutput) -> Any:
        async def read() -> Any:
            key = layout.run_output(self.project, request.child, request.name)
            try:
                data = await asyncio.to_thread(self.storage.read_bytes, key)
            except FileNotFoundError:
                raise StepFailed(
                    step_id, _error("KeyError", f"run {request.child} saved no output {request.name!r}")
                ) from None
            try:
                return {"text": data.decode("utf-8")}
            except UnicodeDecodeError:
                return {"base64": base64.b64encode(data).decode("ascii")}

        return await self._once(step_id, "child-output", read, lambda v: f"{request.child}/{request.name}")

    # -- outputs ---------------------------------------------------------------------------
    async def save_output(self, step_id: str, request: wire.SaveOutput) -> Any:
        async def save() -> Any:
            path = self._workspace_file(step_id, request.path)
            size = path.stat().st_size
            if size > MAX_OUTPUT_BYTES:
                raise StepFailed(
                    step_id, _error("ValueError", f"{request.path} is {size} bytes, over {MAX_OUTPUT_BYTES}")
                )
            data = await asyncio.to_thread(path.read_bytes)
            key = layout.run_output(self.project, self.run, request.name)
            await asyncio.to_thread(self.storage.write_bytes, key, data)
            return {"name": request.name, "bytes": len(data)}

        return await self._once(step_id, "output", save, lambda v: f"{v['name']}: {v['bytes']} bytes")

    def _workspace_file(self, step_id: str, given: str) -> Path:
        """The host file of a workspace path; refused when it leaves the workspace (``..``, links)."""
        relative = given
        if given.startswith("/tmp/workspace/") or given == "/tmp/workspace":
            relative = given[len("/tmp/workspace") :].lstrip("/")
        elif os.path.isabs(given):
            raise StepFailed(step_id, _error("ValueError", f"{given} is not in the workspace"))
        root = self.workspace.resolve()
        path = (root / relative).resolve()
        if path != root and root not in path.parents:
            raise StepFailed(step_id, _error("ValueError", f"{given} is not in the workspace"))
        if not path.is_file():
            raise StepFailed(step_id, _error("FileNotFoundError", f"{given}: no such file in the workspace"))
        return path

    # -- continue as new -------------------------------------------------------------------
    async def continue_as_new(self, step_id: str, request: wire.ContinueAsNew) -> Any:
        """Journal the new input as this generation's last step, then have the control plane
        record the next generation (`control.generations`) and raise `ContinuedAsNew`.

        A replay that reaches the recorded step asks the plane again with the journal's input
        (not the one the program computed now): the same switch, asked twice, is made once.
        """
        input_text = encoded_payload(request.input)  # a run's input is text, as `AgentRun` sends it
        read = dict(self._consumed)
        begun = await self.steps.begin(step_id, "continue-as-new", effect="idempotent", write_started=False)
        if begun.recorded:
            recorded = begun.value if isinstance(begun.value, dict) else {}
            input_text = str(recorded.get("input", input_text))
            read = {str(k): int(v) for k, v in (recorded.get("read") or {}).items()}
        else:
            await self.steps.end(
                step_id,
                "continue-as-new",
                {"input": input_text, "read": read},
                attempt=begun.attempt,
                summary=f"continued as new (generation {self.generation + 1})",
            )
        try:
            switched = await self.control.continue_as_new(
                self.project, self.run, self.attempt, self.generation, input_text, read
            )
        except NodusError as refused:
            raise RunFailure(
                RunReason.PROGRAM_FAILED, f"continue_as_new was refused: {refused.message}"
            ) from None
        raise ContinuedAsNew(
            generation=int(switched["generation"]),
            input_text=input_text,
            first_seq=int(switched.get("firstSeq") or 0),
            prior_usd=str(switched.get("priorUSD") or "0"),
            prior_sandbox_usd=str(switched.get("priorSandboxUSD") or "0"),
            read=read,
        )

    async def _once(
        self,
        step_id: str,
        kind: str,
        action: Callable[[], Any],
        summary: Callable[[Any], str],
    ) -> Any:
        """An idempotent step the actor runs: recorded -> its value, else run and journal it."""
        begun = await self.steps.begin(step_id, kind, effect="idempotent", write_started=False)
        if begun.recorded:
            if begun.error is not None:
                raise StepFailed(step_id, begun.error)
            return begun.value
        try:
            value = await action()
        except StepFailed as failed:
            await self.steps.fail(step_id, kind, failed.error, attempt=begun.attempt)
            raise
        await self.steps.end(step_id, kind, value, attempt=begun.attempt, summary=summary(value))
        return value


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": f"builtins.{kind}" if "." not in kind else kind, "message": message, "traceback": ""}
