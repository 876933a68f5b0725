"""Where a run's ``bash`` tool executes: one sandbox per run, one command at a time.

Isolation model
---------------
The preferred backend is bubblewrap. Each command gets fresh mount, PID, IPC, UTS (and, unless
the run may use the network, network) namespaces:

* the host root is bind-mounted read-only, so the command can read the system's programs and
  libraries but write nowhere on the host except its workspace;
* ``/tmp`` is a private, size-capped tmpfs with the workspace bind-mounted at
  ``/tmp/workspace`` (``--ro-bind / /`` leaves no writable place to create a new mount point,
  and a private ``/tmp`` also hides the Ray session directory ``/tmp/ray``); ``/dev`` is a
  minimal private dev with its own ``/dev/shm``, which hides Ray's object store;
* ``/proc`` belongs to the new PID namespace, so the command sees only its own processes, and
  when the command's shell exits (or we kill bubblewrap) the namespace's init dies and the
  kernel kills everything left in it: nothing outlives a command;
* the environment is cleared down to PATH, HOME, LANG and TERM, so server secrets such as
  API keys never reach the model's commands;
* a seccomp filter (:mod:`nodus_ray.sandbox.seccomp`) refuses the system calls containers have been
  escaped through (mount, namespaces, ptrace, bpf, io_uring, keyrings, kernel modules...);
* the workspace's total size is capped (:mod:`nodus_ray.sandbox.disk_usage`): a command that grows it
  past ``SandboxLimits.disk_bytes`` is killed, under either backend;
* some host directories are hidden under an empty read-only tmpfs, so the command cannot even
  list them: ``/root`` and the server user's home (host credentials: SSH keys, cloud and
  registry logins), Ray's temp directory when it is outside ``/tmp`` (its session directory
  holds the raylet and object store sockets and logs), ``/run`` (the host daemons' sockets,
  such as docker.sock), and whatever the caller passes as
  ``hidden_paths`` (the control plane passes the sandbox root, so no run can browse the other
  runs' workspaces, and the local storage directory). The workspace still works when it lives
  under a hidden directory, because bubblewrap binds it at ``/tmp/workspace`` from the host's
  view of the path, not the sandbox's.

Why the uid drop
----------------
Runs on this platform are served by root. Root is exempt from ``RLIMIT_NPROC``, so a fork bomb
in a sandbox running as (or mapped to) host root would not be stopped. Every command therefore
runs as an unprivileged host uid. The control plane should pass ``uid``: it allocates a unique
one per run, so concurrent runs never share a process budget, and the process fallback's
kill-everything-of-this-uid cleanup never reaches another run. Without ``uid`` the uid is
derived from the workspace path: the same workspace always gets the same uid (a run replayed
after a restart can still write its own files) and different runs only rarely share one.

The workspace directory is owned by that uid with mode 0700 (re-applied around every command,
since the command owns it and could open it up). That is the barrier between runs wherever a
workspace is visible: under the process fallback, or under bubblewrap when the sandbox root is
not hidden. Files inside keep whatever mode the command's umask gives them.

bubblewrap itself still starts as root, and the uid is dropped *inside* the sandbox by
``setpriv`` after the namespaces and mounts are set up. Dropping before bubblewrap (unprivileged
bubblewrap in a user namespace) would make bubblewrap resolve the workspace path as the
dropped uid, which fails whenever any parent directory is private to root (pytest's temp dirs,
``/root/...``). Capabilities are cleared from every set and ``no_new_privs`` is set, so the
command cannot regain privileges through setuid binaries. Unprivileged servers skip the drop
(``uid`` is validated but cannot be used) and run bubblewrap in a user namespace instead.

Resource limits are applied with bash's ``ulimit`` in a short prologue after the drop rather
than in a ``preexec_fn``: Ray workers are multi-threaded and ``preexec_fn`` is not safe there,
while ``Popen``'s own ``user``/``group``/``start_new_session`` run in C.

When bubblewrap cannot run, :class:`ProcessSandbox` is the fallback: same limits, uid drop,
private workspace, cleared environment, timeout and output cap, but no filesystem or network
isolation and no hidden paths.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from nodus_ray.egress import proxy as egress
from nodus_ray.sandbox import seccomp
from nodus_ray.sandbox.disk_usage import DiskWatch, format_bytes

__all__ = [
    "SandboxLimits",
    "CommandResult",
    "Sandbox",
    "BubblewrapSandbox",
    "ProcessSandbox",
    "create_sandbox",
    "bwrap_available",
    "SANDBOX_WORKSPACE",
    "MIN_SANDBOX_UID",
    "MAX_SANDBOX_UID",
]

# Where the workspace appears inside bubblewrap: under the private /tmp because the read-only
# host root has no writable place for a new mount point.
SANDBOX_WORKSPACE = "/tmp/workspace"
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_INNER_UID = 1000  # the uid a user-namespace (unprivileged) sandbox shows its command
_UID_BASE = 200_000  # the hashed fallback uids: _UID_BASE .. _UID_BASE + _UID_SPAN - 1
_UID_SPAN = 50_000
# Explicit uids: below 1000 are system accounts (and 0 is root), 65534 is "nobody" (shared by
# NFS squashing and many daemons), and 2**31-1 and above are (uid_t)-1 style sentinels or
# rejected by some tools.
MIN_SANDBOX_UID = 1000
MAX_SANDBOX_UID = 2**31 - 2
_NOBODY_UID = 65534
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
_READ_CHUNK = 64 << 10
_OUTPUT_KILL_FACTOR = 64  # kill a command once it has written this many times the output cap
_HINT_TAIL_BYTES = 4096  # the end of the stream is kept too: errors usually come last
_POLL_SECONDS = 0.05  # how often the reader re-checks cancel and the deadline
_EXIT_GRACE_SECONDS = 0.5  # after the shell exits, how long a leftover pipe holder may keep writing
_KILL_WAIT_SECONDS = 5.0
_PROBE_TIMEOUT_SECONDS = 15.0
_MIN_TMPFS_BYTES = 16 << 20
# Runtime state of the host's daemons: the docker, containerd and podman sockets, D-Bus,
# systemd's private socket, sshd and database sockets. Nothing a command needs, and a socket a
# command can reach (docker.sock is root-equivalent) is an escape. /var/run is usually a
# symlink to /run; _hide_args resolves it, so it is covered once.
_RUNTIME_DIRS = ("/run", "/var/run")
# Files a networked command needs that often live under /run (systemd-resolved's stub
# resolv.conf): bound back, read-only, inside the hidden /run when the run may use the network.
_NETWORK_FILES = ("/etc/resolv.conf",)


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
    backend: str  # "bubblewrap" or "process"
    workspace: Path  # host directory, writable by the sandbox
    note: str | None  # why the fallback was used, else None

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult: ...

    def cancel(self) -> None: ...

    def delete(self) -> None: ...


def _is_root() -> bool:
    return os.geteuid() == 0


def _sandbox_uid(workspace: Path) -> int:
    """A stable uid per workspace, so a replayed run can write the files it wrote before."""
    digest = hashlib.sha256(str(workspace).encode()).digest()
    return _UID_BASE + int.from_bytes(digest[:8], "big") % _UID_SPAN


def _validate_uid(uid: object) -> int:
    """``uid`` if it is safe to run commands as, else a ValueError saying which uids are."""
    if (
        isinstance(uid, bool)
        or not isinstance(uid, int)
        or not MIN_SANDBOX_UID <= uid <= MAX_SANDBOX_UID
        or uid == _NOBODY_UID
    ):
        raise ValueError(
            f"sandbox uid must be an int from {MIN_SANDBOX_UID} to {MAX_SANDBOX_UID} other than "
            f"{_NOBODY_UID} (nobody), got {uid!r}"
        )
    return uid


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


def _hide_args(paths: Sequence[Path], keep: Sequence[str] = ()) -> list[str]:
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
    """
    resolved = sorted({os.path.realpath(p) for p in paths if os.path.lexists(p)})
    kept_files = sorted({os.path.realpath(p) for p in keep if os.path.isfile(p)})
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
            args += ["--remount-ro", path]
        else:
            args += ["--ro-bind", "/dev/null", path]
    return args


def _capped(value: int, resource_id: int) -> int:
    """``value``, lowered to our own hard limit: an unprivileged ``ulimit`` cannot raise it."""
    _soft, hard = resource.getrlimit(resource_id)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _limits_prologue(limits: SandboxLimits) -> str:
    """Bash that applies the limits, then execs the command in a fresh bash.

    The CPU hard limit is a little above the soft one so the command gets SIGXCPU (which we can
    report as "cpu") instead of an anonymous SIGKILL.
    """
    cpu_soft = max(1, _capped(limits.cpu_seconds, resource.RLIMIT_CPU))
    cpu_hard = max(cpu_soft, _capped(limits.cpu_seconds + 2, resource.RLIMIT_CPU))
    memory_kib = max(1, _capped(limits.memory_bytes, resource.RLIMIT_AS) // 1024)
    file_kib = max(1, _capped(limits.file_size_bytes, resource.RLIMIT_FSIZE) // 1024)
    processes = max(1, _capped(limits.processes, resource.RLIMIT_NPROC))
    common = f"-v {memory_kib} -f {file_kib} -u {processes}"
    return f'ulimit -t {cpu_hard} {common} && ulimit -S -t {cpu_soft} && exec /bin/bash -c "$1" bash'


def _shell_argv(command: str, limits: SandboxLimits) -> list[str]:
    return ["/bin/bash", "-c", _limits_prologue(limits), "nodus-sandbox", command]


def _seal_workspace(workspace: Path, uid: int | None) -> None:
    """Make the workspace directory itself private: mode 0700, owned by the sandbox uid.

    This is the barrier that keeps another run's sandbox (another uid) out wherever the path is
    visible. Re-applied around every command because the command owns the directory and may
    chmod it. Done through one descriptor so the checks and changes hit the same directory.
    """
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if uid is not None and (st.st_uid != uid or st.st_gid != uid):
            os.fchown(fd, uid, uid)
        if st.st_mode & 0o7777 != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _prepare_workspace(workspace: Path, uid: int | None) -> None:
    """Create the workspace, make it private and hand every entry to the sandbox uid.

    Recursive because files put there by the host (or by an older run layout, or an earlier
    uid) must be writable by the command too. ``os.fwalk`` with ``follow_symlinks=False`` and
    dir_fd-relative ``chown`` never follow a symlink, even one swapped in while we walk. A file
    of another owner with more than one link is left alone: it may be a hard link to a file
    outside the workspace (root's), whose owner a chown here would change.
    """
    workspace.mkdir(parents=True, exist_ok=True)
    _seal_workspace(workspace, uid)
    if uid is None:
        return
    # realpath: fwalk does not descend into a top that is itself a symlink.
    for _root, dirs, files, dir_fd in os.fwalk(os.path.realpath(workspace), follow_symlinks=False):
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if st.st_uid == uid and st.st_gid == uid:
                    continue
                if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                    continue  # possibly linked from outside the workspace: never hand it over
                os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)


def _remove_tree(path: Path) -> None:
    """Remove the workspace even where the command dropped write permission on a directory."""

    def retry_writable(func: Any, failed: str, _exc: Any) -> None:
        parent = os.path.dirname(failed)
        os.chmod(parent, 0o700)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, 0o700)
        func(failed)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=retry_writable)


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
        drop = [
            setpriv,
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
        caps, drop = [], []
    return [
        bwrap,
        *namespaces,
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "nodus-sandbox",
        "--ro-bind",
        "/",
        "/",
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
        *_hide_args(hidden, keep=_NETWORK_FILES if allow_network else ()),
        "--bind",
        str(workspace),
        SANDBOX_WORKSPACE,
        "--chdir",
        SANDBOX_WORKSPACE,
        *caps,
        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
        "--",
        *drop,
        *(egress.wrap_argv(command_argv) if egress_socket is not None else command_argv),
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


@lru_cache(maxsize=1)
def _probe_bwrap() -> str | None:
    """None when bubblewrap works here, else why not (becomes the fallback's note).

    Runs a real, trivial sandbox with the same flags as commands use (hidden paths and the
    seccomp filter included), because bwrap being installed says nothing about whether
    namespaces, tmpfs mounts, read-only remounts or seccomp are allowed in this container.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap not found"
    setpriv = shutil.which("setpriv") if _is_root() else None
    if _is_root() and setpriv is None:
        return "setpriv not found (needed to drop root inside bubblewrap)"
    probe_root = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        with tempfile.TemporaryDirectory(prefix="nodus-bwrap-probe-", dir=probe_root) as tmp:
            workspace = Path(tmp)
            uid = _UID_BASE if _is_root() else None
            if uid is not None:
                os.chown(workspace, uid, uid)
            with _seccomp_fd() as seccomp_fd:
                argv = _bwrap_argv(
                    bwrap,
                    setpriv,
                    workspace,
                    ["/bin/bash", "-c", "touch probe"],
                    SandboxLimits(),
                    allow_network=False,
                    host_uid=uid,
                    hidden=_default_hidden_paths(),
                    seccomp_fd=seccomp_fd,
                )
                proc = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=_PROBE_TIMEOUT_SECONDS,
                    env={"PATH": _SANDBOX_PATH},
                    start_new_session=True,
                    pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                )
            if proc.returncode != 0:
                detail = proc.stderr.decode("utf-8", "replace").strip()[-300:]
                return f"bwrap probe failed (exit {proc.returncode}): {detail}"
            if not (workspace / "probe").exists():
                return "bwrap probe ran but could not write its workspace"
    except subprocess.TimeoutExpired:
        return "bwrap probe timed out"
    except OSError as exc:
        return f"bwrap probe failed: {exc}"
    return None


def bwrap_available() -> bool:
    """Whether commands can run under bubblewrap here (probed once per process)."""
    return _probe_bwrap() is None


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
        self._reseal()
        disk = DiskWatch(self.workspace, self.limits.disk_bytes)
        disk.measure_baseline()  # before the command starts: only its own growth counts
        started = time.monotonic()
        deadline = started + wall
        with self._spawn_args(command) as (argv, extra):
            proc = subprocess.Popen(
                argv,
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
        )


def _exit_status(returncode: int) -> int:
    """Shell convention (128 + signal) for both backends; Popen reports a signal as negative."""
    return 128 - returncode if returncode < 0 else returncode


class BubblewrapSandbox(_SandboxBase):
    """Commands in fresh namespaces over a read-only host; see the module docstring.

    ``uid`` (as root) is the host uid commands run as; the control plane allocates one per run.
    ``hidden_paths`` are covered with an empty read-only tmpfs in addition to the defaults
    (``/root``, the server user's home, Ray's temp directory outside ``/tmp``).
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
    ) -> None:
        no_filter = seccomp.unsupported_reason()
        note = f"{no_filter}: commands run without a system call filter" if no_filter else None
        super().__init__(workspace, limits, note=note, uid=uid, hidden_paths=hidden_paths, env=env)
        self.allow_network = allow_network
        self.egress_socket = egress_socket
        self._bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
        self._setpriv = shutil.which("setpriv") if self.host_uid is not None else None

    def _argv(self, command: str, seccomp_fd: int | None = None) -> list[str]:
        return _bwrap_argv(
            self._bwrap,
            self._setpriv,
            self.workspace,
            _shell_argv(command, self.limits),
            self.limits,
            allow_network=self.allow_network,
            host_uid=self.host_uid,
            hidden=self._hidden,
            seccomp_fd=seccomp_fd,
            egress_socket=self.egress_socket,
        )

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


def create_sandbox(
    workspace: Path,
    limits: SandboxLimits = SandboxLimits(),
    *,
    allow_network: bool = False,
    uid: int | None = None,
    hidden_paths: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    egress_socket: Path | None = None,
) -> Sandbox:
    """The best sandbox this host can offer for ``workspace`` (created if missing, made 0700).

    ``uid``: the host uid commands run as when the server is root, unique per run so concurrent
    runs share neither a process budget nor the process fallback's cleanup; ``None`` derives
    one from the workspace path. It must be in ``MIN_SANDBOX_UID..MAX_SANDBOX_UID`` and not
    65534 (ValueError otherwise, even when not root). ``hidden_paths``: absolute host paths
    that bubblewrap commands cannot see (the sandbox root, local storage); the process
    fallback cannot hide anything. ``env``: the Agent's variables for every command.
    ``egress_socket``: the run's egress proxy, the only way out of bubblewrap's empty network;
    the process fallback has no network isolation to route through it.
    """
    reason = _probe_bwrap()
    if reason is None:
        return BubblewrapSandbox(
            workspace,
            limits,
            allow_network=allow_network,
            uid=uid,
            hidden_paths=hidden_paths,
            env=env,
            egress_socket=egress_socket,
        )
    note = f"bubblewrap not available ({reason}); commands run as plain processes without filesystem"
    note += " or network isolation"
    return ProcessSandbox(
        workspace, limits, note=note, allow_network=allow_network, uid=uid, hidden_paths=hidden_paths, env=env
    )
