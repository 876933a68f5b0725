"""Small OCI images the tests build themselves, from this host's files: never a remote registry.

* `busybox_layout`: an OCI layout holding busybox-static (``/bin/busybox`` and its applets as
  symlinks: ``sh``, ``ls``, ``cat``, ``echo``...) and a marker file ``/etc/nodus-image`` whose
  text names the image, so a test can tell the image's root from the host's;
* ``shell=False``: the same without ``/bin/sh`` (an image commands cannot run on);
* `archive_of`: the layout as an ``oci-archive`` tar (``skopeo copy``);
* `python_layout`: busybox plus this host's ``/usr/bin/python3`` with its shared libraries and
  standard library (no tests, no GUI toolkits): an image whose python3 a Python agent can run.

Built with umoci the way an image is made by hand: ``umoci init``, ``umoci new``, ``umoci unpack
--rootless``, files added to the bundle's rootfs, ``umoci repack``. `TestImages` builds each
image once per test session (the caller's session fixture holds it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "BUSYBOX",
    "APPLETS",
    "MARKER",
    "tools_missing",
    "busybox_layout",
    "archive_of",
    "python_layout",
    "python_missing",
    "TestImages",
]

BUSYBOX = "/bin/busybox"
APPLETS = (
    "sh", "ls", "cat", "echo", "id", "pwd", "touch", "mkdir", "rm", "test", "true", "false",
    "uname", "env", "wc", "head", "grep", "sleep", "printf", "stat", "readlink",
)  # fmt: skip
MARKER = "/etc/nodus-image"  # the image's name, written into every image built here
_HOST_PYTHON = "/usr/bin/python3"
_STDLIB_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "__pycache__",
}


def tools_missing() -> str | None:
    """Why images cannot be built here (None: they can); a test skips with this reason."""
    for tool in ("umoci", "skopeo"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make system-deps)"
    if not os.access(BUSYBOX, os.X_OK):
        return "busybox-static is not installed (make system-deps)"
    return None


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=300)


def _build(
    directory: Path, tag: str, fill: list[tuple[str, Path | str | bytes]], links: Mapping[str, str]
) -> str:
    """An OCI layout ``directory`` whose image ``tag`` holds ``fill`` ((inside, host path or
    content)) and the symlinks ``links`` (inside -> target); returns ``oci:<directory>:<tag>``."""
    if not (directory / "index.json").exists():
        _run("umoci", "init", "--layout", str(directory))
    _run("umoci", "new", "--image", f"{directory}:{tag}")
    bundle = directory.parent / f".{directory.name}-{tag}-bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    _run("umoci", "unpack", "--rootless", "--image", f"{directory}:{tag}", str(bundle))
    rootfs = bundle / "rootfs"
    for inside, source in fill:
        target = rootfs / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            target.write_bytes(source)
            target.chmod(0o644)
        elif isinstance(source, str):
            target.write_text(source)
            target.chmod(0o644)
        elif source.is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    for inside, link_target in links.items():
        link = rootfs / inside.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(link_target)
    _run("umoci", "repack", "--image", f"{directory}:{tag}", str(bundle))
    shutil.rmtree(bundle, ignore_errors=True)
    return f"oci:{directory}:{tag}"


def busybox_layout(
    directory: Path, tag: str = "busybox", *, shell: bool = True, files: Mapping[str, str] | None = None
) -> str:
    """A busybox image in the OCI layout ``directory`` (created if missing): ``oci:DIR:TAG``."""
    applets = [a for a in APPLETS if shell or a != "sh"]
    fill: list[tuple[str, Path | str | bytes]] = [("/bin/busybox", Path(BUSYBOX)), (MARKER, f"{tag}\n")]
    fill += list((files or {}).items())
    return _build(directory, tag, fill, {f"/bin/{applet}": "busybox" for applet in applets})


def archive_of(layout_ref: str, file: Path) -> str:
    """``layout_ref`` (``oci:DIR:TAG``) copied into the tar ``file``: ``oci-archive:FILE:TAG``."""
    tag = layout_ref.rsplit(":", 1)[-1]
    file.unlink(missing_ok=True)
    _run("skopeo", "--insecure-policy", "copy", "--quiet", layout_ref, f"oci-archive:{file}:{tag}")
    return f"oci-archive:{file}:{tag}"


def _shared_objects(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        done = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            words = line.split()
            for word in words:
                if word.startswith("/") and os.path.exists(word):
                    found.add(word)
    return found


def python_missing() -> str | None:
    """Why `python_layout` cannot be built here (None: it can)."""
    missing = tools_missing()
    if missing:
        return missing
    if not os.access(_HOST_PYTHON, os.X_OK):
        return f"this host has no {_HOST_PYTHON} to build a python image from"
    version = subprocess.run(
        [_HOST_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    if version != str(tuple(sys.version_info[:2])):
        # The program imports the server's packages (pydantic's compiled core): same minor version.
        return f"{_HOST_PYTHON} is Python {version}, the server's is {sys.version_info[:2]}"
    return None


def python_layout(directory: Path, tag: str = "python") -> str:
    """busybox plus the host's python3 (binary, shared libraries, standard library)."""
    binary = Path(os.path.realpath(_HOST_PYTHON))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = Path("/usr/lib") / version
    fill: list[tuple[str, Path | str | bytes]] = [("/bin/busybox", Path(BUSYBOX)), (MARKER, f"{tag}\n")]
    fill.append((f"/usr/bin/{binary.name}", binary))
    for entry in sorted(stdlib.iterdir()):
        if entry.name not in _STDLIB_SKIP:
            fill.append((str(entry), entry))
    dynload = sorted((stdlib / "lib-dynload").glob("*.so"))
    # What the server's packages bound in need from the system (pydantic's core: libgcc_s), as
    # any real python image has it.
    import pydantic_core

    compiled = sorted(Path(pydantic_core.__file__).parent.glob("*.so"))
    for library in sorted(_shared_objects([binary, *dynload, *compiled])):
        fill.append((library, Path(os.path.realpath(library))))
    links = {f"/bin/{applet}": "busybox" for applet in APPLETS}
    links["/usr/bin/python3"] = binary.name
    return _build(directory, tag, fill, links)


class TestImages:
    """The session's images under ``root``, each built on first use and kept."""

    __test__ = False  # not a test class, whatever pytest's collector thinks of its name

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, str] = {}

    def _once(self, key: str, build: object) -> str:
        if key not in self._built:
            assert callable(build)
            self._built[key] = str(build())
        return self._built[key]

    def busybox(self) -> str:
        return self._once("busybox", lambda: busybox_layout(self.root / "layout", "busybox"))

    def no_shell(self) -> str:
        return self._once("no-shell", lambda: busybox_layout(self.root / "layout", "no-shell", shell=False))

    def archive(self) -> str:
        return self._once("archive", lambda: archive_of(self.busybox(), self.root / "busybox.tar"))

    def python(self) -> str:
        return self._once("python", lambda: python_layout(self.root / "python-layout", "python"))
