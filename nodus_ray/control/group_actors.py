"""The actors a group has beside its runs: its supervisor (admission) and its grader.

Creating, finding and ending them is the Ray boundary of the group and evaluation services, so
both are given a launcher: the Ray one here, or a test's fakes. Also here: what crosses to a
supervisor (`limits_wire`) and how its refusal becomes the API's error (`admission_refusal`).
"""

from __future__ import annotations

from typing import Any, Protocol

import ray

from nodus.errors import Conflict, Invalid, NodusError
from nodus_ray.core.admission import AdmissionError
from nodus_ray.runtime.grader import RemoteGrader, grader_name, grader_options
from nodus_ray.runtime.group_supervisor import (
    RemoteGroupSupervisor,
    group_supervisor_name,
    supervisor_options,
)
from nodus_ray.settings import NAMESPACE
from nodus_ray.store.storage import Storage

__all__ = [
    "GroupSupervisors",
    "RayGroupSupervisors",
    "Graders",
    "RayGraders",
    "limits_wire",
    "admission_refusal",
]

Key = tuple[str, str]


def limits_wire(spec: dict[str, Any]) -> dict[str, Any]:
    """A group's limits as its supervisor takes them."""
    limits = spec.get("limits") or {}
    return {
        "maxActive": int(limits.get("maxActive", 10)),
        "maxPending": int(limits.get("maxPending", 10000)),
        "maxCostUSD": spec.get("maxCostUSD"),
    }


def admission_refusal(error: AdmissionError, *, index_map: list[int] | None = None) -> NodusError:
    """The API error for a refusal of the admission core; ``index_map`` maps its batch index."""
    details = dict(error.details)
    if error.index is not None and index_map is not None:
        details["index"] = index_map[error.index]
    cls = Invalid if error.code == "Invalid" else Conflict
    where = f"items[{details['index']}]: " if "index" in details and index_map is not None else ""
    return cls(f"{where}{error.message}", code=error.reason, details=details)


class GroupSupervisors(Protocol):
    """A group's supervisor actor by group key (created on first use), and ending it."""

    def handle(self, key: Key) -> Any: ...

    def release(self, key: Key) -> None: ...


class RayGroupSupervisors:
    """Group supervisors as detached, named Ray actors; handles kept so a call needs no lookup."""

    def __init__(self) -> None:
        self._handles: dict[Key, Any] = {}

    def handle(self, key: Key) -> Any:
        handle = self._handles.get(key)
        if handle is None:
            handle = RemoteGroupSupervisor.options(**supervisor_options(*key)).remote(*key)
            self._handles[key] = handle
        return handle

    def release(self, key: Key) -> None:
        handle = self._handles.pop(key, None)
        if handle is None:
            try:
                handle = ray.get_actor(group_supervisor_name(*key), namespace=NAMESPACE)
            except ValueError:
                return
        ray.kill(handle, no_restart=True)


class Graders(Protocol):
    """An evaluation group's grader actor (created on first use), and ending it."""

    def grader(self, key: Key) -> Any: ...

    def release(self, key: Key) -> None: ...


class RayGraders:
    """Graders as detached, named Ray actors, grading in sandboxes under ``grading_root``."""

    def __init__(self, storage: Storage, grading_root: str, hidden_paths: tuple[str, ...]) -> None:
        self._storage = storage
        self._grading_root = grading_root
        self._hidden_paths = hidden_paths

    def grader(self, key: Key) -> Any:
        return RemoteGrader.options(**grader_options(*key)).remote(
            key[0], key[1], self._storage, self._grading_root, self._hidden_paths
        )

    def release(self, key: Key) -> None:
        try:
            ray.kill(ray.get_actor(grader_name(*key), namespace=NAMESPACE), no_restart=True)
        except ValueError:
            pass
