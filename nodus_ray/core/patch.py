"""JSON merge patch (RFC 7386), the body of ``PATCH`` and ``nodus patch``.

``null`` removes a field, which for a field with a default would quietly put the default back:
``{"spec": null}`` used to reset an Agent (system prompt empty, cap $1.00) as a new revision.
`patched_document` therefore refuses a ``null`` on a field whose removal is not a state of its
own: a required field, or one whose default is a value (``spec``, ``spec.system``,
``spec.limits``). A field that is unset by default (``spec.network``, ``spec.maxCostUSD``) or an
empty collection (``metadata.labels``, ``spec.env``) may be removed, and entries of a map
(``metadata.labels.team``) may too.
"""

from __future__ import annotations

import copy
import types
import typing
from typing import Any

from pydantic import BaseModel

from nodus.errors import Invalid
from nodus.resources import KINDS

__all__ = ["merge_patch", "patched_document", "check_removals"]


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


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (``AgentSpec``, or ``NetworkSpec`` of ``NetworkSpec | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            found = _model_of(member)
            if found is not None:
                return found
    return None


def _removable(model: type[BaseModel], name: str) -> bool:
    field = model.model_fields[name]
    if field.is_required():
        return False
    default = field.get_default(call_default_factory=True)
    return default is None or default == [] or default == {}


def check_removals(model: type[BaseModel], patch: dict[str, Any], kind: str, path: str = "") -> None:
    """Refuse a ``null`` in ``patch`` that would remove a field ``model`` needs (see the module)."""
    for key, value in patch.items():
        if not isinstance(key, str) or key not in model.model_fields:
            continue  # an unknown field: a null removes nothing, a value is refused by validation
        field_path = f"{path}.{key}" if path else key
        if value is None and not _removable(model, key):
            raise Invalid(
                f"{kind} {field_path}: a patch cannot remove {field_path} (null would put its default "
                "back, or leave it missing); set the value you want instead",
                details={"field": field_path, "kind": kind},
            )
        inner = _model_of(model.model_fields[key].annotation)
        if isinstance(value, dict) and inner is not None:
            check_removals(inner, value, kind, field_path)


def patched_document(current: dict[str, Any], patch: Any, name: str) -> dict[str, Any]:
    """The document to apply after ``PATCH``: the resource without its status, patched.

    The name cannot change, and server-written metadata (uid, generation, timestamps) is
    dropped so that apply sees only what a user may set. A ``null`` that would remove a field
    the resource needs is refused (`check_removals`), so nothing is reset to a default.
    """
    if not isinstance(patch, dict):
        raise Invalid("a merge patch must be a JSON object", details={"field": ""})
    kind = current.get("kind")
    model = KINDS.get(kind) if isinstance(kind, str) else None
    if model is not None:
        check_removals(model, patch, str(kind))
    document: dict[str, Any] = merge_patch({k: v for k, v in current.items() if k != "status"}, patch)
    document.pop("status", None)
    meta = document.get("metadata")
    if not isinstance(meta, dict) or meta.get("name") != name:
        raise Invalid("metadata.name cannot be changed by a patch", details={"field": "metadata.name"})
    document["metadata"] = {"name": name, "labels": meta.get("labels") or {}}
    return document
