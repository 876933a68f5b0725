"""The host paths a bubblewrap command cannot see: credentials, Ray's sockets, daemons' sockets.

The defaults (``/root``, the server user's home, Ray's temp directory outside ``/tmp``, ``/run``)
plus whatever the caller passes (the sandbox root, local storage), each covered with an empty
read-only mount resolved per command.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["_default_hidden_paths", "_check_hidden_paths", "_hide_args", "_keep_tmp_args", "_NETWORK_FILES"]

# Never hidden by default even if a home directory or Ray temp dir points there (system users
# such as Debian's ``daemon`` have ``/usr/sbin`` as home): the command needs them to run at all.
_SYSTEM_DIRS = (
    "/bin",
    "/sbin",
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/dev",
    "/proc",
    "/sys",
)
# Runtime state of the host's daemons: the docker, containerd and podman sockets, D-Bus,
# systemd's private socket, sshd and database sockets. Nothing a command needs, and a socket a
# command can reach (docker.sock is root-equivalent) is an escape. /var/run is usually a
# symlink to /run; _hide_args resolves it, so it is covered once.
_RUNTIME_DIRS = ("/run", "/var/run")
# Files a networked command needs that often live under /run (systemd-resolved's stub
# resolv.conf): bound back, read-only, inside the hidden /run when the run may use the network.
_NETWORK_FILES = ("/etc/resolv.conf",)


def _within(path: str, parent: str) -> bool:
    """Whether ``path`` is ``parent`` or below it (both absolute and normalized)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _ray_temp_dirs() -> list[str]:
    """Where Ray keeps its sessions (sockets, logs) on this host, as far as we can tell.

    Ray is asked only if this process already imported and initialized it (a Ray worker);
    importing Ray here would cost seconds for a module that does not otherwise need it. Ray's
    own default, ``$RAY_TMPDIR/ray`` or ``$TMPDIR/ray``, covers a cluster started by hand.
    """
    dirs = [os.path.join(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray")]
    ray = sys.modules.get("ray")
    if ray is not None:
        with contextlib.suppress(Exception):  # any Ray version or state: this is best effort
            if ray.is_initialized():
                dirs.append(ray.get_runtime_context().get_temp_dir())
                dirs.append(ray._private.worker.global_worker.node.get_session_dir_path())
    return [d for d in dirs if d]


def _default_hidden_paths() -> list[Path]:
    """Host paths hidden from every bubblewrap command, whatever the caller asks for.

    ``/root`` and the homes of the server's user (and of the ``sudo`` caller) hold host
    credentials; Ray's temp directory holds the session's sockets, through which a command
    could submit work to the cluster as the server. Ones under ``/tmp`` are hidden anyway.
    ``/run`` (and ``/var/run`` if it is a directory of its own) holds the host daemons'
    sockets, ``docker.sock`` among them.
    """
    candidates = ["/root", os.environ.get("HOME", "")]
    with contextlib.suppress(KeyError):
        candidates.append(pwd.getpwuid(os.geteuid()).pw_dir)
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user:
        with contextlib.suppress(KeyError):
            candidates.append(pwd.getpwnam(sudo_user).pw_dir)
    candidates += _ray_temp_dirs()
    hidden: list[Path] = []
    for candidate in candidates:
        if not candidate or not os.path.isabs(candidate):
            continue
        path = os.path.normpath(candidate)
        if path == "/" or any(_within(path, d) or _within(d, path) for d in _SYSTEM_DIRS):
            continue
        if Path(path) not in hidden:
            hidden.append(Path(path))
    hidden += [Path(d) for d in _RUNTIME_DIRS if Path(d) not in hidden]
    return hidden


def _check_hidden_paths(paths: Sequence[Path | str]) -> tuple[Path, ...]:
    """The caller's ``hidden_paths`` as absolute Paths; hiding ``/`` would hide the system."""
    if isinstance(paths, (str, Path)):
        raise TypeError("hidden_paths must be a sequence of paths, not a single path")
    checked: list[Path] = []
    for raw in paths:
        if not os.path.isabs(raw):
            raise ValueError(f"hidden path must be absolute, got {str(raw)!r}")
        path = Path(os.path.normpath(raw))
        if str(path) == "/":
            raise ValueError("cannot hide / (the sandbox needs the host's programs)")
        checked.append(path)
    return tuple(checked)


def _hide_args(paths: Sequence[Path], keep: Sequence[str] = (), keep_dirs: Sequence[str] = ()) -> list[str]:
    """bubblewrap arguments that cover each existing path with an empty read-only mount.

    Resolved now, per command, because paths (Ray's session, a storage directory) can appear
    after the sandbox is made. Symlinks are resolved on the host: the sandbox sees the host's
    root, so the host's target is what must be covered. Paths under ``/tmp`` are skipped (the
    private ``/tmp`` already hides them, and mounting there would only create empty
    directories), as are paths below another hidden one (the mount point could not be created
    in a read-only tmpfs). A directory gets a tmpfs; anything else gets ``/dev/null`` bound over
    it (``nodev`` on the host root makes that unreadable too).

    ``keep``: host files to bind back, read-only, where they fall inside a hidden directory
    (resolved too, so ``/etc/resolv.conf`` pointing into ``/run`` keeps working). The bind
    goes between the tmpfs and its read-only remount, while a mount point can still be made.
    ``keep_dirs``: host directories bound back the same way (a Python program's interpreter
    under a hidden ``/root``); ones under ``/tmp`` are the caller's (`_keep_tmp_args`).
    """
    resolved = sorted({os.path.realpath(p) for p in paths if os.path.lexists(p)})
    kept_files = sorted({os.path.realpath(p) for p in keep if os.path.isfile(p)})
    kept_dirs = sorted({os.path.realpath(p) for p in keep_dirs if os.path.isdir(p)})
    args: list[str] = []
    kept: list[str] = []
    for path in resolved:
        if path == "/" or _within(path, "/tmp") or any(_within(path, k) for k in kept):
            continue
        if not os.path.exists(path):
            continue
        kept.append(path)
        if os.path.isdir(path):
            args += ["--tmpfs", path]
            for file in kept_files:
                if _within(file, path):
                    args += ["--ro-bind", file, file]
            for directory in kept_dirs:
                if _within(directory, path) and directory != path:
                    # bubblewrap would make the mount point's parents 0700 (root's): the
                    # sandbox uid must pass through them to reach the directory.
                    parent = os.path.dirname(directory)
                    between: list[str] = []
                    while parent != path and _within(parent, path):
                        between.insert(0, parent)
                        parent = os.path.dirname(parent)
                    for step in between:
                        args += ["--perms", "0755", "--dir", step]
                    args += ["--ro-bind", directory, directory]
            args += ["--remount-ro", path]
        else:
            args += ["--ro-bind", "/dev/null", path]
    return args


def _keep_tmp_args(keep_dirs: Sequence[str], hidden: Sequence[Path]) -> list[str]:
    """Read-only binds, at their own paths, of the ``keep_dirs`` under ``/tmp`` (a venv there),
    which the private ``/tmp`` would cover; a hidden path inside one is covered again."""
    args: list[str] = []
    kept = sorted({os.path.realpath(d) for d in keep_dirs if os.path.isdir(d)})
    kept = [d for d in kept if _within(d, "/tmp") and d != "/tmp"]
    # bubblewrap makes a mount point's missing parents 0700 and root's: the sandbox uid must
    # pass through them (a clone in /tmp/ci/... with its venv), so they are made 0755 first.
    between: list[str] = []
    for directory in kept:
        parent = os.path.dirname(directory)
        chain: list[str] = []
        while parent != "/tmp" and _within(parent, "/tmp"):
            chain.insert(0, parent)
            parent = os.path.dirname(parent)
        between += [p for p in chain if p not in between and not any(_within(p, k) for k in kept)]
    for step in between:
        args += ["--perms", "0755", "--dir", step]
    for directory in kept:
        if any(_within(directory, k) and directory != k for k in kept):
            continue  # inside another kept directory: bound with it
        args += ["--ro-bind", directory, directory]
    for path in sorted({os.path.realpath(p) for p in hidden if os.path.isdir(p)}):
        if any(_within(path, d) for d in kept):
            args += ["--tmpfs", path, "--remount-ro", path]
    return args
