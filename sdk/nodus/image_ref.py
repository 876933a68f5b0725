"""An Agent's ``spec.image``: an OCI image reference, parsed the same way by the SDK and the server.

Three transports, the ones skopeo names them by (the server resolves and unpacks with skopeo and
umoci, `nodus_ray.sandbox.images`):

* ``docker://[registry[:port]/]name[:tag][@sha256:...]``: a registry image, pulled where a
  registry is reachable;
* ``oci:PATH[:TAG]``: an OCI image layout directory on the server's nodes;
* ``oci-archive:FILE[:TAG]``: a tar of such a layout.

``PATH`` and ``FILE`` are absolute (a relative path would mean whatever directory the server was
started in) and hold no ``:`` (skopeo reads the first one after the path as the tag's start).
A bare ``ubuntu:24.04`` is refused with the ``docker://`` spelling suggested: the transport
says where the image comes from, and nothing is guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ImageRef", "parse_image_ref", "validate_image_ref", "MAX_IMAGE_REF_LENGTH"]

MAX_IMAGE_REF_LENGTH = 512

# The distribution reference grammar (github.com/distribution/reference), without the
# implicit ``docker.io/library/`` defaults, which skopeo applies itself.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?))*(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_DOCKER = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
_LOCAL_TAG = re.compile(_TAG)
# skopeo's other transports: a node's daemon or store, which a run may not reach into.
_OTHER_TRANSPORTS = ("docker-daemon", "docker-archive", "containers-storage", "dir", "ostree", "sif")
_PATH_CHARS = re.compile(r"/[^\s:\x00]*")


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference: its ``transport`` (``docker``, ``oci``, ``oci-archive``), where the
    image is (``location``: the registry name or the path), its ``tag`` and pinned ``digest``."""

    transport: str
    location: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        if self.transport == "docker":
            text = f"docker://{self.location}"
            if self.tag:
                text += f":{self.tag}"
            return text + (f"@{self.digest}" if self.digest else "")
        return f"{self.transport}:{self.location}" + (f":{self.tag}" if self.tag else "")

    @property
    def is_local(self) -> bool:
        """An image on the nodes' own disks (an OCI layout or archive), not a registry's."""
        return self.transport != "docker"


def parse_image_ref(text: str) -> ImageRef:
    """The reference ``text`` parsed, or ValueError saying what is wrong with it and the forms taken."""
    if not isinstance(text, str):
        raise ValueError("an image reference is a string, e.g. docker://alpine:3.20 or oci:/images/tools:v1")
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"{text[:80]!r} is not an image reference: it is empty or holds spaces")
    if len(text) > MAX_IMAGE_REF_LENGTH:
        raise ValueError(f"an image reference is at most {MAX_IMAGE_REF_LENGTH} characters")
    forms = "docker://NAME[:TAG][@sha256:...], oci:/PATH[:TAG] or oci-archive:/FILE[:TAG]"
    if text.startswith("docker://"):
        match = _DOCKER.fullmatch(text[len("docker://") :])
        if match is None:
            raise ValueError(
                f"{text[:80]!r} is not a registry image reference: docker:// takes "
                "[registry[:port]/]name[:tag][@sha256:<64 hex>] with a lowercase name"
            )
        domain, path = match.group("domain"), match.group("path")
        return ImageRef(
            "docker", f"{domain}/{path}" if domain else path, match.group("tag"), match.group("digest")
        )
    for transport in ("oci-archive", "oci"):
        if text.startswith(f"{transport}:"):
            rest = text[len(transport) + 1 :]
            path, _, tag = rest.partition(":")
            if not _PATH_CHARS.fullmatch(path) or path == "/":
                raise ValueError(
                    f"{text[:80]!r}: {transport}: takes an absolute path without ':', e.g. {forms}"
                )
            if _ and not _LOCAL_TAG.fullmatch(tag):
                raise ValueError(f"{text[:80]!r}: the tag {tag[:40]!r} is not a valid image tag")
            return ImageRef(transport, path, tag or None)
    transport = text.split(":", 1)[0]
    if transport in _OTHER_TRANSPORTS:
        raise ValueError(f"{text[:80]!r}: the {transport}: transport is not served; the forms are {forms}")
    if "://" not in text and _DOCKER.fullmatch(text):
        raise ValueError(f"{text[:80]!r} names no transport: write docker://{text} for a registry image")
    raise ValueError(f"{text[:80]!r} is not an image reference; the forms are {forms}")


def validate_image_ref(text: str) -> str:
    """``text`` unchanged when it parses (a pydantic ``AfterValidator`` of ``spec.image``)."""
    parse_image_ref(text)
    return text
