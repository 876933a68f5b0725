"""What bubblewrap mounts when a command runs on an image's root instead of the host's.

The image is the root, read-only (`image_root_args`); nothing of the host's root is there, so
no host path needs hiding. One host program still runs inside: ``setpriv``, which drops root to
the run's uid after the namespaces are made (`nodus_ray.sandbox.bubblewrap`). The image's libc
may be another (musl, an older glibc) or none at all (busybox), so ``setpriv`` is bound with
its own shared libraries and loader into a private directory of ``/tmp`` and started through
that loader (`host_tool`); it then ``exec``s the command, which runs on the image's own
libraries. A Python program on an image runs the image's ``python3`` with the ``nodus``
package and its dependencies bound in read-only (`python_binds`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

__all__ = [
    "SANDBOX_HOST_TOOLS",
    "SANDBOX_PYTHON_LIB",
    "image_root_args",
    "host_tool",
    "python_binds",
]

# Under the private /tmp: the read-only image root has no writable place for a mount point.
SANDBOX_HOST_TOOLS = "/tmp/.nodus-host"
SANDBOX_PYTHON_LIB = "/tmp/.nodus-python"
_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$")


def image_root_args(rootfs: Path) -> list[str]:
    """The image's root, read-only, as the sandbox's ``/``."""
    return ["--ro-bind", str(rootfs), "/"]


@lru_cache(maxsize=8)
def _shared_objects(program: str) -> tuple[tuple[str, ...], str | None]:
    """``program``'s shared libraries and its loader, as ``ldd`` lists them (none: static)."""
    try:
        done = subprocess.run(["ldd", program], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return (), None
    libraries: list[str] = []
    loader: str | None = None
    for line in done.stdout.splitlines():
        match = _LDD_LINE.match(line)
        if match is None:
            continue
        name, path = match.groups()
        if name is None:
            loader = path
        else:
            libraries.append(path)
    return tuple(libraries), loader


def host_tool(program: str) -> tuple[list[str], list[str]]:
    """bubblewrap arguments binding the host ``program`` (with its libraries and loader) into
    `SANDBOX_HOST_TOOLS`, and the argv prefix that starts it there."""
    libraries, loader = _shared_objects(os.path.realpath(program))
    inside = f"{SANDBOX_HOST_TOOLS}/{os.path.basename(program)}"
    args = ["--perms", "0755", "--dir", SANDBOX_HOST_TOOLS, "--ro-bind", program, inside]
    if loader is None:  # static (or no ldd): it runs as it is
        return args, [inside]
    for library in libraries:
        args += ["--ro-bind", library, f"{SANDBOX_HOST_TOOLS}/{os.path.basename(library)}"]
    loader_inside = f"{SANDBOX_HOST_TOOLS}/{os.path.basename(loader)}"
    args += ["--ro-bind", loader, loader_inside]
    return args, [loader_inside, "--library-path", SANDBOX_HOST_TOOLS, inside]


def python_binds() -> tuple[list[tuple[str, str]], str]:
    """Read-only binds (host, sandbox) of the ``nodus`` package and the server's site-packages
    for an image's ``python3``, and the ``PYTHONPATH`` that finds them.

    The dependencies (pydantic's compiled core among them) are the server's: an image whose
    python3 is another minor version than the server's cannot import them, and its program fails
    at its start saying so (docs/images.md).
    """
    import nodus

    package_parent = str(Path(nodus.__file__).resolve().parent.parent)
    binds = [(package_parent, f"{SANDBOX_PYTHON_LIB}/sdk")]
    paths = [f"{SANDBOX_PYTHON_LIB}/sdk"]
    site_dirs = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    for index, directory in enumerate(dict.fromkeys(os.path.realpath(p) for p in site_dirs)):
        if directory == package_parent:
            continue
        inside = f"{SANDBOX_PYTHON_LIB}/site{index}"
        binds.append((directory, inside))
        paths.append(inside)
    return binds, ":".join(paths)
