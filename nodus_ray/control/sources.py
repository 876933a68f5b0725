"""Python agents' programs: uploaded once, stored by content, checked before an Agent names them.

An upload (``POST agentsources``) is a dict of files. It is checked the way the SDK checks it
before sending (`nodus._runtime.sources.check_source`: limits, paths, UTF-8, every ``.py`` file
compiles), stored at `layout.agent_source` under the SHA-256 of its canonical JSON, and answered
with ``spec.source`` (`schema_agent.source_ref`). The same files again are the same digest and
are not written again, so every revision (and every run) that names a digest reads the code it
was deployed with, even after a redeploy. Nothing here executes user code: checks are ``ast``
and ``compile`` only.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nodus._runtime.sources import check_source, source_files
from nodus.errors import Invalid
from nodus.schema_agent import AgentSpec, source_ref
from nodus_ray.control.registry import check_project
from nodus_ray.store import layout
from nodus_ray.store.storage import AlreadyExists, CreateOnlyUnsupported, Storage

__all__ = ["SourceService"]

# A module name no upload has: checking an upload against it checks everything but the entrypoint.
_NO_MODULE = "nodus_no_entrypoint_yet"


def _files(value: Any) -> dict[str, str]:
    """The ``files`` of an upload: a JSON object of path -> text; anything else names ``files``."""
    if not isinstance(value, dict) or not value:
        raise Invalid(
            'files: an object of path -> file text, e.g. {"files": {"main.py": "..."}}',
            details={"field": "files"},
        )
    for path, text in value.items():
        if not isinstance(text, str):
            raise Invalid(
                f"files.{path}: a file's content is its text (a string), not {type(text).__name__}",
                details={"field": f"files.{path}"},
            )
    return dict(value)


def _check(files: dict[str, str], entrypoint: str | None) -> dict[str, str]:
    """The SDK's own checks (`nodus._runtime.sources`), so both ends refuse alike: paths, UTF-8,
    limits, every ``.py`` file compiles, and (given one) the entrypoint is defined at top level.
    Answers the files with their paths in normal form (``./main.py`` is ``main.py``)."""
    clean = source_files(files)
    if entrypoint is not None:
        check_source(clean, entrypoint)
        return clean
    try:  # an upload names no entrypoint yet: only the syntax is checked now
        check_source(clean, f"{_NO_MODULE}:main")
    except Invalid as refused:
        if refused.details.get("field") != "spec.entrypoint":
            raise
    return clean


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


class SourceService:
    """Upload and look up the content-addressed sources of a project's Python agents."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def upload_source(self, project: str, files: Any) -> dict[str, Any]:
        """Check and store ``files``; answer ``{"digest", "files", "bytes"}`` (``spec.source``)."""
        check_project(project)
        checked = _check(_files(files), None)  # the Agent that names an entrypoint is checked on apply
        ref = source_ref(checked)
        key = layout.agent_source(project, _hex(str(ref["digest"])))
        data = json.dumps({"files": checked}, sort_keys=True, separators=(",", ":")).encode("utf-8")
        await asyncio.to_thread(self._write_once, key, data)
        return ref

    def _write_once(self, key: str, data: bytes) -> None:
        if self._storage.exists(key):
            return  # the same digest is the same content: nothing to rewrite
        try:
            self._storage.create_bytes(key, data)
        except AlreadyExists:
            pass  # a concurrent upload of the same files won
        except CreateOnlyUnsupported:
            self._storage.write_bytes(key, data)

    async def source_files(self, project: str, digest: str) -> dict[str, str]:
        """The files stored under ``digest``; Invalid naming ``spec.source`` when there are none."""
        key = layout.agent_source(project, _hex(digest))
        try:
            stored = await asyncio.to_thread(self._storage.read_json, key)
        except FileNotFoundError:
            raise Invalid(
                f"spec.source: no source {digest} was uploaded to project {project!r}; "
                "upload the files first (POST /v1/projects/{project}/agentsources, or Agent.deploy)",
                code="UnknownSource",
                details={"field": "spec.source", "digest": digest},
            ) from None
        files: dict[str, str] = stored["files"]
        return files

    async def check_agent(self, project: str, spec: AgentSpec) -> None:
        """Refuse an Agent whose source is unknown, misdescribed, or lacks its entrypoint."""
        if spec.source is None or spec.entrypoint is None:
            return
        files = await self.source_files(project, spec.source.digest)
        stored = source_ref(files)
        if (stored["files"], stored["bytes"]) != (spec.source.files, spec.source.bytes):
            raise Invalid(
                f"spec.source: source {spec.source.digest} has {stored['files']} files and "
                f"{stored['bytes']} bytes, not {spec.source.files} and {spec.source.bytes}",
                details={"field": "spec.source"},
            )
        _check(files, spec.entrypoint)
