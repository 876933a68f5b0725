"""What a sandbox needs to reach its egress proxy: mounts, the command wrapper, proxy variables.

A sandboxed command has a network namespace with only loopback. The host's proxy socket and
the forwarder (:mod:`nodus_ray.egress.forwarder`) are bound into the sandbox's private
``/tmp``; the forwarder listens on ``127.0.0.1:3128``, where the proxy variables point, and
carries every connection over that socket to :class:`nodus_ray.egress.proxy.EgressProxy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "FORWARDER_PATH",
    "SANDBOX_EGRESS_DIR",
    "SANDBOX_FORWARDER",
    "SANDBOX_PROXY_PORT",
    "SANDBOX_SOCKET",
    "bwrap_args",
    "proxy_env",
    "wrap_argv",
]

# Inside the sandbox, under the private /tmp tmpfs: the read-only host root has no other place
# where bubblewrap can create a mount point.
SANDBOX_EGRESS_DIR = "/tmp/.nodus"
SANDBOX_SOCKET = f"{SANDBOX_EGRESS_DIR}/egress.sock"
SANDBOX_FORWARDER = f"{SANDBOX_EGRESS_DIR}/egress_forwarder.py"
SANDBOX_PROXY_PORT = 3128
# The host file bound at SANDBOX_FORWARDER.
FORWARDER_PATH = Path(__file__).resolve().with_name("forwarder.py")
_SANDBOX_PYTHON = "/usr/bin/python3"


def proxy_env() -> dict[str, str]:
    """Proxy variables for the command: both spellings, since tools read one or the other."""
    proxy = f"http://127.0.0.1:{SANDBOX_PROXY_PORT}"
    env: dict[str, str] = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = proxy
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1"
    return env


def bwrap_args(host_socket: Path) -> list[str]:
    """bubblewrap arguments that put the proxy socket and the forwarder into the sandbox.

    They must come after ``--tmpfs /tmp`` (the mount points are created in that tmpfs). The
    directory is made first with mode 0755: bubblewrap would create it 0700 and root-owned,
    which the dropped sandbox uid could not enter. Root-owned, the command cannot replace
    what is in it either.
    """
    return [
        "--perms",
        "0755",
        "--dir",
        SANDBOX_EGRESS_DIR,
        "--ro-bind",
        str(host_socket),
        SANDBOX_SOCKET,
        "--ro-bind",
        str(FORWARDER_PATH),
        SANDBOX_FORWARDER,
    ]


def wrap_argv(argv: Sequence[str], *, python: str = _SANDBOX_PYTHON) -> list[str]:
    """``argv`` run under the forwarder, which exits with the command's own status.

    ``python``: the sandbox's interpreter for it (an image's ``python3`` on an image's root).

    ``-I -S``: the command's environment (PYTHONPATH, PYTHONSTARTUP...) must not change the
    forwarder, and skipping ``site`` saves startup time on every command.
    """
    return [
        python,
        "-I",
        "-S",
        SANDBOX_FORWARDER,
        "--listen",
        f"127.0.0.1:{SANDBOX_PROXY_PORT}",
        "--socket",
        SANDBOX_SOCKET,
        "--",
        *argv,
    ]
