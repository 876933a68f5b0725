"""Where a run's workspace lives on a node, and sweeping the workspaces of runs that are gone.

A workspace belongs to one run
------------------------------
A run's workspace is ``<sandbox root>/<project>/<run name>-<run uid>``, the uid being the
AgentRun's ``metadata.uid`` (a fresh random one per created run). Keyed by the name alone, a new
run named like an earlier one would start in the earlier run's directory, with its files: after
``nodus down`` and ``nodus up`` on another storage (which knows nothing of the earlier run), or
after a delete that did not finish. The name stays in front so an operator still finds a run's
directory by its name. `workspace_path` is the one place that says where a workspace is; the
run supervisor (the actor's config, removal) and the evaluation service (the grader's copy)
both call it. A run stored without a uid (none are written so, but a document is never trusted
to have one) keeps the name-only path.

Beside each workspace ``W`` sit its marker ``.W.workspace`` (and the ``.W.workspace.tmp`` it is
written through) and the seeding stage ``.W.seeding`` (`sandbox.snapshots`); they go with it.

The sweep
---------
Workspaces of runs that no longer exist are removed: a directory whose name is no live run's
workspace name, with its marker and stage. `find_entries` lists a sandbox root's candidates
(blocking, call it in a thread); the caller decides which are orphans against the runs it knows
*after* listing (a run's actor creates its workspace only once the run is known, so a workspace
listed is of a run created before the decision), then `remove_entries` deletes them. Entries
that are none of these forms (the root's ``.grading`` folder, any other dot entry) are never
touched. A sweep sees one node's disk only: the runs of a cluster are on several nodes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodus_ray.sandbox.workspace import _remove_tree

__all__ = [
    "workspace_folder",
    "workspace_path",
    "workspace_of",
    "names_run",
    "WorkspaceEntry",
    "find_entries",
    "remove_entries",
]

logger = logging.getLogger(__name__)

# What sits beside a workspace ``W`` (as ``.W<suffix>``) and belongs to it.
_BESIDE = (".workspace.tmp", ".workspace", ".seeding")


def workspace_folder(name: str, uid: str | None) -> str:
    """The directory name of a run's workspace inside its project's folder."""
    return f"{name}-{uid}" if uid else name


def workspace_path(sandbox_root: str | os.PathLike[str], project: str, name: str, uid: str | None) -> Path:
    """Where the run ``project/name`` with ``metadata.uid`` ``uid`` keeps its workspace on a node."""
    return Path(sandbox_root) / project / workspace_folder(name, uid)


def workspace_of(sandbox_root: str | os.PathLike[str], run: Mapping[str, Any]) -> Path:
    """`workspace_path` of an AgentRun resource (as stored, or as the API shows it)."""
    metadata = run["metadata"]
    return workspace_path(sandbox_root, str(metadata["project"]), str(metadata["name"]), metadata.get("uid"))


def names_run(folder: str, name: str) -> bool:
    """Whether ``folder`` may be a workspace of a run called ``name`` (of any uid, or none).

    Over-inclusive on purpose (``a-b-<uid>``, of a run named ``a-b``, matches ``a`` too): the
    sweep uses it to spare, never to delete.
    """
    return folder == name or folder.startswith(f"{name}-")


@dataclass(frozen=True)
class WorkspaceEntry:
    """One path under a project's folder that belongs to the workspace named ``folder``."""

    project: str
    folder: str
    path: Path


def _folder_of(entry: str) -> str | None:
    """The workspace an entry of a project's folder belongs to (None: not a workspace's)."""
    if not entry.startswith("."):
        return entry
    for suffix in _BESIDE:
        if entry.endswith(suffix) and len(entry) > 1 + len(suffix):
            return entry[1 : -len(suffix)]
    return None


def find_entries(sandbox_root: str | os.PathLike[str]) -> list[WorkspaceEntry]:
    """Every workspace, marker and seeding stage under the root (blocking: call it in a thread).

    Project folders are the root's directories whose names do not start with a dot (a project
    name is a DNS label), so ``.grading`` and the like are never looked into.
    """
    root = Path(sandbox_root)
    found: list[WorkspaceEntry] = []
    try:
        projects = sorted(os.scandir(root), key=lambda entry: entry.name)
    except FileNotFoundError:
        return found
    for project in projects:
        if project.name.startswith(".") or not project.is_dir(follow_symlinks=False):
            continue
        try:
            entries = sorted(os.scandir(project.path), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            folder = _folder_of(entry.name)
            if folder is not None:
                found.append(WorkspaceEntry(project.name, folder, Path(entry.path)))
    return found


def remove_entries(entries: Iterable[WorkspaceEntry]) -> list[Path]:
    """Delete the entries (a directory with all it holds); the paths removed, in order."""
    removed: list[Path] = []
    for entry in entries:
        path = entry.path
        try:
            if path.is_symlink() or not path.is_dir():
                path.unlink(missing_ok=True)
            else:
                _remove_tree(path)
        except OSError:
            logger.warning("could not sweep %s", path, exc_info=True)
            continue
        removed.append(path)
    return removed
