"""The grader's private copy of what the agent left in its workspace.

Everything in it was written by the agent, so it is treated as hostile: paths that climb out
(``..``, absolute paths, symlinks pointing outside) read as missing, FIFOs and devices are not
read (a FIFO would block the grader forever), files the grader writes never follow a symlink
the agent planted, and the agent's code only ever runs through :meth:`GradingWorkspace.run`,
in a fresh sandbox without network.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from nodus_ray.sandbox import CommandResult, SandboxLimits, create_sandbox

__all__ = ["GradingWorkspace"]


class GradingWorkspace:
    """A private copy of what the agent left in its workspace, for the grader only.

    ``hidden_paths`` are host paths the grader's sandboxed commands must not see (the sandbox
    root with every run's workspace, local storage). ``uid`` is the host uid those commands run
    as when the grader is root; ``None`` lets the sandbox derive one from the path (see
    :func:`nodus_ray.sandbox.create_sandbox`).
    """

    def __init__(self, root: Path, *, hidden_paths: Sequence[Path] = (), uid: int | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        self.hidden_paths = tuple(Path(p) for p in hidden_paths)
        self.uid = uid
        # What the grader's commands burned here (`run`): billed to the evaluation group.
        self.cpu_seconds = 0.0

    def __repr__(self) -> str:
        return f"GradingWorkspace({str(self.root)!r})"

    def _resolve(self, path: str) -> Path | None:
        """The host path for a workspace-relative ``path``, or None when it would leave the root."""
        if not isinstance(path, str) or not path or "\x00" in path:
            return None
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts:
            return None
        root = os.path.realpath(self.root)
        full = os.path.realpath(os.path.join(root, *pure.parts))
        if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
            return None  # a symlink (somewhere on the way) points out of the workspace
        return Path(full)

    def read_text(self, path: str) -> str | None:
        """The file's text (undecodable bytes replaced), or None: missing, not a regular file, or outside."""
        full = self._resolve(path)
        if full is None:
            return None
        try:
            # O_NONBLOCK: opening a FIFO the agent left must not block; it is refused below.
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = handle.read()
        except OSError:
            return None
        finally:
            os.close(fd)
        return data.decode("utf-8", errors="replace")

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists inside the workspace (a symlink out of it does not count)."""
        full = self._resolve(path)
        return full is not None and os.path.lexists(full)

    def write_text(self, path: str, text: str) -> None:
        """Create a new file the grader needs (a check script), replacing whatever had that name.

        The old entry is removed rather than written through, so a symlink the agent planted
        under that name can never redirect the grader's write onto the host.
        """
        full = self._resolve(str(PurePosixPath(path).parent))
        name = PurePosixPath(path).name
        if full is None or not name or name in (".", ".."):
            raise ValueError(f"cannot write {path!r}: it is not a path inside the workspace")
        target = full / name
        if target.is_dir() and not target.is_symlink():
            raise ValueError(f"cannot write {path!r}: a directory has that name")
        if os.path.lexists(target):
            os.unlink(target)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)

    def run(self, command: str, *, timeout: float = 30.0) -> CommandResult:
        """Run ``command`` with bash in a fresh sandbox over the copy: no network, a timeout.

        Under bubblewrap the copy is mounted at ``/tmp/workspace``; with the process fallback the
        command runs in the copy itself. Either way it is the command's working directory, so
        use relative paths. The sandbox makes the copy private (0700) and, when the grader is
        root, hands it to the sandbox uid; the grader (root) can still read it afterwards.
        """
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        limits = SandboxLimits(cpu_seconds=max(1, math.ceil(timeout)), timeout_seconds=float(timeout))
        sandbox = create_sandbox(
            self.root, limits, allow_network=False, uid=self.uid, hidden_paths=self.hidden_paths
        )
        # Never sandbox.delete(): that would remove the copy the grader is still reading.
        result = sandbox.run(command, timeout=timeout)
        self.cpu_seconds += result.cpu_seconds
        return result
