"""The fallback backend when bubblewrap cannot run: a plain subprocess as the sandbox uid."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nodus_ray.sandbox.api import _SANDBOX_PATH, SandboxLimits
from nodus_ray.sandbox.limits import _shell_argv
from nodus_ray.sandbox.runner import _KILL_WAIT_SECONDS, _SandboxBase

__all__ = ["ProcessSandbox"]


class ProcessSandbox(_SandboxBase):
    """Fallback: a plain subprocess in the workspace, as the sandbox uid when we are root.

    It has the same limits, timeout, output cap, cleared environment and private (0700, owned
    by the sandbox uid) workspace, but no filesystem or network isolation: the command can
    reach the network (``allow_network`` is accepted for a uniform interface but cannot deny
    it), read whatever its uid may, and write anywhere its uid may (for example ``/tmp``).
    ``hidden_paths`` cannot be hidden without a mount namespace; they are recorded and ignored.
    What protects other runs and the host is the uid drop plus the 0700 workspaces: another
    run's workspace and root-private directories such as ``/root`` are unreadable to it.

    Background processes, as root: after every command everything running as the sandbox uid
    is killed with ``kill(-1)`` from that uid, which also reaches children that left the
    command's process group or session (``setsid``, double-forked daemons) and cannot reach
    root's or other uids' processes. With an explicit per-run ``uid`` that is exactly this
    run's processes; with the hashed fallback uid, a run sharing the uid by collision would
    lose its running command too.

    Background processes, not root: there is no uid drop, so the command runs as the server's
    own uid and killing by uid would kill the server (and its Ray workers) too. Only the
    command's process group is killed. A child that calls ``setsid`` or ``setpgid`` (or
    double-forks into a new session, as daemons do) escapes that: it outlives the command and
    keeps running as the server's user, with the command's rlimits, until it exits on its own
    or the server's process tree goes away. The command is still reported as finished once its
    shell exits (a leftover holding the output pipe is given up on after a short grace).
    """

    backend = "process"

    def __init__(
        self,
        workspace: Path,
        limits: SandboxLimits = SandboxLimits(),
        *,
        note: str | None = None,
        allow_network: bool = False,
        uid: int | None = None,
        hidden_paths: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            workspace,
            limits,
            note=note or "bubblewrap not available",
            uid=uid,
            hidden_paths=hidden_paths,
            env=env,
        )
        self.allow_network = allow_network

    def _argv(self, command: str) -> list[str]:
        return _shell_argv(command, self.limits)

    def _env(self) -> dict[str, str]:
        return {
            **self.env,
            "PATH": _SANDBOX_PATH,
            "HOME": str(self.workspace),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
        }

    def _popen_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"env": self._env(), "cwd": str(self.workspace)}
        if self.host_uid is not None:
            # Popen changes directory before dropping the uid, so private parent dirs are fine.
            kwargs.update(user=self.host_uid, group=self.host_uid, extra_groups=[])
        return kwargs

    def _reap_leftovers(self) -> None:
        """Kill every process of the sandbox uid (as root); see the class docstring for why only then."""
        if self.host_uid is None:
            return
        # kill(-1) from the sandbox uid reaches every process of that uid, including ones that
        # left the process group with setsid; it never reaches root's or other uids' processes.
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                ["/bin/bash", "-c", "kill -KILL -1 2>/dev/null; exit 0"],
                user=self.host_uid,
                group=self.host_uid,
                extra_groups=[],
                env={"PATH": _SANDBOX_PATH},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=_KILL_WAIT_SECONDS,
                start_new_session=True,
            )
