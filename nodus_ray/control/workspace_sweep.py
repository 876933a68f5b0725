"""Sweeping workspaces: the directories of runs that no longer exist go from this node's disk.

A workspace is keyed by its run's uid (`sandbox.run_workspaces`), so a new run never reuses an
earlier one's directory; what an earlier run left (a delete that did not finish, a service
that ran on another storage) is removed here, in the background, once recovery has loaded the
runs and after each delete (decision 36).
"""

from __future__ import annotations

import asyncio
import logging

from nodus_ray.control.registry import Registry
from nodus_ray.sandbox.run_workspaces import find_entries, names_run, remove_entries, workspace_folder
from nodus_ray.store import layout

__all__ = ["WorkspaceSweeper"]

logger = logging.getLogger(__name__)


class WorkspaceSweeper:
    """Sweeps ``root`` (the sandbox root) of the workspaces of runs the registry does not hold."""

    def __init__(self, registry: Registry, root: str) -> None:
        self._registry = registry
        self._root = root
        self._sweeping: asyncio.Task[None] | None = None
        self._sweep_again = False

    @property
    def sweeping(self) -> asyncio.Task[None] | None:
        """The sweep under way or last done (a test awaits it)."""
        return self._sweeping

    def sweep_soon(self) -> asyncio.Task[None]:
        """Sweep this node's workspaces of runs that no longer exist, in the background.

        Called once recovery has loaded the runs and after each delete; calls while a sweep
        runs make it go round once more, so a thousand deletes are not a thousand sweeps.
        """
        self._sweep_again = True
        if self._sweeping is None or self._sweeping.done():
            self._sweeping = asyncio.get_running_loop().create_task(self._sweep_while_asked())
        return self._sweeping

    async def _sweep_while_asked(self) -> None:
        while self._sweep_again:
            self._sweep_again = False
            try:
                await self.sweep_workspaces()
            except Exception:  # noqa: BLE001 - a failed sweep leaves orphans for the next one
                logger.exception("could not sweep the workspaces under %s", self._root)

    async def sweep_workspaces(self) -> list[str]:
        """Remove the workspaces (and markers) on this node's disk of runs that no longer exist.

        A workspace is spared when it is a known run's (by name and uid), or bears the name of a
        run whose document is in storage but was not loaded (damaged, or being created): never
        delete what may be a live run's. Only this node: other nodes' disks are out of reach.
        """
        entries = await asyncio.to_thread(find_entries, self._root)
        if not entries:
            return []
        stored = await asyncio.to_thread(self._stored_run_names, {entry.project for entry in entries})
        # Decided after listing, against the runs known now (no await between): a run's actor
        # makes its workspace only after the run is known, so a listed workspace of a live run
        # is a known run's, and a run created since has a uid no listed entry carries.
        live = {
            (project, workspace_folder(name, run["metadata"].get("uid")))
            for (project, name), run in self._registry.runs.items()
        }
        orphans = [
            entry
            for entry in entries
            if (entry.project, entry.folder) not in live
            and not any(names_run(entry.folder, name) for name in stored.get(entry.project, ()))
        ]
        removed = await asyncio.to_thread(remove_entries, orphans)
        if removed:
            logger.info("swept %d workspace entries of runs that no longer exist", len(removed))
        return [str(path) for path in removed]

    def _stored_run_names(self, projects: set[str]) -> dict[str, set[str]]:
        """Per project, the runs storage holds that the registry does not (blocking)."""
        storage = self._registry.storage
        unloaded: dict[str, set[str]] = {}
        for project in projects:
            names = set(storage.list_dir(layout.runs_folder(project)))
            unloaded[project] = {name for name in names if (project, name) not in self._registry.runs}
        return unloaded
