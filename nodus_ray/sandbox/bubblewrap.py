"""The preferred backend: each command in fresh namespaces over a read-only host.

See the package docstring (:mod:`nodus_ray.sandbox`) for the isolation model. This module builds
bubblewrap's command line (:func:`_bwrap_argv`), hands it the seccomp filter and runs commands
through it (:class:`BubblewrapSandbox`).

bubblewrap itself still starts as root, and the uid is dropped *inside* the sandbox by
``setpriv`` after the namespaces and mounts are set up. Dropping before bubblewrap (unprivileged
bubblewrap in a user namespace) would make bubblewrap resolve the workspace path as the
dropped uid, which fails whenever any parent directory is private to root (pytest's temp dirs,
``/root/...``). Capabilities are cleared from every set and ``no_new_privs`` is set, so the
command cannot regain privileges through setuid binaries. Unprivileged servers skip the drop
(``uid`` is validated but cannot be used) and run bubblewrap in a user namespace instead.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

from nodus_ray.egress import wiring as egress
from nodus_ray.sandbox import seccomp
from nodus_ray.sandbox.api import _SANDBOX_PATH, SANDBOX_WORKSPACE, SandboxLimits
from nodus_ray.sandbox.hidden import _NETWORK_FILES, _hide_args, _keep_tmp_args
from nodus_ray.sandbox.image_mounts import host_tool, image_root_args
from nodus_ray.sandbox.images import ImageError, ImageRoot
from nodus_ray.sandbox.limits import _command_argv, _launcher_argv, _shell_argv
from nodus_ray.sandbox.metered import CpuGroup
from nodus_ray.sandbox.runner import _SandboxBase

__all__ = ["BubblewrapSandbox", "_bwrap_argv", "_seccomp_fd"]

_INNER_UID = 1000  # the uid a user-namespace (unprivileged) sandbox shows its command
_MIN_TMPFS_BYTES = 16 << 20


def _bwrap_argv(
    bwrap: str,
    setpriv: str | None,
    workspace: Path,
    command_argv: list[str],
    limits: SandboxLimits,
    *,
    allow_network: bool,
    host_uid: int | None,
    hidden: Sequence[Path] = (),
    seccomp_fd: int | None = None,
    egress_socket: Path | None = None,
    keep_dirs: Sequence[str] = (),
    ro_binds: Sequence[tuple[str, str]] = (),
    image: ImageRoot | None = None,
) -> list[str]:
    """The bubblewrap command line; ``host_uid`` set means we are root and drop inside.

    ``seccomp_fd`` is a descriptor holding the compiled filter (see :mod:`nodus_ray.sandbox.seccomp`),
    which the caller must pass to bubblewrap; bubblewrap installs it right before it executes
    the command (``setpriv`` when dropping root), so the whole command runs under it.

    The command's environment is not on this command line (other host users could read it in
    ``ps``): it is the environment bubblewrap is started with (`BubblewrapSandbox.command_env`).
    ``egress_socket``: the run's egress proxy (`nodus_ray.egress.proxy`), bound into the private
    ``/tmp`` with the forwarder that listens on the sandbox's loopback; the network namespace
    stays empty, so the proxy is the only way out.

    Mounts apply in order: the hidden paths come after the private ``/tmp`` and before the
    workspace bind, so a hidden path can never cover ``/tmp/workspace``. The workspace bind's
    source is resolved by bubblewrap on the host's root, not the new one, so a workspace under
    a hidden directory still works.

    ``keep_dirs`` (a Python program's interpreter, its venv, the ``nodus`` package) stay
    readable at their own paths even inside hidden directories or ``/tmp``; ``ro_binds``
    (host, sandbox) are read-only binds into the private ``/tmp`` (the program's runtime dir).

    ``image``: the run's unpacked image (`nodus_ray.sandbox.images`) is the read-only root
    instead of the host's. Nothing of the host is there to hide (``hidden`` and ``keep_dirs``
    do not apply); ``setpriv`` is bound in with its own libraries (`image_mounts.host_tool`),
    and the egress forwarder runs on the image's ``python3``. The rest is the same.
    """
    tmpfs_bytes = str(max(_MIN_TMPFS_BYTES, limits.file_size_bytes))
    if host_uid is not None:
        # Real root: no user namespace, so the command's host uid is the dropped one and
        # RLIMIT_NPROC applies; setpriv needs CAP_SETUID/SETGID, then clears every capability.
        if setpriv is None:
            raise ValueError("setpriv is required to drop root inside bubblewrap")
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        if not allow_network:
            namespaces.append("--unshare-net")
        caps = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        tool_args, setpriv_argv = host_tool(setpriv) if image is not None else ([], [setpriv])
        drop = [
            *setpriv_argv,
            f"--reuid={host_uid}",
            f"--regid={host_uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    else:
        namespaces = ["--unshare-all", "--unshare-user", "--uid", str(_INNER_UID), "--gid", str(_INNER_UID)]
        if allow_network:
            namespaces.append("--share-net")
        caps, drop, tool_args = [], [], []
    if image is None:
        root = ["--ro-bind", "/", "/"]
        keep = _keep_tmp_args(keep_dirs, hidden)
        hide = _hide_args(hidden, keep=_NETWORK_FILES if allow_network else (), keep_dirs=keep_dirs)
        parents: list[str] = []
    else:
        root, keep, hide = image_root_args(image.rootfs), [], []
        # bubblewrap would make a bind's missing parents 0700 and root's: the uid must pass.
        parents = sorted({str(PurePosixPath(inside).parent) for _, inside in ro_binds} - {"/tmp", "/"})
    if egress_socket is None:
        command = command_argv
    elif image is None:
        command = egress.wrap_argv(command_argv)
    elif image.python is None:
        raise ImageError(f"image {image.ref} has no python3, which the egress forwarder needs")
    else:
        command = egress.wrap_argv(command_argv, python=image.python)
    return [
        bwrap,
        *namespaces,
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "nodus-sandbox",
        *root,
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--perms",
        "1777",
        "--size",
        tmpfs_bytes,
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--size",
        tmpfs_bytes,
        "--tmpfs",
        "/dev/shm",
        *(egress.bwrap_args(egress_socket) if egress_socket is not None else []),
        *tool_args,
        *keep,
        *[arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)],
        *[arg for host, inside in ro_binds for arg in ("--ro-bind", host, inside)],
        *hide,
        "--bind",
        str(workspace),
        SANDBOX_WORKSPACE,
        "--chdir",
        SANDBOX_WORKSPACE,
        *caps,
        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
        "--",
        *drop,
        *command,
    ]


@lru_cache(maxsize=1)
def _seccomp_program() -> bytes | None:
    """This host's compiled seccomp filter, or None where :mod:`nodus_ray.sandbox.seccomp` has none."""
    return seccomp.build_filter()


@contextlib.contextmanager
def _seccomp_fd() -> Iterator[int | None]:
    """A fresh descriptor with the filter for one bubblewrap start (it reads it to the end)."""
    program = _seccomp_program()
    if program is None:
        yield None
        return
    with seccomp.filter_fd(program) as fd:
        yield fd


class BubblewrapSandbox(_SandboxBase):
    """Commands in fresh namespaces over a read-only host; see the module docstring.

    ``uid`` (as root) is the host uid commands run as; the control plane allocates one per run.
    ``hidden_paths`` are covered with an empty read-only tmpfs in addition to the defaults
    (``/root``, the server user's home, Ray's temp directory outside ``/tmp``).
    ``image``: an unpacked image (`nodus_ray.sandbox.images.image_root`) commands run on,
    read-only, with its own shell (bash where it has one, else sh), instead of the host's root.
    """

    backend = "bubblewrap"

    def __init__(
        self,
        workspace: Path,
        limits: SandboxLimits = SandboxLimits(),
        *,
        allow_network: bool = False,
        uid: int | None = None,
        hidden_paths: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
        egress_socket: Path | None = None,
        image: ImageRoot | None = None,
    ) -> None:
        no_filter = seccomp.unsupported_reason()
        note = f"{no_filter}: commands run without a system call filter" if no_filter else None
        super().__init__(workspace, limits, note=note, uid=uid, hidden_paths=hidden_paths, env=env)
        self.allow_network = allow_network
        self.egress_socket = egress_socket
        self.image = image
        self._bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
        self._setpriv = shutil.which("setpriv") if self.host_uid is not None else None

    def _argv(self, command: str, seccomp_fd: int | None = None) -> list[str]:
        # As root the launcher sets the limits before bubblewrap (`_launch`); else the prologue.
        if self.host_uid is not None:
            shell_argv = _command_argv(command, shell=self.shell)
        else:
            shell_argv = _shell_argv(command, self.limits, shell=self.shell)
        return _bwrap_argv(
            self._bwrap,
            self._setpriv,
            self.workspace,
            shell_argv,
            self.limits,
            allow_network=self.allow_network,
            host_uid=self.host_uid,
            hidden=self._hidden,
            seccomp_fd=seccomp_fd,
            egress_socket=self.egress_socket,
            image=self.image,
        )

    @property
    def shell(self) -> str:
        """The shell commands run with: the host's bash, or the image's (bash, else sh)."""
        return self.image.shell if self.image is not None else "/bin/bash"

    def command_env(self) -> dict[str, str]:
        """Exactly the command's environment: bubblewrap passes its own on unchanged."""
        fixed = {"PATH": _SANDBOX_PATH, "HOME": SANDBOX_WORKSPACE, "LANG": "C.UTF-8", "TERM": "dumb"}
        proxy = egress.proxy_env() if self.egress_socket is not None else {}
        return {**self.env, **fixed, **proxy}

    @contextlib.contextmanager
    def _spawn_args(self, command: str) -> Iterator[tuple[list[str], dict[str, Any]]]:
        with _seccomp_fd() as fd:
            extra = self._popen_kwargs()
            if fd is not None:
                extra["pass_fds"] = (fd,)
            yield self._argv(command, fd), extra

    def _popen_kwargs(self) -> dict[str, Any]:
        return {"env": self.command_env(), "cwd": "/"}

    def _launch(self, argv: list[str], group: CpuGroup | None) -> list[str]:
        """As root, one host shell joins the cgroup and sets the limits (`limits._launcher_argv`)."""
        if self.host_uid is None:
            return super()._launch(argv, group)
        return _launcher_argv(self.limits, group.procs_file if group is not None else None, argv)
