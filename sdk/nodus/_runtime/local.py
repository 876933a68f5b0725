"""``Agent.local``: the same program in this process, journaled in memory, with no server and no Ray.

`run_local` runs the entrypoint with a `ProgramContext` over `LocalJournal`, which answers the
same requests the run actor does (so steps get the same ids and the same JSON check), but
decides everything at once: a step always runs (the journal starts empty), ``sleep`` moves a
virtual clock instead of waiting, ``wait_for_message`` reads the ``messages`` given (a list is
consumed in order) or times out at once, children run in this process when spawned, outputs are
copied to ``outputs_dir``, sends are recorded. Model calls are the anthropic SDK as installed here,
to wherever its environment points; with no Anthropic key configured they are answered by the
offline model, as on a server without one (`local_model.offline_claude`).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import shutil
import tempfile
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from ..errors import Conflict, Invalid
from .context import ProgramContext, error_info, rebuild_error
from .definition import ProgramDefinition, activate
from .local_model import offline_claude
from .protocol import (
    ChildOutput,
    ContinueAsNew,
    ErrorInfo,
    Gather,
    Hello,
    ModelCall,
    Outcome,
    Reply,
    Request,
    SaveOutput,
    Send,
    Sleep,
    Spawn,
    StepBegin,
    StepEnd,
    StepFail,
    WaitForMessage,
)

__all__ = ["run_local", "LocalJournal"]

_OK = Reply(Outcome.OK)
_NONE = Reply(Outcome.RECORDED)


class _ContinueAsNew(BaseException):
    """Unwinds the entrypoint to `run_local`, which starts it again with ``input``."""

    def __init__(self, input: Any) -> None:
        super().__init__("continue_as_new")
        self.input = input


class _Runs:
    """What one `run_local` call's runs share: the entrypoint, the record, the state root."""

    def __init__(self, fn: Any, record: list[dict[str, Any]] | None) -> None:
        self.fn = fn
        self.record = record
        self.state_root = Path(tempfile.mkdtemp(prefix="nodus-local-state-"))
        self.children: dict[str, tuple[Any, dict[str, Any]]] = {}  # run name -> (input, result)

    def run(self, name: str, input: Any, messages: dict[str, Any], outputs: Path) -> Any:
        """Run ``name`` to its end (``continue_as_new`` starts it again with a fresh journal)."""
        generation = 0
        while True:
            journal = LocalJournal(self, name, generation, messages, outputs)
            facts = {
                "input": input,
                "run": name,
                "project": "local",
                "attempt": 1,
                "idempotencyKey": uuid.uuid5(uuid.NAMESPACE_URL, f"nodus-local:{name}").hex,
            }
            ctx = ProgramContext(journal, facts, state_dir=self.state_root / name)
            with activate(ctx):
                try:
                    value = _call(self.fn, ctx, input)
                except _ContinueAsNew as again:
                    input, generation = again.input, generation + 1
                    continue
                return ctx.json_result(value, "the entrypoint's return value")

    def child(self, parent: LocalJournal, key: str, input: Any) -> str:
        name = f"{parent.run}-{key}"
        if name in self.children:
            if self.children[name][0] != input:
                raise Conflict(
                    f"child key {key!r} was already used for another input",
                    code="ChildKeyReused",
                    details={"field": "key"},
                )
            return name
        try:
            value = self.run(name, copy.deepcopy(input), {}, parent.outputs / name)
            result: dict[str, Any] = {"ok": True, "value": value}
        except Exception as exc:  # noqa: BLE001 - a failed child is its parent's result to gather
            info = error_info(exc)
            cause = f"{info.type.removeprefix('builtins.')}: {info.message}"
            error = {
                "type": "nodus.errors.AgentRunFailed",
                "message": f"{name}: Failed (ProgramFailed): {cause}",
                "run": name,
                "phase": "Failed",
                "reason": "ProgramFailed",
            }  # the actor's shape
            result = {"ok": False, "error": error}
        self.children[name] = (input, result)
        return name


def _call(fn: Any, ctx: ProgramContext, input: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(ctx, input))
    result = fn(ctx, input)
    return asyncio.run(result) if inspect.iscoroutine(result) else result


class LocalJournal:
    """The run actor's answers, decided in memory for one generation of one local run."""

    def __init__(
        self, runs: _Runs, run: str, generation: int, messages: dict[str, Any], outputs: Path
    ) -> None:
        self._runs = runs
        self.run = run
        self.generation = generation
        self.messages = messages
        self.outputs = outputs
        self.entries: list[dict[str, Any]] = []
        self._counts: Counter[str] = Counter()
        self._clock = datetime.now(UTC)
        self._executing: str | None = None

    def _id(self, name: str) -> str:
        self._counts[name] += 1
        return f"{name}-{self._counts[name]}"

    def _journal(self, step_id: str, kind: str, **fields: Any) -> None:
        entry = {"run": self.run, "generation": self.generation, "id": step_id, "kind": kind, **fields}
        self.entries.append(entry)
        if self._runs.record is not None:
            self._runs.record.append(entry)

    def post(self, request: Request) -> None:
        self.call(request)

    def call(self, request: Request) -> Reply:
        match request:
            case StepBegin(name=name):
                self._executing = self._id(name)
                return Reply(Outcome.EXECUTE)
            case StepEnd(value=value):
                self._journal(self._executing or "?", "step", value=value)
                return _OK
            case StepFail(error=error):
                self._journal(self._executing or "?", "step", error=error.type)
                return _OK
            case Sleep(seconds=seconds, until=until):
                if seconds is not None:
                    self._clock += timedelta(seconds=seconds)
                elif until is not None:
                    self._clock = max(self._clock, datetime.fromisoformat(until))
                self._journal(self._id("sleep"), "sleep", value=self._clock.isoformat())
                return _NONE
            case WaitForMessage(name=name):
                value = self._message(name)
                self._journal(self._id(f"message/{name}"), "inbox", value=value)
                return Reply(Outcome.RECORDED, value)
            case Spawn(input=input, key=key):
                child = self._runs.child(self, key, input)
                self._journal(f"spawn/{key}", "spawn", value={"name": child})
                return Reply(Outcome.RECORDED, {"name": child})
            case Gather(children=children):
                results = [self._result(child) for child in children]
                self._journal(self._id("gather"), "gather", value=results)
                return Reply(Outcome.RECORDED, results)
            case ChildOutput(child=child, name=name):
                return Reply(Outcome.RECORDED, self._child_output(child, name))
            case Send(target=target, name=name, payload=payload):
                self._journal(
                    self._id("send"), "send", value={"target": target, "name": name, "payload": payload}
                )
                return _NONE
            case SaveOutput(name=name, path=path):
                self._save(name, path)
                return _NONE
            case ContinueAsNew(input=input):
                raise _ContinueAsNew(input)
            case ModelCall():
                raise RuntimeError("Agent.local sends model calls with the anthropic SDK directly")
            case Hello():
                return Reply(Outcome.OK, {"run": self.run})
        return _OK  # Log, Return, Raise: nothing to decide in memory

    def _message(self, name: str) -> Any:
        if name not in self.messages:
            return {"timedOut": True}
        waiting = self.messages[name]
        if isinstance(waiting, list):
            if not waiting:
                return {"timedOut": True}
            return waiting.pop(0)
        return self.messages.pop(name)

    def _result(self, child: str) -> dict[str, Any]:
        if child not in self._runs.children:
            raise Invalid(f"{child} is not a child of this local run", details={"field": "children"})
        return self._runs.children[child][1]

    def _child_output(self, child: str, name: str) -> dict[str, Any]:
        path = self.outputs / child / name
        if not path.is_file():
            raise FileNotFoundError(f"child {child} saved no output {name!r}")
        data = path.read_bytes()
        try:
            return {"text": data.decode("utf-8")}
        except UnicodeDecodeError:
            import base64

            return {"base64": base64.b64encode(data).decode("ascii")}

    def _save(self, name: str, path: str) -> None:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"an output's name is a plain name such as 'report', not {name!r}")
        source = Path(path)
        if not source.is_file():
            raise FileNotFoundError(f"save_output {name}: no file {path}")
        self.outputs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, self.outputs / name)
        self._journal(
            self._id(f"output/{name}"), "output", value={"name": name, "bytes": source.stat().st_size}
        )

    def fail(self, error: ErrorInfo, cause: BaseException | None = None) -> NoReturn:
        raise rebuild_error(ErrorInfo(error.type, error.message)) from cause

    def stop(self) -> NoReturn:
        raise RuntimeError("continue_as_new did not restart the local run")  # pragma: no cover


def run_local(
    definition: ProgramDefinition,
    input: Any = None,
    *,
    messages: dict[str, Any] | None = None,
    outputs_dir: Path | None = None,
    journal: list[dict[str, Any]] | None = None,
) -> Any:
    """Run ``definition``'s entrypoint here with an in-memory journal and return its JSON value.

    ``messages`` answers ``wait_for_message(name)`` (a list: one message per wait, in order);
    a name with none left times out at once (None). Outputs are copied under ``outputs_dir``
    (a temporary directory by default), a child's under ``<outputs_dir>/<child run name>/``.
    ``journal``, when given, receives one entry per journaled step of every run, in order.
    The program's exceptions propagate as they are raised.
    """
    fn = definition.entrypoint_fn
    if fn is None:
        raise Invalid(
            "the agent has no entrypoint: decorate a function with @agent.entrypoint",
            details={"field": "entrypoint"},
        )
    outputs = Path(outputs_dir) if outputs_dir is not None else Path(tempfile.mkdtemp(prefix="nodus-local-"))
    runs = _Runs(fn, journal)
    try:
        with offline_claude():
            return runs.run("local", copy.deepcopy(input), copy.deepcopy(dict(messages or {})), outputs)
    finally:
        shutil.rmtree(runs.state_root, ignore_errors=True)
