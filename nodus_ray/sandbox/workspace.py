"""The host side of a sandbox's workspace: the uid its commands run as, and its permissions.

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
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "MIN_SANDBOX_UID",
    "MAX_SANDBOX_UID",
    "_is_root",
    "_sandbox_uid",
    "_validate_uid",
    "_seal_workspace",
    "_prepare_workspace",
    "_remove_tree",
]

_UID_BASE = 200_000  # the hashed fallback uids: _UID_BASE .. _UID_BASE + _UID_SPAN - 1
_UID_SPAN = 50_000
# Explicit uids: below 1000 are system accounts (and 0 is root), 65534 is "nobody" (shared by
# NFS squashing and many daemons), and 2**31-1 and above are (uid_t)-1 style sentinels or
# rejected by some tools.
MIN_SANDBOX_UID = 1000
MAX_SANDBOX_UID = 2**31 - 2
_NOBODY_UID = 65534


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
