"""Running one command and waiting for it: deadline, output cap, cancel, disk watch, result.

Shared by both backends (:mod:`nodus_ray.sandbox.bubblewrap` and :mod:`nodus_ray.sandbox.process`),
which only say how a command is started (argv, environment, descriptors) and what to clean up
after it.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from nodus_ray.sandbox.api import CommandResult, SandboxLimits
from nodus_ray.sandbox.disk_usage import DiskWatch, format_bytes
from nodus_ray.sandbox.hidden import _check_hidden_paths, _default_hidden_paths
from nodus_ray.sandbox.limits import _infer_limit
from nodus_ray.sandbox.metered import CpuGroup, MeteredPopen, cpu_seconds_of, open_cpu_group
from nodus_ray.sandbox.workspace import (
    _is_root,
    _prepare_workspace,
    _remove_tree,
    _sandbox_uid,
    _seal_workspace,
    _validate_uid,
)

__all__ = ["_SandboxBase", "_KILL_WAIT_SECONDS"]

_READ_CHUNK = 64 << 10
_OUTPUT_KILL_FACTOR = 64  # kill a command once it has written this many times the output cap
_HINT_TAIL_BYTES = 4096  # the end of the stream is kept too: errors usually come last
_POLL_SECONDS = 0.05  # how often the reader re-checks cancel and the deadline
_EXIT_GRACE_SECONDS = 0.5  # after the shell exits, how long a leftover pipe holder may keep writing
_KILL_WAIT_SECONDS = 5.0


class _Active:
    """The command currently running, shared between ``run`` and ``cancel``."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self.finished = False


class _OutputCap:
    """Keeps the first ``cap`` bytes and the last few KiB of a stream; counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.tail += chunk[-_HINT_TAIL_BYTES:]
        del self.tail[:-_HINT_TAIL_BYTES]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head)

    def text(self) -> str:
        out = self.head.decode("utf-8", "replace")
        if self.dropped:
            out += f"\n[output truncated: {self.dropped} more bytes not shown]"
        return out

    def hint_text(self) -> str:
        return self.head.decode("utf-8", "replace") + "\n" + self.tail.decode("utf-8", "replace")


class _SandboxBase:
    """Runs one command at a time with a deadline, a bounded output buffer and a cancel switch."""

    backend: str = ""

    def __init__(
        self,
        workspace: Path,
        limits: SandboxLimits,
        note: str | None,
        *,
        uid: int | None = None,
        hidden_paths: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workspace = Path(os.path.abspath(workspace))
        self.limits = limits
        self.note = note
        # The Agent's variables (`spec.env`), secret values included: kept off every command line.
        self.env = dict(env or {})
        if uid is not None:
            uid = _validate_uid(uid)  # also when not root, so a bad allocation fails everywhere
        # The host uid commands run as; None when we are not root and cannot drop to another uid.
        self.host_uid: int | None = None
        if _is_root():
            self.host_uid = uid if uid is not None else _sandbox_uid(self.workspace)
        # What the caller asked to hide plus the defaults (credentials, Ray's sockets).
        self.hidden_paths: tuple[Path, ...] = _check_hidden_paths(hidden_paths)
        self._hidden = self.hidden_paths + tuple(
            p for p in _default_hidden_paths() if p not in self.hidden_paths
        )
        _prepare_workspace(self.workspace, self.host_uid)
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._active: _Active | None = None
        self._deleted = False

    # -- backend hooks -------------------------------------------------------------------
    def _argv(self, command: str) -> list[str]:
        raise NotImplementedError

    def _popen_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    @contextlib.contextmanager
    def _spawn_args(self, command: str) -> Iterator[tuple[list[str], dict[str, Any]]]:
        """argv and extra Popen arguments for one command, valid until the process is started."""
        yield self._argv(command), self._popen_kwargs()

    def _launch(self, argv: list[str], group: CpuGroup | None) -> list[str]:
        """The command line actually started: ``argv`` joining ``group`` first, if any."""
        return argv if group is None else group.wrap(argv)

    def _reap_leftovers(self) -> None:
        """Kill whatever the command left behind once it is over; bubblewrap's PID namespace does it."""

    # -- public --------------------------------------------------------------------------
    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        """Run ``/bin/bash -c command`` in the workspace and wait for it (bounded by the timeout)."""
        wall = self.limits.timeout_seconds if timeout is None else float(timeout)
        with self._run_lock:
            if self._deleted:
                raise RuntimeError(f"sandbox {self.workspace} was deleted")
            active = _Active()
            with self._lock:
                self._active = active
            try:
                return self._run_active(active, command, wall)
            finally:
                with self._lock:
                    self._active = None

    def cancel(self) -> None:
        """Kill the running command, if any; safe from any thread, and later runs are unaffected."""
        with self._lock:
            active = self._active
            if active is None or active.finished:
                return
            active.cancelled = True
            proc = active.proc
        if proc is not None:
            self._kill(proc)

    def delete(self) -> None:
        """Stop any command and remove the workspace; the sandbox cannot run commands afterwards."""
        self._deleted = True
        self.cancel()
        # Wait for the killed command to be collected so nothing writes into a half-removed tree.
        acquired = self._run_lock.acquire(timeout=_KILL_WAIT_SECONDS * 2)
        try:
            self._reap_leftovers()
            _remove_tree(self.workspace)
        finally:
            if acquired:
                self._run_lock.release()

    # -- internals -----------------------------------------------------------------------
    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the command's process group (bubblewrap's included, which ends its namespace)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _kill_running(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill the command unless it was already reaped (then its pid may belong to another)."""
        if proc.returncode is None:
            self._kill(proc)

    def _reseal(self) -> None:
        """Put the workspace back to 0700 and the sandbox uid, whatever the command did to it."""
        with contextlib.suppress(FileNotFoundError):  # then the command itself reports it
            _seal_workspace(self.workspace, self.host_uid)

    def _run_active(self, active: _Active, command: str, wall: float) -> CommandResult:
        # A cgroup of its own counts the command's whole process tree (`metered`); where the host
        # has none, ``wait4`` counts what the started process reaped.
        group = open_cpu_group() if self.backend == "bubblewrap" else None
        try:
            return self._run_measured(active, command, wall, group)
        finally:
            if group is not None:
                group.close()

    def _run_measured(
        self, active: _Active, command: str, wall: float, group: CpuGroup | None
    ) -> CommandResult:
        self._reseal()
        disk = DiskWatch(self.workspace, self.limits.disk_bytes)
        disk.measure_baseline()  # before the command starts: only its own growth counts
        started = time.monotonic()
        deadline = started + wall
        with self._spawn_args(command) as (argv, extra):
            proc = MeteredPopen(
                self._launch(argv, group),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so one killpg reaches all of it
                close_fds=True,
                **extra,
            )
        with self._lock:
            active.proc = proc
            cancelled_early = active.cancelled
        if cancelled_early:
            self._kill(proc)
        disk.start(lambda: self._kill_running(proc))
        try:
            assert proc.stdout is not None
            capture = _OutputCap(self.limits.output_bytes)
            kill_after = self.limits.output_bytes * _OUTPUT_KILL_FACTOR
            timed_out = output_killed = False
            exited_at: float | None = None
            with proc.stdout, selectors.DefaultSelector() as selector:
                fd = proc.stdout.fileno()
                selector.register(fd, selectors.EVENT_READ)
                while True:
                    now = time.monotonic()
                    if active.cancelled or disk.killed:
                        break
                    if now >= deadline:
                        timed_out = True
                        break
                    if proc.poll() is not None:
                        exited_at = exited_at or now
                        if now - exited_at > _EXIT_GRACE_SECONDS:
                            break  # something the shell left behind still holds the pipe
                    if selector.select(min(_POLL_SECONDS, max(0.0, deadline - now))):
                        chunk = os.read(fd, _READ_CHUNK)
                        if not chunk:
                            break
                        capture.add(chunk)
                        if capture.total > kill_after:
                            output_killed = True
                            break
                if not (timed_out or output_killed or active.cancelled or disk.killed):
                    # End of output is not the end of the command (it may close its output and go
                    # on), so keep waiting, still bounded by the deadline; cancel() and the disk
                    # watch kill it meanwhile.
                    try:
                        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        timed_out = True
                if timed_out or output_killed or active.cancelled or disk.killed:
                    self._kill(proc)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=_KILL_WAIT_SECONDS)
            with self._lock:
                # From here on a cancel() is too late to change the outcome.
                active.finished = True
                cancel_requested = active.cancelled
            self._kill(proc)  # anything left in the group once the shell is gone
            self._reap_leftovers()
            # After the reap, so nothing is still writing; catches what was written since the last
            # poll (a fast command can fill the cap between two). Such a command is not killed (it
            # has ended) but its result says so, and the next command that grows the workspace is.
            over_disk = disk.finish()
        finally:
            disk.stop()  # on any error above too: never leave the watcher polling
        disk_killed = disk.killed and not timed_out and not output_killed
        self._reseal()  # the next command may be minutes away; don't leave it open meanwhile
        duration = time.monotonic() - started

        cancelled = cancel_requested and not (timed_out or output_killed or disk_killed)
        stopped = cancelled or timed_out or output_killed or disk_killed
        exit_code = None if stopped or proc.returncode is None else _exit_status(proc.returncode)
        output = capture.text()
        if over_disk and not cancelled:
            output += (
                f"\n[disk limit: the workspace uses {format_bytes(disk.usage)}, over its cap of "
                f"{format_bytes(disk.cap)}; delete files to go on]"
            )
        if cancelled:
            limit = None
        elif disk_killed or (over_disk and not (timed_out or output_killed)):
            limit = "disk"
        elif output_killed:
            limit = "output"
        elif timed_out:
            limit = "processes" if _infer_limit(None, capture.hint_text()) == "processes" else "timeout"
        elif exit_code:
            limit = _infer_limit(exit_code, capture.hint_text())
        else:
            limit = None
        return CommandResult(
            exit_code=exit_code,
            output=output,
            truncated=capture.dropped > 0,
            timed_out=timed_out,
            cancelled=cancelled,
            duration_seconds=round(duration, 3),
            limit=limit,
            cpu_seconds=round(max(group.seconds() if group else 0.0, cpu_seconds_of(proc)), 3),
            workspace_bytes=max(disk.baseline, disk.usage),
        )


def _exit_status(returncode: int) -> int:
    """Shell convention (128 + signal) for both backends; Popen reports a signal as negative."""
    return 128 - returncode if returncode < 0 else returncode
