"""Run supervision: one live actor per unfinished run, replaced when it dies.

The control plane mixes this in. It awaits each run actor's outcome; when the actor dies it
starts a replacement (named with the next attempt) that replays the run's journal, and
however supervision ends it ends the actor, so a cancel that races an actor's start leaves
nothing running. The state it works on (runs, locks, settings, storage) belongs to the
control plane.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from nodus.resources import TERMINAL_PHASES
from nodus_ray.control.run_pool import RunActorPool
from nodus_ray.faults import crash_point
from nodus_ray.runtime.run_actor import RemoteRunActor, RunConfig, run_actor_name, run_storage_prefix
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.settings import NAMESPACE, ServerSettings
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import parse_timestamp, utc_now

__all__ = ["RunSupervision", "merge_status", "parked"]

logger = logging.getLogger(__name__)

Key = tuple[str, str]

_CANCEL_GRACE_SECONDS = 15.0


class RunSupervision:
    """Actor lifecycle of runs; the control plane provides the attributes declared here."""

    settings: ServerSettings
    storage: Storage
    _runs: dict[Key, dict[str, Any]]
    _locks: Any
    _actors: dict[Key, Any]
    _supervisors: dict[Key, asyncio.Task[None]]
    pool: RunActorPool
    # Provided by the group side of the control plane (a declaration, not a stub, so that no
    # base class can shadow the real method in the control plane's MRO).
    _tell_group: Callable[[Key], Awaitable[None]]
    _unread: Callable[[Key, int], bool]  # provided by the run inbox side of the control plane
    _awaits_admission: Callable[[dict[str, Any]], bool]  # provided by the group side
    _affordable: Callable[[str, str | None], bool]  # provided by the control plane's credits

    async def _persist_run(self, key: Key) -> None:  # provided by the control plane
        raise NotImplementedError

    async def report(self, project: str, name: str, patch: dict[str, Any]) -> None:
        raise NotImplementedError

    def _hidden_paths(self) -> tuple[str, ...]:
        """Host paths a sandbox must not see: every workspace, and the storage if it is local."""
        hidden = [self.settings.sandbox_root]
        if self.storage.is_local:
            hidden.append(self.storage.local_root)
        return tuple(hidden)

    def _supervise(self, key: Key) -> None:
        task = self._supervisors.get(key)
        if task is None or task.done():
            self._supervisors[key] = asyncio.get_running_loop().create_task(self._supervise_run(key))

    def _workspace(self, project: str, name: str) -> str:
        return str(Path(self.settings.sandbox_root) / project / name)

    def _remove_workspace(self, project: str, name: str) -> None:
        """The local directory and its marker; the snapshots go with the run's storage."""
        workspace = Path(self._workspace(project, name))
        shutil.rmtree(workspace, ignore_errors=True)
        WorkspaceSnapshots.marker_of(workspace).unlink(missing_ok=True)

    def _find_actor(self, run: dict[str, Any]) -> Any | None:
        """The live actor of the run, by the name the run recorded for it (none after it was released)."""
        actor_name = run["status"].get("actorName")
        if not actor_name:
            return None
        try:
            return ray.get_actor(actor_name, namespace=NAMESPACE)
        except ValueError:
            return None

    async def _start_actor(self, key: Key) -> Any:
        """A new actor for the run's next attempt: a pre-started one from the pool when one is
        parked (no process start to wait for), else a fresh one. The attempt and the actor's
        name are written before the actor gets the run, so a restarted control plane finds it."""
        run = self._runs[key]
        project, name = key
        attempt = int(run["status"].get("attempts") or 0) + 1
        config = await self._run_config(key)
        slot = self.pool.take()
        if slot is not None:
            await self.report(project, name, {"attempts": attempt, "actorName": slot.name})
            assigned = self.pool.assign(slot, config)
            self.pool.fill()
            if assigned:
                return slot.handle
            self.pool.discard(slot)  # it died while parked: start a fresh one instead
        actor_name = run_actor_name(project, name, attempt)
        await self.report(project, name, {"attempts": attempt, "actorName": actor_name})
        return RemoteRunActor.options(
            name=actor_name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
        ).remote(config)

    async def _run_config(self, key: Key) -> RunConfig:
        run = self._runs[key]
        project, name = key
        pinned = await asyncio.to_thread(
            self.storage.read_json, f"{run_storage_prefix(project, name)}/agent.json"
        )
        return RunConfig(
            project=project,
            name=name,
            agent=run["spec"]["agent"],
            agent_revision=int(run["status"]["agentRevision"]),
            agent_spec=pinned["spec"],
            run_spec=run["spec"],
            storage_uri=self.settings.storage_uri,
            workspace=self._workspace(project, name),
            deadline_at=run["status"].get("deadlineAt"),
            offline_latency_seconds=self.settings.offline_latency_seconds,
            sandbox_uid=run["status"].get("sandbox", {}).get("uid"),
            hidden_paths=self._hidden_paths(),
            cap_usd=run["status"]["cost"].get("limitUSD"),
            prices_file=self.settings.prices_file,
            group=run["spec"].get("group"),
            workspace_snapshots=self.settings.workspace_snapshots,
            workspace_seeded=bool(run["status"].get("workspaceSeeded")),
            egress_private_networks=self.settings.egress_private_networks,
        )

    def _is_over(self, key: Key) -> bool:
        run = self._runs.get(key)
        return run is None or run["status"]["phase"] in TERMINAL_PHASES

    async def _supervise_run(self, key: Key) -> None:
        """Keep one live actor on an unfinished run until it ends; replace actors that die."""
        project, name = key
        try:
            while not self._is_over(key):
                run = self._runs[key]
                actor = self._find_actor(run)
                if actor is None:
                    if run["status"].get("actorName"):  # it had a live actor, and that one is gone
                        losses = int(run["status"].get("actorLosses") or 0) + 1
                        await self.report(project, name, {"actorLosses": losses, "actorName": None})
                        if losses > self.settings.max_actor_restarts:
                            await self._finish(
                                key,
                                {
                                    "phase": "Failed",
                                    "reason": "RunnerLost",
                                    "message": f"the run's actor was lost {losses} times",
                                },
                            )
                            return
                    try:
                        actor = await self._start_actor(key)
                    except Exception:  # noqa: BLE001 - e.g. the run was deleted meanwhile
                        if self._is_over(key):
                            return
                        logger.exception("could not start an actor for run %s/%s", project, name)
                        await self._finish(
                            key,
                            {
                                "phase": "Failed",
                                "reason": "InternalError",
                                "message": "the run's actor could not be started",
                            },
                        )
                        return
                self._actors[key] = actor
                if self._is_over(key):  # cancelled or deleted while the actor was starting
                    return
                try:
                    outcome = await actor.run.remote()
                except RayActorError:
                    logger.warning(
                        "actor of run %s/%s died; replaying its journal in a new actor", project, name
                    )
                    continue
                except Exception as error:  # noqa: BLE001 - a bug in a run must fail that run only
                    if self._is_over(key):
                        return
                    cause = getattr(error, "cause", None) or error
                    logger.exception("run %s/%s failed inside its actor", project, name)
                    await self._finish(
                        key,
                        {
                            "phase": "Failed",
                            "reason": "InternalError",
                            "message": f"{type(cause).__name__}: "
                            f"{str(cause).splitlines()[0][:400] if str(cause) else ''}",
                        },
                    )
                    return
                resumed = await self._finish(key, outcome)
                run = self._runs.get(key)
                if resumed or (run is not None and not self._is_over(key) and not parked(run)):
                    # A message or credits arrived while the actor was finishing (or while this
                    # task reported the outcome, after which a sender found no task to start):
                    # a new actor replays the journal and goes on.
                    ray.kill(actor, no_restart=True)
                    continue
                return
        finally:
            await self._release_actor(key)

    async def _release_actor(self, key: Key) -> None:
        """End the run's actor once the run no longer needs one; a cancelled run loses its sandbox.

        This runs however supervision ends, so a cancel that raced an actor's start still
        leaves no actor running and no workspace behind.
        """
        actor = self._actors.pop(key, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)
        run = self._runs.get(key)
        if run is not None and run["status"]["phase"] == "Cancelled":
            await asyncio.to_thread(self._remove_workspace, *key)

    async def _finish(self, key: Key, outcome: dict[str, Any]) -> bool:
        """Record how the actor's program ended; True when the run must go on at once instead.

        That is a keep-alive run that parked for a message while one arrived, or a run that
        parked for credits while they were added: the message (or the grant) came either before
        this check (then it is seen here) or after (then the run is parked already, and the
        sender, or `add_credits`, starts it).
        """
        resume = False
        async with self._locks[key]:
            run = self._runs.get(key)
            if run is None or run["status"]["phase"] in TERMINAL_PHASES:
                return False
            outcome = dict(outcome)
            if outcome.get("phase") in TERMINAL_PHASES:
                outcome.setdefault("finishedAt", utc_now())
            read = int((outcome.get("messages") or {}).get("read") or 0)
            if outcome.get("reason") == "AwaitingMessage" and self._unread(key, read):
                resume = True
            needed = outcome.pop("creditsNeededUSD", None)
            if outcome.get("reason") == "InsufficientCredits" and self._affordable(key[0], needed):
                resume = True  # credits were added while the actor was finishing
            if resume:
                outcome.update({"phase": "Running", "reason": None, "message": None})
            if resume or (outcome.get("phase") == "Waiting" and outcome.get("reason") in _PARKED_REASONS):
                outcome["actorName"] = None  # given back on purpose: not a lost actor
            merge_status(run["status"], outcome)
            await self._persist_run(key)
        crash_point("run-ended-untold", f"{key[0]}/{key[1]}")
        await self._tell_group(key)
        if parked(run):
            self._arm_deadline(key)
        return resume

    def _arm_deadline(self, key: Key) -> None:
        """A parked or queued run has no actor to watch its deadline; a timer does, without polling."""
        run = self._runs.get(key)
        deadline_at = run["status"].get("deadlineAt") if run else None
        if deadline_at:
            asyncio.get_running_loop().create_task(self._expire_when_due(key, deadline_at))

    async def _expire_when_due(self, key: Key, deadline_at: str) -> None:
        due = parse_timestamp(deadline_at)
        await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
        run = self._runs.get(key)
        if run is None or run["status"]["phase"] in TERMINAL_PHASES:
            return
        if not (parked(run) or self._awaits_admission(run)):
            return  # it has an actor, which watches its own deadline
        await self._finish(
            key,
            {
                "phase": "Failed",
                "reason": "DeadlineExceeded",
                "message": f"the run passed its deadline ({run['spec'].get('deadline') or run['status'].get('deadlineAt')}) "
                f"while waiting ({run['status'].get('reason')})",
            },
        )
        await asyncio.to_thread(self._remove_workspace, *key)

    async def _stop_actor(self, key: Key, run: dict[str, Any]) -> None:
        """Ask the run's actor to stop its command and delete its sandbox, then end the actor."""
        project, name = key
        actor = self._actors.get(key) or self._find_actor(run)
        if actor is not None:
            try:
                await asyncio.wait_for(actor.cancel.remote(), timeout=_CANCEL_GRACE_SECONDS)
            except Exception:  # noqa: BLE001 - a dead or stuck actor is killed below either way
                logger.warning("actor of run %s/%s did not cancel cleanly", project, name)
            ray.kill(actor, no_restart=True)
        if run["status"]["phase"] == "Cancelled":
            await asyncio.to_thread(self._remove_workspace, project, name)


# Waiting runs that hold no actor: nothing moves them but a person (a message, credits, a
# resolution, a cancel) or their deadline.
# A run waiting for credits keeps its actor and stays supervised.
_PARKED_REASONS = frozenset({"NeedsResolution", "MaxCostReached", "AwaitingMessage", "InsufficientCredits"})


def parked(run: dict[str, Any]) -> bool:
    return run["status"]["phase"] == "Waiting" and run["status"].get("reason") in _PARKED_REASONS


def merge_status(status: dict[str, Any], patch: dict[str, Any]) -> None:
    for field, value in patch.items():
        if isinstance(value, dict) and isinstance(status.get(field), dict):
            status[field].update(value)
        else:
            status[field] = value
