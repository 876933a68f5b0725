"""One actor's run of an Agent's Python program: sandbox, source, setup, the process, its end.

The run actor owns the journal; the program is the user's code in the run's sandbox, reaching
the actor only through the runtime socket (`server.ProgramServer`). A new actor of the run
(after a crash, a park, a node move) does all of this again: the ``sandbox`` and ``setup``
steps come back from the journal, the program starts from the beginning and replays its
recorded steps, and goes on from the first one that is not recorded.

How it ends: the program returns (``result.json`` and the answer are written: Succeeded), it
raises (Failed ``ProgramFailed`` with the exception and its traceback's tail), it parks (the
server answered ``park``: the process is killed and `Parked` or the cost/resolution exception
goes up to the run actor, which reports Waiting), or the process ends without a word (a CPU or
memory limit: Failed ``ProgramFailed`` saying how, with its last output lines). A process killed
from outside (SIGKILL, the OOM killer) is not the program's doing: it starts again in a new
sandbox process and replays, as under a new actor, at most `MAX_LOST_IN_A_ROW` times in a row
without a newly completed step. The workspace is snapshotted whenever the program stops, so
``ctx.state_dir`` survives a move.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Any

from nodus._runtime import protocol as wire
from nodus.lifecycle import RunReason
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.steps import CHARGE_KIND, Steps
from nodus_ray.money.sandbox_billing import SandboxMeter
from nodus_ray.runtime.conversation import RunFailure
from nodus_ray.runtime.program.model_calls import ModelCalls
from nodus_ray.runtime.program.process_output import LOG_LIMIT, TAIL_LINES, ProcessOutput, failure_text, reap
from nodus_ray.runtime.program.server import ProgramEnd, ProgramServer
from nodus_ray.runtime.program.waits import ProgramWaits, decoded_input
from nodus_ray.runtime.sandbox_charges import charge_process, command_charge, hold, journal_meter, limits_of
from nodus_ray.runtime.turn_record import TurnRecord
from nodus_ray.sandbox import Sandbox, SandboxLimits
from nodus_ray.sandbox.program import ProgramLaunch, start_program, stop_program
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage

__all__ = ["MAX_LOST_IN_A_ROW", "ProgramSpec", "PythonProgram", "parse_memory", "answer_text"]

# A program process killed from outside starts again at most this many times in a row with no
# newly completed step in between (then the run fails ProgramFailed saying so).
MAX_LOST_IN_A_ROW = 3

_SETUP_TIMEOUT_SECONDS = 1800.0
_EXIT_GRACE_SECONDS = 2.0  # after the process ends, how long its last request may take
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)?$")
_UNITS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def parse_memory(text: str | None, default: int = 2 << 30) -> int:
    """``"512Mi"``, ``"2Gi"`` -> bytes (the program's RLIMIT_AS)."""
    if not text:
        return default
    matched = _MEMORY.match(text.strip())
    if matched is None:
        return default
    return int(float(matched.group(1)) * _UNITS[matched.group(2)])


def answer_text(value: Any) -> str:
    """A program's answer: its return value when a str, else that value's JSON."""
    return value if isinstance(value, str) else json.dumps(value, indent=2)


@dataclass(frozen=True)
class ProgramSpec:
    """What of the run and its Agent the program's start needs (pinned in `RunConfig`)."""

    project: str
    run: str
    attempt: int
    input: str
    entrypoint: str  # "module:function"
    source_digest: str | None  # "sha256:<hex>"
    setup: str | None = None
    memory: str | None = None
    cpu_seconds: int = 3600
    cap_usd: Decimal | None = None


@dataclass
class PythonProgram:
    """Runs the program once for this actor; `run` returns its answer or raises how it stopped.

    ``open_sandbox`` makes (or reattaches to) the run's sandbox; ``control`` is the run's
    control-plane client, ``models`` its model steps. ``turns``/``cost_usd`` feed the status
    as the conversation's do.
    """

    spec: ProgramSpec
    steps: Steps
    storage: Storage
    open_sandbox: Callable[[], Sandbox]
    waits: ProgramWaits
    models: ModelCalls
    workspace: WorkspaceSnapshots
    redact: Redactor = field(default_factory=lambda: Redactor({}))
    sandbox: Sandbox | None = None
    sandbox_info: dict[str, Any] = field(default_factory=dict)
    logs: list[str] = field(default_factory=list)
    _log_bytes: int = 0
    _proc: subprocess.Popen[bytes] | None = None
    # The sandbox's account (`money.sandbox_billing`), rebuilt from the journal's charges with the
    # sandbox step; each process this actor starts is a charge step (``charge/process-A-N``).
    meter: SandboxMeter | None = None
    _processes: int = 0

    @property
    def turns(self) -> list[TurnRecord]:
        return self.models.turns

    @property
    def cost_usd(self) -> Decimal:
        return self.models.spend.budget.spent

    @property
    def sandbox_usd(self) -> Decimal:
        """The sandbox compute charged so far: setup, and each program process's CPU and storage."""
        return self.meter.spent if self.meter is not None else Decimal(0)

    async def run(self) -> str:
        runtime = Path(tempfile.mkdtemp(prefix="nodus-rt-"))
        try:
            return await self._run(runtime)
        finally:
            if self._proc is not None:
                await asyncio.to_thread(stop_program, self._proc)
            await asyncio.to_thread(self._write_log)
            shutil.rmtree(runtime, ignore_errors=True)

    async def _run(self, runtime: Path) -> str:
        await self._open_sandbox()
        await asyncio.to_thread(self._materialise, runtime)
        await self._setup()
        spent_before = self.models.spend.budget.spent  # what the replays count comes on top
        lost_in_a_row = 0
        while True:
            completed = self._completed()
            try:
                end = await self._serve_once(runtime)
                break
            except _ProgramLost as lost:
                lost_in_a_row = 1 if self._completed() > completed else lost_in_a_row + 1
                if lost_in_a_row > MAX_LOST_IN_A_ROW:
                    raise RunFailure(
                        RunReason.PROGRAM_FAILED, f"{lost.message} ({lost_in_a_row} times in a row)"
                    ) from None
            await self._rewind(spent_before)
        if end.error is not None:
            raise RunFailure(RunReason.PROGRAM_FAILED, failure_text(end.error))
        try:
            data = json.dumps(end.value, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as bad:
            raise RunFailure(
                RunReason.PROGRAM_FAILED, f"the program's return value is not JSON: {bad}"
            ) from None
        await asyncio.to_thread(
            self.storage.write_bytes, layout.run_result(self.spec.project, self.spec.run), data
        )
        return answer_text(end.value)

    async def _serve_once(self, runtime: Path) -> ProgramEnd:
        """One program process, from its start to its end (raises how it stopped otherwise)."""
        server = ProgramServer(self.steps, _Ops(self), self._facts(), on_log=self._on_log, redact=self.redact)
        socket_path = runtime / "runtime.sock"
        socket_path.unlink(missing_ok=True)  # a lost process's server listened here before
        await server.start(socket_path)
        output = ProcessOutput()
        launch = self._launch(runtime)
        meter = self._meter()
        # The process's largest price is held first (the project's Budget): its CPU limit, and
        # the workspace for `PROGRAM_HOLD_SECONDS` past the last charge.
        reserved = await hold(
            self.models.spend,
            meter,
            launch.limits,
            cpu_limit_seconds=float(self.spec.cpu_seconds),
            standing=True,
        )
        try:
            self._proc = proc = await asyncio.to_thread(start_program, self._sandbox(), launch)
            reader = threading.Thread(target=output.read, args=(proc.stdout,), daemon=True)
            reader.start()
            end = await self._await_end(server, proc, output)
        except Exception:
            await self._snapshot()
            await self._charge_process(reserved)
            raise
        except BaseException:
            await self._snapshot()
            raise
        finally:
            await server.close()
        await self._snapshot()
        await self._charge_process(reserved)
        return end

    def _meter(self) -> SandboxMeter:
        if self.meter is None:
            self.meter = journal_meter(self.models.spend, self.steps)
        return self.meter

    async def _charge_process(self, reserved: Decimal) -> None:
        """Journal the ended process's CPU and the workspace's storage since the last charge, as a
        step of its own (``charge``), at most ``reserved``. Best effort once the process is gone:
        a charge that cannot be written is logged, never the run's end."""
        if self._proc is not None:
            self._processes += 1
            step_id = f"charge/process-{self.spec.attempt}-{self._processes}"
            workspace = Path(self._sandbox().workspace)
            await charge_process(self.steps, self._meter(), self._proc, workspace, reserved, step_id)
        self.models.spend.release_standing()

    def _completed(self) -> int:
        """How many steps the journal holds an end of (progress, for `MAX_LOST_IN_A_ROW`).

        A process's own sandbox charge (kind ``charge``, journaled as each process ends, killed
        ones too) is not progress of the program: counted, every kill would look like progress
        and a program killed again and again would be started forever."""
        return sum(
            1
            for r in self.steps.journal.records
            if r.state in ("Completed", "Failed", "Resolved") and r.kind != CHARGE_KIND
        )

    async def _rewind(self, spent_before: Decimal) -> None:
        """Make this actor what a new one would be before the program starts: a replay index
        at the journal's start, model calls and waits with nothing counted yet (the replay
        counts each recorded charge, turn and message again), then the ``sandbox`` and
        ``setup`` steps asked again (recorded: the sandbox stays the one open)."""
        steps = self.steps = Steps(self.steps.journal)
        self.models = dataclasses.replace(self.models, steps=steps, turns=[])
        self.models.spend.budget.spent = spent_before
        self.waits = dataclasses.replace(self.waits, steps=steps, _consumed={}, _children={}, _spawned={})
        await self._open_sandbox()
        await self._setup()

    async def _await_end(
        self, server: ProgramServer, proc: subprocess.Popen[bytes], output: ProcessOutput
    ) -> ProgramEnd:
        """The server's end (then the process is killed), or the process's: a limit it hit
        fails the run, a kill from outside raises `_ProgramLost` (it starts again)."""
        ended = asyncio.ensure_future(server.finished())
        exited = asyncio.ensure_future(asyncio.to_thread(reap, proc))
        try:
            await asyncio.wait({ended, exited}, return_when=asyncio.FIRST_COMPLETED)
            if not ended.done():  # its last request may still be on its way
                await asyncio.wait({ended}, timeout=_EXIT_GRACE_SECONDS)
            if ended.done():
                await asyncio.to_thread(stop_program, proc)
                return ended.result()  # raises what parked or failed the program
            cpu_used = await exited
            message = self._died(proc, output)
            if self._killed_from_outside(proc, output, cpu_used):
                raise _ProgramLost(message)
            raise RunFailure(RunReason.PROGRAM_FAILED, message)
        finally:
            for future in (ended, exited):
                if not future.done():
                    future.cancel()
            with contextlib.suppress(BaseException):
                await ended

    def _killed_from_outside(
        self, proc: subprocess.Popen[bytes], output: ProcessOutput, cpu_used: float
    ) -> bool:
        """Whether a signal ended the process that none of its limits sent (SIGKILL from a person
        or the OOM killer): its CPU limit gives SIGXCPU, then SIGKILL at the hard limit (its
        CPU time tells), its file-size limit SIGXFSZ, its memory limit a MemoryError."""
        code = proc.returncode
        if code is None or 0 <= code <= 128:
            return False
        signum = -code if code < 0 else code - 128
        if signum in (signal.SIGXCPU, signal.SIGXFSZ):
            return False
        if signum == signal.SIGKILL and cpu_used >= self.spec.cpu_seconds:
            return False
        tail = output.tail()
        return not ("MemoryError" in tail or "Cannot allocate memory" in tail)

    def _died(self, proc: subprocess.Popen[bytes], output: ProcessOutput) -> str:
        code = proc.returncode
        tail = self.redact(output.tail() or "\n".join("".join(self.logs).splitlines()[-TAIL_LINES:]))
        if code is not None and code < 0:
            how = f"was killed by signal {signal.Signals(-code).name}"
        elif code is not None and code > 128:
            how = f"was killed by signal {signal.Signals(code - 128).name}"
        else:
            how = f"exited with code {code}"
        if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or "CPU time limit" in tail:
            how += f" (its CPU limit of {self.spec.cpu_seconds} s)"
        elif "MemoryError" in tail or "Cannot allocate memory" in tail:
            how += f" (its memory limit of {self.spec.memory or '2Gi'})"
        message = f"the program {how} without returning or raising"
        return f"{message}; its last output:\n{tail}" if tail else message

    # -- before the program --------------------------------------------------------------
    def _sandbox(self) -> Sandbox:
        assert self.sandbox is not None
        return self.sandbox

    async def _open_sandbox(self) -> None:
        async def create() -> dict[str, Any]:
            sandbox = await asyncio.to_thread(self.open_sandbox)
            self.sandbox = sandbox
            return {"backend": sandbox.backend, "workspace": str(sandbox.workspace), "note": sandbox.note}

        self.sandbox_info = await self.steps.run(
            "sandbox", "sandbox", create, summary_of=lambda r: f"{r['backend']} sandbox at {r['workspace']}"
        )
        if self.sandbox is None:  # replayed: the workspace exists; reattach to it
            self.sandbox = await asyncio.to_thread(self.open_sandbox)
        if self.sandbox.backend != "bubblewrap":
            # The program is untrusted code: it runs inside bubblewrap or not at all (a Claude
            # run's commands may fall back to plain processes, with a note; a program may not).
            raise RunFailure(
                RunReason.SANDBOX_UNAVAILABLE,
                "a Python agent's program runs only inside bubblewrap, which this node cannot run "
                f"({self.sandbox.note}); install it there (apt-get install bubblewrap)",
            )
        env = getattr(self.sandbox, "env", None)
        if isinstance(env, dict):  # what setup installs lands in the workspace, first on sys.path
            env["PIP_TARGET"] = wire.SANDBOX_SITE_DIR

    def _materialise(self, runtime: Path) -> None:
        """The Agent's source files, read-only, in the runtime dir the sandbox sees."""
        runtime.chmod(0o711)
        source = runtime / "source"
        source.mkdir(mode=0o755)
        digest = self.spec.source_digest
        if not digest:
            raise RunFailure(RunReason.PROGRAM_FAILED, "the Agent has an entrypoint but no source")
        key = layout.agent_source(self.spec.project, digest.split(":", 1)[-1])
        try:
            files = json.loads(self.storage.read_bytes(key))["files"]
        except FileNotFoundError:
            raise RunFailure(
                RunReason.PROGRAM_FAILED, f"the Agent's source {digest} is not in storage"
            ) from None
        for relative, text in files.items():
            parts = PurePosixPath(relative).parts
            if not parts or PurePosixPath(relative).is_absolute() or ".." in parts:
                raise RunFailure(RunReason.PROGRAM_FAILED, f"the source holds a bad path {relative!r}")
            path = source.joinpath(*parts)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            path.write_text(str(text), encoding="utf-8")
            path.chmod(0o644)
        for directory, _dirs, _files in os.walk(source):
            Path(directory).chmod(0o755)

    async def _setup(self) -> None:
        command = self.spec.setup
        if not command:
            return
        sandbox = self._sandbox()
        meter = self._meter()
        reserved = Decimal(0)
        if not self.steps.is_done("setup"):  # held before it can accrue (the project's Budget)
            reserved = await hold(
                self.models.spend, meter, limits_of(sandbox), timeout_seconds=_SETUP_TIMEOUT_SECONDS
            )
        ran: list[dict[str, Any]] = []

        async def install() -> dict[str, Any]:
            result = await asyncio.to_thread(sandbox.run, command, timeout=_SETUP_TIMEOUT_SECONDS)
            await asyncio.to_thread(self._snapshot_now)
            done = {**result.to_dict(), "output": self.redact(result.output)}
            done.update(command_charge(meter, result, reserved))
            ran.append(done)
            return done

        done = await self.steps.run(
            "setup", "setup", install, summary_of=lambda r: f"setup -> exit {r.get('exit_code')}"
        )
        if ran:  # a recorded setup's charge is counted already (`journal_meter`)
            meter.record(done)
        if done.get("exit_code") != 0:
            tail = "\n".join(str(done.get("output", "")).splitlines()[-TAIL_LINES:])
            how = (
                f"exit {done.get('exit_code')}"
                if done.get("exit_code") is not None
                else str(done.get("limit"))
            )
            raise RunFailure(RunReason.PROGRAM_FAILED, f"setup failed ({how}): {tail}")

    def _facts(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "input": decoded_input(spec.input),
            "run": spec.run,
            "project": spec.project,
            "idempotencyKey": f"{spec.project}/{spec.run}",
            "attempt": spec.attempt,
        }

    def _launch(self, runtime: Path) -> ProgramLaunch:
        return ProgramLaunch(
            argv=[sys.executable, "-m", "nodus._runtime.bootstrap"],
            runtime_dir=runtime,
            limits=SandboxLimits(
                cpu_seconds=self.spec.cpu_seconds,
                memory_bytes=parse_memory(self.spec.memory),
                timeout_seconds=float("inf"),
            ),
            env={
                wire.ENV_SOCKET: wire.SANDBOX_RUNTIME_SOCKET,
                wire.ENV_ENTRYPOINT: self.spec.entrypoint,
                "PIP_TARGET": wire.SANDBOX_SITE_DIR,
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1",
                "ANTHROPIC_API_KEY": f"nodus-run-{secrets.token_hex(16)}",
            },
        )

    # -- while and after -----------------------------------------------------------------
    def _on_log(self, log: wire.Log) -> None:
        text = self.redact(log.text)
        if self._log_bytes + len(text) > LOG_LIMIT:
            return
        self._log_bytes += len(text)
        self.logs.append(text)

    def _write_log(self) -> None:
        if not self.logs:
            return
        key = layout.program_log(self.spec.project, self.spec.run, self.spec.attempt)
        with contextlib.suppress(Exception):  # logs are best effort; the journal is the record
            self.storage.write_bytes(key, "".join(self.logs).encode("utf-8"))

    def _snapshot_now(self) -> None:
        records = self.steps.journal.records
        if records and self.sandbox is not None and Path(self.sandbox.workspace).is_dir():
            self.workspace.after_command(records[-1].seq)

    async def _snapshot(self) -> None:
        await asyncio.to_thread(self._snapshot_now)


class _Ops:
    """The server's `ProgramOps`: waits and outputs from `ProgramWaits`, models from `ModelCalls`."""

    def __init__(self, program: PythonProgram) -> None:
        self._program = program
        waits = program.waits
        self.model = program.models.model
        self.sleep = waits.sleep
        self.wait_for_message = waits.wait_for_message
        self.spawn = waits.spawn
        self.gather = waits.gather
        self.child_output = waits.child_output
        self.send = waits.send
        self.save_output = waits.save_output
        self.continue_as_new = waits.continue_as_new

    async def after_external(self, step_id: str) -> None:
        await self._program._snapshot()

    def replayed(self, step_id: str) -> None:
        self._program.models.replayed(step_id)


class _ProgramLost(Exception):  # noqa: N818 - not an error of the program: it starts again
    """The program's process was killed from outside, without returning or raising."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
