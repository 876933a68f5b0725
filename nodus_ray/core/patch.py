"""JSON merge patch (RFC 7386), the body of ``PATCH`` and ``nodus patch``."""

from __future__ import annotations

import copy
from typing import Any

from nodus.errors import Invalid

__all__ = ["merge_patch", "patched_document"]


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply ``patch`` to a copy of ``target``: objects merge, ``null`` deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def patched_document(current: dict[str, Any], patch: Any, name: str) -> dict[str, Any]:
    """The document to apply after ``PATCH``: the resource without its status, patched.

    The name cannot change, and server-written metadata (uid, generation, timestamps) is
    dropped so that apply sees only what a user may set.
    """
    if not isinstance(patch, dict):
        raise Invalid("a merge patch must be a JSON object", details={"field": ""})
    document: dict[str, Any] = merge_patch({k: v for k, v in current.items() if k != "status"}, patch)
    document.pop("status", None)
    meta = document.get("metadata")
    if not isinstance(meta, dict) or meta.get("name") != name:
        raise Invalid("metadata.name cannot be changed by a patch", details={"field": "metadata.name"})
    document["metadata"] = {"name": name, "labels": meta.get("labels") or {}}
    return document
