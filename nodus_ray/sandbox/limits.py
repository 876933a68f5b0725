"""How a sandbox's limits are applied to a command, and how a limit is recognised afterwards.

The limits are set with bash's ``ulimit`` in a short prologue (after the uid drop, under both
backends) rather than in a ``preexec_fn``: Ray workers are multi-threaded and ``preexec_fn`` is
not safe there. Which limit a failed command ran into is inferred from its exit status and its
last words, best effort.
"""

from __future__ import annotations

import resource
import signal

from nodus_ray.sandbox.api import SandboxLimits

__all__ = ["_limits_prologue", "_shell_argv", "_infer_limit"]


def _capped(value: int, resource_id: int) -> int:
    """``value``, lowered to our own hard limit: an unprivileged ``ulimit`` cannot raise it."""
    _soft, hard = resource.getrlimit(resource_id)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _limits_prologue(limits: SandboxLimits, shell: str = "/bin/bash") -> str:
    """Shell that applies the limits, then execs the command in a fresh ``shell`` (bash, or an
    image's sh: busybox's and dash's ``ulimit`` take the same flags).

    The CPU hard limit is a little above the soft one so the command gets SIGXCPU (which we can
    report as "cpu") instead of an anonymous SIGKILL.
    """
    cpu_soft = max(1, _capped(limits.cpu_seconds, resource.RLIMIT_CPU))
    cpu_hard = max(cpu_soft, _capped(limits.cpu_seconds + 2, resource.RLIMIT_CPU))
    memory_kib = max(1, _capped(limits.memory_bytes, resource.RLIMIT_AS) // 1024)
    file_kib = max(1, _capped(limits.file_size_bytes, resource.RLIMIT_FSIZE) // 1024)
    processes = max(1, _capped(limits.processes, resource.RLIMIT_NPROC))
    common = f"-v {memory_kib} -f {file_kib} -u {processes}"
    name = shell.rsplit("/", 1)[-1]
    return f'ulimit -t {cpu_hard} {common} && ulimit -S -t {cpu_soft} && exec {shell} -c "$1" {name}'


def _shell_argv(command: str, limits: SandboxLimits, *, shell: str = "/bin/bash") -> list[str]:
    return [shell, "-c", _limits_prologue(limits, shell), "nodus-sandbox", command]


_FORK_HINTS = ("fork: retry", "fork: resource temporarily unavailable", "cannot fork", "fork failed")
_MEMORY_HINTS = ("memoryerror", "cannot allocate memory", "out of memory", "std::bad_alloc")
_FILE_SIZE_HINTS = ("file size limit exceeded", "file too large")
_CPU_HINTS = ("cpu time limit exceeded",)


def _infer_limit(exit_code: int | None, text: str) -> str | None:
    """Best-effort name of the limit a failed command ran into, from its status and last words."""
    if exit_code is not None and exit_code > 128:
        sig = exit_code - 128
        if sig == signal.SIGXCPU:
            return "cpu"
        if sig == signal.SIGXFSZ:
            return "file-size"
    lowered = text.lower()
    for limit, hints in (
        ("processes", _FORK_HINTS),
        ("memory", _MEMORY_HINTS),
        ("file-size", _FILE_SIZE_HINTS),
        ("cpu", _CPU_HINTS),
    ):
        if any(h in lowered for h in hints):
            return limit
    return None
