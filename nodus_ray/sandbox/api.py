"""The sandbox's public types: what a command may use, what it did, and what a sandbox offers.

Plain data and a Protocol, so the run actor, the conversation loop, the environments and the
journal can name them without importing a backend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["SandboxLimits", "CommandResult", "Sandbox", "SANDBOX_WORKSPACE"]

# Where the workspace appears inside bubblewrap: under the private /tmp because the read-only
# host root has no writable place for a new mount point.
SANDBOX_WORKSPACE = "/tmp/workspace"
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits; the process budget is shared by everything running as the sandbox uid."""

    cpu_seconds: int = 60  # RLIMIT_CPU
    memory_bytes: int = 2 << 30  # RLIMIT_AS
    file_size_bytes: int = 256 << 20  # RLIMIT_FSIZE; also the size of the private /tmp tmpfs
    processes: int = 256  # RLIMIT_NPROC (per sandbox uid)
    timeout_seconds: float = 120.0  # wall clock per command
    output_bytes: int = 64 << 10  # combined stdout+stderr cap
    disk_bytes: int = 1 << 30  # the workspace's total allocated size, checked while a command runs


_LIMIT_TEXT: dict[str, str] = {
    "cpu": "CPU time limit exceeded",
    "memory": "memory limit reached",
    "file-size": "file size limit exceeded",
    "processes": "process limit reached",
    "output": "output limit exceeded",
    "timeout": "timeout",
    "disk": "disk limit exceeded",
}


@dataclass(frozen=True)
class CommandResult:
    """What one command did; plain data because the journal records it and replay returns it."""

    exit_code: int | None  # None when killed by the timeout, a cancel, the output or the disk limit
    output: str  # combined stdout+stderr, utf-8 with errors="replace", capped
    truncated: bool
    timed_out: bool
    cancelled: bool
    duration_seconds: float
    limit: str | None  # "timeout", "cpu", "memory", "file-size", "processes", "output", "disk"
    # User + system CPU of the command's process tree (`sandbox.metered`): what its compute is
    # billed on. 0.0 in journals written before it was measured.
    cpu_seconds: float = 0.0
    # The most the workspace held (bytes) before or after the command: its storage is billed on it.
    workspace_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CommandResult:
        # Ignore unknown keys so journals written by a newer version still replay.
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def for_model(self) -> str:
        """The tool result text: how the command ended first, so the model cannot miss a kill."""
        if self.cancelled:
            head = "killed: cancelled"
        elif self.timed_out:
            head = f"killed: timeout after {self.duration_seconds:.1f}s"
            if self.limit and self.limit != "timeout":
                head += f" ({_LIMIT_TEXT.get(self.limit, self.limit)})"
        elif self.exit_code is None:
            head = f"killed: {_LIMIT_TEXT.get(self.limit or '', 'stopped')}"
        else:
            head = f"exit code {self.exit_code}"
            if self.limit:
                head += f" ({_LIMIT_TEXT.get(self.limit, self.limit)})"
        return f"{head}\n{self.output}" if self.output else f"{head}\n(no output)"


@runtime_checkable
class Sandbox(Protocol):
    """One run's sandbox, whichever backend: one command at a time in its workspace."""

    backend: str  # "bubblewrap" or "process"
    workspace: Path  # host directory, writable by the sandbox
    note: str | None  # why the fallback was used, else None

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult: ...

    def cancel(self) -> None: ...

    def delete(self) -> None: ...
