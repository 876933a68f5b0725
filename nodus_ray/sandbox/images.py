"""An Agent's ``spec.image``: resolved to a digest, then unpacked once per node into a root.

Two moments, two places:

* when a run is created, the control plane resolves the reference to the digest of its
  manifest (`resolve_digest`: ``skopeo inspect --raw``, sha256 of what it answers) and pins it in
  ``status.sandbox.image``; the run's actors only ever use that digest;
* on the node where a run's actor starts, `image_root` unpacks the pinned image into
  ``<cache>/<hex>/rootfs`` (``skopeo copy`` into a private OCI layout, then ``umoci unpack
  --rootless``), once per digest: built in a temporary directory beside it and renamed into
  place, under a file lock per digest, so two runs on a node unpack it once and nobody sees a
  half-built root. The copy is checked against the pinned digest (a tag moved since the run was
  created is refused, never silently run), and the root must hold ``/bin/sh``.

bubblewrap then mounts that root read-only as ``/`` (`nodus_ray.sandbox.bubblewrap`). Every
failure is an `ImageError` whose message names the reference; the run fails ``ImagePullFailed``.

Multi-arch (an index) pinning: the digest pinned is the index's, the copy picks this node's
platform, and the copied manifest must be one the pinned index lists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from nodus.image_ref import ImageRef, parse_image_ref

__all__ = [
    "ImageError",
    "ImageRoot",
    "RESOLVE_TIMEOUT_SECONDS",
    "UNPACK_TIMEOUT_SECONDS",
    "resolve_digest",
    "image_root",
    "images_cache",
    "inside_root",
    "run_image",
]

RESOLVE_TIMEOUT_SECONDS = 60.0  # one `skopeo inspect`: a registry may be slow, never forever
UNPACK_TIMEOUT_SECONDS = 900.0  # a copy and an unpack of a large image on a slow link
_DIGEST_PREFIX = "sha256:"
_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_SHELLS = ("/bin/bash", "/bin/sh")  # bash where the image has it, as on the host; else sh
_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3", "/bin/python3")
# Mount points bubblewrap needs on the read-only root; made in the cache's copy when missing.
_MOUNT_POINTS = ("dev", "proc", "tmp")
_META = "image.json"


class ImageError(Exception):
    """The image cannot be used; the message names the reference (the run's ``ImagePullFailed``)."""


@dataclass(frozen=True)
class ImageRoot:
    """An unpacked image on this node: its ``rootfs``, the shell commands run with, its python3."""

    ref: str
    digest: str
    rootfs: Path
    shell: str  # "/bin/bash" or "/bin/sh", inside the image
    python: str | None  # the image's python3 (inside the image), if it has one


def images_cache(sandbox_root: str | os.PathLike[str]) -> Path:
    """Where a node keeps its unpacked images: a dot folder of the sandbox root, which the
    workspace sweep never looks into."""
    return Path(sandbox_root) / ".images"


def _policy_args() -> list[str]:
    """skopeo refuses to copy without a signature policy; a host with none accepts what it names."""
    return [] if os.path.exists("/etc/containers/policy.json") else ["--insecure-policy"]


def _skopeo(args: Sequence[str], ref: str, timeout: float) -> bytes:
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise ImageError(f"image {ref}: skopeo is not installed on this node (make system-deps installs it)")
    try:
        done = subprocess.run(
            [skopeo, *_policy_args(), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ImageError(f"image {ref}: skopeo did not answer within {timeout:.0f}s") from None
    if done.returncode != 0:
        raise ImageError(f"image {ref} cannot be pulled: {_tail(done.stderr)}")
    return done.stdout


def _tail(stderr: bytes) -> str:
    """The tool's last line, without logrus's ``time=... level=fatal msg="..."`` wrapping."""
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    last = lines[-1] if lines else "no error output"
    wrapped = re.search(r'msg="((?:[^"\\]|\\.)*)"', last)
    if wrapped is not None:
        last = wrapped.group(1).replace('\\"', '"')
    return last[-400:]


def _digest_of(raw: bytes) -> str:
    return _DIGEST_PREFIX + hashlib.sha256(raw).hexdigest()


def resolve_digest(ref: str, timeout: float = RESOLVE_TIMEOUT_SECONDS) -> str:
    """The digest ``ref`` names now (``sha256:...`` of its manifest); blocking, `ImageError` if not."""
    try:
        parse_image_ref(ref)
    except ValueError as bad:
        raise ImageError(f"image {ref}: {bad}") from None
    raw = _skopeo(["inspect", "--raw", ref], ref, timeout)
    return _digest_of(raw)


def _source(parsed: ImageRef, digest: str) -> str:
    """What to copy: a registry image by its pinned digest (the tag may have moved); a local
    layout or archive by the reference itself, checked against the digest after the copy."""
    if parsed.transport == "docker":
        return f"docker://{parsed.location}@{digest}"
    return str(parsed)


def _layout_manifest(layout: Path, tag: str) -> dict[str, Any]:
    index = json.loads((layout / "index.json").read_text())
    for entry in index.get("manifests") or []:
        if (entry.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag:
            found: dict[str, Any] = entry
            return found
    raise ImageError(f"the copied layout holds no {tag!r}")


def _check_digest(ref: str, pinned: str, copied: str, pinned_raw: bytes | None) -> None:
    if copied == pinned:
        return
    if pinned_raw is not None:
        with contextlib.suppress(ValueError, AttributeError):
            listed = json.loads(pinned_raw)
            if listed.get("mediaType") in _INDEX_TYPES or "manifests" in listed:
                if copied in {entry.get("digest") for entry in listed.get("manifests") or []}:
                    return
    raise ImageError(f"image {ref} is now {copied}, not {pinned} as the run pinned (the image changed)")


def inside_root(rootfs: Path, path: str, *, hops: int = 40) -> Path | None:
    """Host path of ``path`` inside ``rootfs``, following symlinks as the sandbox would (an
    absolute link target starts at the image's root, never the host's); None if absent."""
    current = PurePosixPath("/")
    parts = list(PurePosixPath(path).parts[1:])
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        candidate = current / part
        host = rootfs / str(candidate).lstrip("/")
        if host.is_symlink():
            hops -= 1
            if hops < 0:
                return None
            target = PurePosixPath(os.readlink(host))
            parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
            current = PurePosixPath("/") if target.is_absolute() else current
            continue
        if not os.path.lexists(host):
            return None
        current = candidate
    return rootfs / str(current).lstrip("/")


def _executable(rootfs: Path, path: str) -> bool:
    host = inside_root(rootfs, path)
    return host is not None and host.is_file() and os.access(host, os.X_OK)


def _survey(rootfs: Path, ref: str) -> tuple[str, str | None]:
    shell = next((s for s in _SHELLS if _executable(rootfs, s)), None)
    if shell is None:
        raise ImageError(f"image {ref} has no /bin/sh: commands cannot run on it")
    python = next((p for p in _PYTHONS if _executable(rootfs, p)), None)
    return shell, python


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read_root(final: Path) -> ImageRoot:
    meta = json.loads((final / _META).read_text())
    return ImageRoot(
        ref=str(meta["ref"]),
        digest=str(meta["digest"]),
        rootfs=final / "rootfs",
        shell=str(meta["shell"]),
        python=meta.get("python"),
    )


def image_root(cache: Path, ref: str, digest: str, *, timeout: float = UNPACK_TIMEOUT_SECONDS) -> ImageRoot:
    """The pinned image unpacked on this node (blocking: call it in a thread), built if missing.

    ``<cache>/<hex>`` exists only complete (renamed into place), so a reader needs no lock;
    builders take ``<cache>/<hex>.lock`` and look again, so one of them builds and the others
    use what it built. `ImageError` when it cannot be copied, does not match ``digest`` or
    has no ``/bin/sh``.
    """
    if not digest.startswith(_DIGEST_PREFIX) or len(digest) != len(_DIGEST_PREFIX) + 64:
        raise ImageError(f"image {ref}: {digest!r} is not a sha256 digest")
    hex_digest = digest[len(_DIGEST_PREFIX) :]
    final = cache / hex_digest
    if (final / _META).exists():
        return _read_root(final)
    try:
        parsed = parse_image_ref(ref)
    except ValueError as bad:
        raise ImageError(f"image {ref}: {bad}") from None
    cache.mkdir(parents=True, exist_ok=True)
    os.chmod(cache, 0o711)  # the sandbox uid never lists it; bubblewrap binds a root from it as root
    with _locked(cache / f"{hex_digest}.lock"):
        if (final / _META).exists():
            return _read_root(final)  # another run on this node built it meanwhile
        if os.path.lexists(final):  # not one this code renamed into place (edited by hand): rebuilt
            shutil.rmtree(final, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{hex_digest[:12]}.", dir=cache))
        try:
            root = _build(work, parsed, ref, digest, timeout)
            shutil.rmtree(work / "layout", ignore_errors=True)
            os.rename(work / "bundle", final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return ImageRoot(ref, digest, final / "rootfs", root.shell, root.python)


def _build(work: Path, parsed: ImageRef, ref: str, digest: str, timeout: float) -> ImageRoot:
    """Copy, check and unpack the image into ``work/bundle`` (its rootfs and `_META`)."""
    source = _source(parsed, digest)
    pinned_raw = _skopeo(["inspect", "--raw", source], ref, timeout)
    layout = work / "layout"
    _skopeo(["copy", "--quiet", source, f"oci:{layout}:img"], ref, timeout)
    copied = str(_layout_manifest(layout, "img").get("digest"))
    _check_digest(ref, digest, copied, pinned_raw)
    umoci = shutil.which("umoci")
    if umoci is None:
        raise ImageError(f"image {ref}: umoci is not installed on this node (make system-deps installs it)")
    bundle = work / "bundle"
    try:
        done = subprocess.run(
            [umoci, "unpack", "--rootless", "--image", f"{layout}:img", str(bundle)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ImageError(f"image {ref}: unpacking took longer than {timeout:.0f}s") from None
    if done.returncode != 0:
        raise ImageError(f"image {ref} cannot be unpacked: {_tail(done.stderr)}")
    rootfs = bundle / "rootfs"
    shell, python = _survey(rootfs, ref)
    os.chmod(rootfs, 0o755)
    for point in _MOUNT_POINTS:
        target = rootfs / point
        if not os.path.lexists(target):
            target.mkdir(mode=0o755)
    meta = ImageRoot(ref, digest, rootfs, shell, python)
    record = {key: value for key, value in asdict(meta).items() if key != "rootfs"}
    (bundle / _META).write_text(json.dumps(record))
    return meta


def run_image(
    pinned: dict[str, str] | None, cache: str, *, egress: bool = False, program: bool = False
) -> ImageRoot | None:
    """A run's pinned image (``status.sandbox.image``) ready on this node, or None without one
    (blocking). `ImageError` also when the image lacks what the run needs: ``python3`` for a
    Python program (``program``) or for the egress forwarder (``egress``, allowed hosts)."""
    if not pinned:
        return None
    root = image_root(Path(cache), str(pinned["ref"]), str(pinned["digest"]))
    if root.python is None and (program or egress):
        needs = "a Python agent's program" if program else "the egress forwarder (spec.network.allowedHosts)"
        raise ImageError(f"image {root.ref} has no python3, which {needs} runs with")
    return root
