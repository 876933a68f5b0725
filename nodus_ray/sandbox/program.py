"""Starting a durable Python program inside a run's sandbox (rather than one shell command).

The program is the user's code: it runs under the same bubblewrap containment as commands
(namespaces, read-only host, seccomp, hidden paths, the egress proxy, rlimits), with three
additions. The server's own interpreter runs it, so ``sys.base_prefix``, ``sys.prefix`` and
the directory holding the ``nodus`` package are readable at their own paths even where a
hidden directory or the private ``/tmp`` would cover them; the run's runtime directory (the
actor's socket and the Agent's source) is bound read-only at ``SANDBOX_RUNTIME_DIR``; and the
process is long-lived, so the caller owns it (`start_program` returns the ``Popen``) and stops
it with `stop_program`.

On an image (`BubblewrapSandbox.image`) the program runs the image's ``python3`` instead: the
server's interpreter is not there, so the ``nodus`` package and the server's site-packages are
bound in read-only and put on ``PYTHONPATH`` (`image_mounts.python_binds`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nodus._runtime.protocol import SANDBOX_RUNTIME_DIR
from nodus_ray.sandbox.api import _SANDBOX_PATH, Sandbox, SandboxLimits
from nodus_ray.sandbox.bubblewrap import BubblewrapSandbox, _bwrap_argv, _seccomp_fd
from nodus_ray.sandbox.image_mounts import python_binds
from nodus_ray.sandbox.limits import _shell_argv
from nodus_ray.sandbox.metered import MeteredPopen, open_cpu_group

__all__ = ["ProgramLaunch", "interpreter_dirs", "release_program", "start_program", "stop_program"]


def interpreter_dirs() -> list[str]:
    """What the program's interpreter needs to read: its prefixes and the ``nodus`` package."""
    import nodus

    package_parent = str(Path(nodus.__file__).resolve().parent.parent)
    dirs = [os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), package_parent]
    return list(dict.fromkeys(dirs))


@dataclass(frozen=True)
class ProgramLaunch:
    """One program start: ``argv`` in the sandbox, its extra ``env``, the host runtime dir."""

    argv: Sequence[str]
    runtime_dir: Path
    limits: SandboxLimits
    env: dict[str, str] = field(default_factory=dict)


def _path_env() -> str:
    return f"{os.path.dirname(sys.executable)}:{_SANDBOX_PATH}"


def start_program(sandbox: Sandbox, launch: ProgramLaunch) -> subprocess.Popen[bytes]:
    """Start the program in ``sandbox`` (its own process group); stdout and stderr are one pipe.

    ``launch.argv[0]`` is the server's interpreter; on an image it becomes the image's python3.
    """
    argv, keep_dirs = list(launch.argv), interpreter_dirs()
    binds = [(str(launch.runtime_dir), SANDBOX_RUNTIME_DIR)]
    extra_env = {"PATH": _path_env()}
    image = sandbox.image if isinstance(sandbox, BubblewrapSandbox) else None
    if image is not None:
        if image.python is None:
            raise ValueError(f"image {image.ref} has no python3 to run the program with")
        package_binds, python_path = python_binds()
        argv, keep_dirs = [image.python, *argv[1:]], []
        binds += package_binds
        extra_env = {"PATH": _SANDBOX_PATH, "PYTHONPATH": python_path}
    command = "exec " + shlex.join(argv)
    shell = _shell_argv(command, launch.limits, shell=image.shell if image is not None else "/bin/bash")
    if isinstance(sandbox, BubblewrapSandbox):
        sandbox._reseal()
        with _seccomp_fd() as fd:
            argv = _bwrap_argv(
                sandbox._bwrap,
                sandbox._setpriv,
                sandbox.workspace,
                shell,
                launch.limits,
                allow_network=sandbox.allow_network,
                host_uid=sandbox.host_uid,
                hidden=sandbox._hidden,
                seccomp_fd=fd,
                egress_socket=sandbox.egress_socket,
                keep_dirs=keep_dirs,
                ro_binds=binds,
                image=image,
            )
            env = {**sandbox.command_env(), **launch.env, **extra_env}
            # In a cgroup of its own where the host gives one, so its CPU is counted (`metered`).
            group = open_cpu_group()
            proc = MeteredPopen(
                group.wrap(argv) if group is not None else argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=env,
                cwd="/",
                pass_fds=() if fd is None else (fd,),
            )
            proc.cpu_group = group
            return proc
    # A program is untrusted code: never without bubblewrap (`PythonProgram` refuses earlier).
    raise TypeError(f"a program runs only in bubblewrap, not in a {type(sandbox).__name__}")


def stop_program(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGKILL the program's process group (bubblewrap's: its namespace ends with it) and reap it.

    Its cgroup (`metered`) is left for the caller to read and close (`release_program`)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)


def release_program(proc: subprocess.Popen[bytes]) -> None:
    """Remove the stopped program's cgroup, once its CPU figure has been read."""
    group = getattr(proc, "cpu_group", None)
    if group is not None:
        group.close()
        proc.cpu_group = None  # type: ignore[attr-defined]
