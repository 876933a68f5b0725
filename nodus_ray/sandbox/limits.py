"""How a sandbox's limits are applied to a command, and how a limit is recognised afterwards.

The limits are set with the shell's ``ulimit`` rather than in a ``preexec_fn``: Ray workers are
multi-threaded and ``preexec_fn`` is not safe there. Where they are set:

* under bubblewrap as root, by the *launcher* (:func:`_launcher_argv`), the host-side shell that
  also moves the command into its CPU cgroup and then execs bubblewrap. Limits are inherited
  through bubblewrap, ``setpriv`` and the uid drop, so the command gets exactly the same ones;
  they do not bind bubblewrap's setup (root is exempt from ``RLIMIT_NPROC``, and the setup
  writes no files and uses a few MiB and milliseconds). One shell there saves the second
  shell the prologue needed inside (about 1 ms a command, see benchmarks/RESULTS.md);
* everywhere else (the process fallback, unprivileged bubblewrap, programs), in a short
  prologue after the uid drop (:func:`_shell_argv`). Unprivileged bubblewrap must keep it
  there: ``RLIMIT_NPROC`` set before bubblewrap would count the server user's own processes.

Which limit a failed command ran into is inferred from its exit status and its last words,
best effort.
"""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

from nodus_ray.sandbox.api import SandboxLimits

__all__ = ["_launcher_argv", "_limits_prologue", "_shell_argv", "_infer_limit"]


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


def _command_argv(command: str, *, shell: str = "/bin/bash") -> list[str]:
    """The command in a fresh ``shell``, as the prologue's ``exec`` starts it (no limits set)."""
    return [shell, "-c", command, shell.rsplit("/", 1)[-1]]


# The launcher's shell: dash where the host has it (it starts in about half bash's time), else
# bash. Their ``ulimit`` flags differ: dash counts -f in 512-byte blocks and names RLIMIT_NPROC -p,
# which in bash is the (read-only) pipe size.
_DASH = "/bin/dash"
_BASH = "/bin/bash"


def _launcher_argv(limits: SandboxLimits, cgroup_procs: Path | None, argv: list[str]) -> list[str]:
    """``argv`` (bubblewrap's command line) started from a host shell that first joins the
    command's cgroup (`metered.CpuGroup`; a failed join runs it anyway, as ``CpuGroup.wrap``)
    and sets the limits, as the prologue would (see the module docstring)."""
    cpu_soft = max(1, _capped(limits.cpu_seconds, resource.RLIMIT_CPU))
    cpu_hard = max(cpu_soft, _capped(limits.cpu_seconds + 2, resource.RLIMIT_CPU))
    memory_kib = max(1, _capped(limits.memory_bytes, resource.RLIMIT_AS) // 1024)
    file_bytes = _capped(limits.file_size_bytes, resource.RLIMIT_FSIZE)
    processes = max(1, _capped(limits.processes, resource.RLIMIT_NPROC))
    if os.path.exists(_DASH):
        shell = _DASH
        flags = [f"-t {cpu_hard}", f"-v {memory_kib}", f"-f {max(1, file_bytes // 512)}", f"-p {processes}"]
    else:
        shell = _BASH
        flags = [f"-t {cpu_hard}", f"-v {memory_kib}", f"-f {max(1, file_bytes // 1024)}", f"-u {processes}"]
    # One flag per ``ulimit``: dash takes a single resource at a time.
    steps = [f"ulimit {flag}" for flag in flags] + [f"ulimit -S -t {cpu_soft}", 'exec "$@"']
    join = 'echo $$ > "$0" 2>/dev/null; ' if cgroup_procs is not None else ""
    return [shell, "-c", join + " && ".join(steps), str(cgroup_procs or "nodus-launcher"), *argv]


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
