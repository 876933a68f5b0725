"""Pinning a new run's image: its Agent's ``spec.image`` resolved to a digest as the run is created.

`RunService` asks `pin_images` for every run of a batch before it writes them (each distinct
reference is resolved once, off the event loop, with a timeout: ``skopeo inspect`` of a registry
can take seconds). A resolved run is stored with ``status.sandbox.image = {ref, digest}``, which
every actor of the run unpacks (`nodus_ray.sandbox.images`); one whose image cannot be resolved
is stored and then failed at once, ``ImagePullFailed`` with a message naming the reference, and
never gets an actor.

A local reference (``oci:PATH``, ``oci-archive:FILE``) names a path on the server's own disk,
which any token that may create an Agent could otherwise point anywhere (another project's
image, whatever OCI layout lies on the host): the server reads one only under the directories
its operator lists in ``NODUS_IMAGE_PATHS`` (`LocalImages`; ``~/.nodus/images`` by default), after resolving
links, so ``..`` or a link cannot lead out of them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nodus.image_ref import parse_image_ref
from nodus_ray.sandbox.images import RESOLVE_TIMEOUT_SECONDS, ImageError, resolve_digest

__all__ = ["IMAGE_PATHS_ENV", "ImagePins", "LocalImages", "pin_images", "agent_image"]

IMAGE_PATHS_ENV = "NODUS_IMAGE_PATHS"


@dataclass(frozen=True)
class LocalImages:
    """The directories local image references may point into (``NODUS_IMAGE_PATHS``)."""

    directories: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> LocalImages:
        """``text``: absolute directories separated by ``:``; ValueError naming a relative one."""
        directories = [part for part in (text or "").split(":") if part.strip()]
        for directory in directories:
            if not os.path.isabs(directory):
                raise ValueError(f"{IMAGE_PATHS_ENV}: {directory!r} is not an absolute directory")
        return cls(tuple(os.path.realpath(directory) for directory in directories))

    def refusal(self, ref: str) -> str | None:
        """Why the server will not read ``ref`` (a local path outside every allowed directory),
        or None (a registry image, or a path inside one)."""
        try:
            parsed = parse_image_ref(ref)
        except ValueError as error:
            return str(error)
        if not parsed.is_local:
            return None
        real = os.path.realpath(parsed.location)
        if any(os.path.commonpath([real, directory]) == directory for directory in self.directories):
            return None
        where = ", ".join(self.directories) if self.directories else "none are set"
        return (
            f"image {ref}: this server reads local images only from the directories in "
            f"{IMAGE_PATHS_ENV} ({where})"
        )


def agent_image(agent: dict[str, Any]) -> str | None:
    """The image reference of a (pinned) Agent resource, if it names one."""
    image = (agent.get("spec") or {}).get("image")
    return str(image) if image else None


@dataclass
class ImagePins:
    """What each reference resolved to: ``pinned`` (ref -> digest) or ``failed`` (ref -> why)."""

    pinned: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def status_of(self, ref: str | None) -> dict[str, Any] | None:
        """``status.sandbox.image`` of a run on ``ref`` (None: no image, or it failed)."""
        if ref is None or ref not in self.pinned:
            return None
        return {"ref": ref, "digest": self.pinned[ref]}

    def failure_of(self, ref: str | None) -> str | None:
        """Why a run on ``ref`` cannot start (its ``ImagePullFailed`` message), else None."""
        return None if ref is None else self.failed.get(ref)


async def _resolve(ref: str, timeout: float) -> str:
    # skopeo has the same timeout; this one bounds the thread hand-off as well.
    return await asyncio.wait_for(asyncio.to_thread(resolve_digest, ref, timeout), timeout + 5.0)


async def pin_images(
    refs: Iterable[str | None], local: LocalImages, timeout: float = RESOLVE_TIMEOUT_SECONDS
) -> ImagePins:
    """Resolve each distinct reference once, concurrently; never raises for an image's fault.
    A local one outside ``local``'s directories fails unread."""
    pins = ImagePins()
    distinct = []
    for ref in sorted({ref for ref in refs if ref}):
        if (refused := local.refusal(ref)) is not None:
            pins.failed[ref] = refused
        else:
            distinct.append(ref)
    if not distinct:
        return pins
    answers = await asyncio.gather(*(_resolve(ref, timeout) for ref in distinct), return_exceptions=True)
    for ref, answer in zip(distinct, answers, strict=True):
        if isinstance(answer, str):
            pins.pinned[ref] = answer
        elif isinstance(answer, ImageError):
            pins.failed[ref] = str(answer)
        elif isinstance(answer, TimeoutError):
            pins.failed[ref] = f"image {ref}: resolving its digest took longer than {timeout:.0f}s"
        elif isinstance(answer, Exception):
            pins.failed[ref] = f"image {ref} cannot be resolved: {answer}"
        else:
            raise answer  # a cancellation: the request itself is going away
    return pins
