"""Which backend this host gets: a real bubblewrap probe, once per process, then ``create_sandbox``.

Tests that want the process fallback patch :func:`_probe_bwrap` here, where both
:func:`bwrap_available` and :func:`create_sandbox` look it up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from nodus_ray.sandbox.api import _SANDBOX_PATH, Sandbox, SandboxLimits
from nodus_ray.sandbox.bubblewrap import BubblewrapSandbox, _bwrap_argv, _seccomp_fd
from nodus_ray.sandbox.hidden import _default_hidden_paths
from nodus_ray.sandbox.images import ImageError, ImageRoot
from nodus_ray.sandbox.process import ProcessSandbox
from nodus_ray.sandbox.workspace import _UID_BASE, _is_root

__all__ = ["create_sandbox", "bwrap_available", "_probe_bwrap"]

_PROBE_TIMEOUT_SECONDS = 15.0


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


def create_sandbox(
    workspace: Path,
    limits: SandboxLimits = SandboxLimits(),
    *,
    allow_network: bool = False,
    uid: int | None = None,
    hidden_paths: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    egress_socket: Path | None = None,
    image: ImageRoot | None = None,
) -> Sandbox:
    """The best sandbox this host can offer for ``workspace`` (created if missing, made 0700).

    ``uid``: the host uid commands run as when the server is root, unique per run so concurrent
    runs share neither a process budget nor the process fallback's cleanup; ``None`` derives
    one from the workspace path. It must be in ``MIN_SANDBOX_UID..MAX_SANDBOX_UID`` and not
    65534 (ValueError otherwise, even when not root). ``hidden_paths``: absolute host paths
    that bubblewrap commands cannot see (the sandbox root, local storage); the process
    fallback cannot hide anything. ``env``: the Agent's variables for every command.
    ``egress_socket``: the run's egress proxy, the only way out of bubblewrap's empty network;
    the process fallback has no network isolation to route through it. ``image``: the run's
    unpacked image, the commands' root; only bubblewrap can give one (`ImageError` otherwise).
    """
    reason = _probe_bwrap()
    if reason is not None and image is not None:
        raise ImageError(f"image {image.ref} needs bubblewrap, which this node cannot run ({reason})")
    if reason is None:
        return BubblewrapSandbox(
            workspace,
            limits,
            allow_network=allow_network,
            uid=uid,
            hidden_paths=hidden_paths,
            env=env,
            egress_socket=egress_socket,
            image=image,
        )
    note = f"bubblewrap not available ({reason}); commands run as plain processes without filesystem"
    note += " or network isolation"
    return ProcessSandbox(
        workspace, limits, note=note, allow_network=allow_network, uid=uid, hidden_paths=hidden_paths, env=env
    )
