"""Run supervision: one live actor per unfinished run, replaced when it dies.

The supervisor awaits each run actor's outcome; when the actor dies it starts a replacement
(named with the next attempt) that replays the run's journal, and however supervision ends it
ends the actor, so a cancel that races an actor's start leaves nothing running. A parked or
queued run has no actor to watch its deadline, so a timer here does. Ending a run (cancel,
delete) is here too: it is ending the run's actor and sandbox.

Creating and killing Ray actors goes through a `RunActorLauncher` (`run_launcher`), the one Ray
boundary, so the supervisor is tested without Ray over a fake launcher.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError

from nodus.lifecycle import (
    PARKED_REASONS,
    RUN_TERMINAL_PHASES,
    IllegalTransition,
    RunPhase,
    RunReason,
    check_run_transition,
    run_transition,
)
from nodus_ray.control.agent_workers import AgentWorkers, queued_for_worker, recovery_order
from nodus_ray.control.generations import journaled_cost, journaled_costs
from nodus_ray.control.inbox import Inboxes
from nodus_ray.control.registry import (
    Key,
    Registry,
    awaits_admission,
    children_ended,
    merge_status,
    parked,
    suspended,
)
from nodus_ray.control.run_config import run_config
from nodus_ray.control.run_launcher import RayRunActors, RunActorLauncher
from nodus_ray.control.run_pool import RunActorPool
from nodus_ray.control.wake_timers import WakeTimers
from nodus_ray.control.workspace_sweep import WorkspaceSweeper
from nodus_ray.durable.fencing import Fenced, JournalConflict
from nodus_ray.faults import crash_point
from nodus_ray.money.credits import CreditLedger
from nodus_ray.runtime.run_actor import run_actor_name
from nodus_ray.runtime.run_config import actor_resources
from nodus_ray.sandbox.run_workspaces import workspace_path
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.settings import ServerSettings
from nodus_ray.store import layout
from nodus_ray.store.timestamps import parse_timestamp, utc_now

# RunActorLauncher and RayRunActors live in `run_launcher`; importing them from here still works.
__all__ = ["RunSupervisor", "RunActorLauncher", "RayRunActors"]

logger = logging.getLogger(__name__)

_CANCEL_GRACE_SECONDS = 15.0


class RunSupervisor:
    """Actor lifecycle of runs: supervising, replacing, deadlines, cancelling and removing."""

    def __init__(
        self,
        registry: Registry,
        settings: ServerSettings,
        pool: RunActorPool,
        launcher: RunActorLauncher,
        inboxes: Inboxes,
        credits: CreditLedger,
    ) -> None:
        self._registry = registry
        self._settings = settings
        self._pool = pool
        self._launcher = launcher
        self._inboxes = inboxes
        self._credits = credits
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._actors: dict[Key, Any] = {}
        # Actors lost since the run's program last ended or parked (in memory: a restarted
        # control plane starts counting again). `status.actorLosses` counts all of them.
        self._losses_in_a_row: dict[Key, int] = {}
        # Workspaces of runs that no longer exist go (`sweep_soon`: at recovery, after deletes).
        self.sweeper = WorkspaceSweeper(registry, settings.sandbox_root)
        # Parked Python runs that sleep (or wait with a timeout): one timer each, no actor.
        self.wake_timers = WakeTimers(registry, self.supervise)
        self.workers = AgentWorkers(registry)  # each Agent's spec.maxWorkers
        # The project Budget (`control.budgets`, wired by `compose`): whether a run that parked
        # with BudgetExceeded could go on at once, and what a deleted run had billed.
        self.budget_affordable: Callable[[str, str | None, str], bool] = lambda project, needed, run: False
        self.budget_forget: Callable[[str, str], None] = lambda project, name: None

    # -- recovery ---------------------------------------------------------------------------

    def recover(self) -> None:
        """After a (re)start: re-attach every unfinished run to its actor, or arm its deadline."""
        for key, run in sorted(self._registry.runs.items(), key=recovery_order):  # the queue's order
            if run["status"]["phase"] in RUN_TERMINAL_PHASES:
                continue
            if parked(run) or awaits_admission(run):
                self.arm_deadline(key)
            else:
                self.supervise(key)
        self.wake_timers.recover()

    # -- paths ------------------------------------------------------------------------------

    def hidden_paths(self) -> tuple[str, ...]:
        """Host paths a sandbox must not see: every workspace, and the storage if it is local."""
        storage = self._registry.storage
        hidden = [self._settings.sandbox_root]
        if storage.is_local:
            hidden.append(storage.local_root)
        return tuple(hidden)

    def workspace(self, project: str, name: str) -> str:
        """The run's workspace, keyed by its uid: never the directory of an earlier run of its name."""
        uid = self._registry.runs[(project, name)]["metadata"].get("uid")
        return str(workspace_path(self._settings.sandbox_root, project, name, uid))

    def remove_workspace(self, project: str, name: str) -> None:
        """The local directory and its marker; the snapshots go with the run's storage."""
        if (project, name) not in self._registry.runs:
            return  # gone already: what it left is the sweep's
        workspace = Path(self.workspace(project, name))
        shutil.rmtree(workspace, ignore_errors=True)
        WorkspaceSnapshots.marker_of(workspace).unlink(missing_ok=True)

    # -- supervising ------------------------------------------------------------------------

    def supervise(self, key: Key) -> None:
        """Keep one live actor on the run until it ends (a no-op when it is supervised already);
        a run over its Agent's spec.maxWorkers is queued instead (`agent_workers`)."""
        task = self._tasks.get(key)
        if task is None or task.done():
            if not self.workers.take(key):
                self.arm_deadline(key)
                for older in self.workers.startable_for(key):  # the limit was raised meanwhile
                    self.supervise(older)
                return
            self._tasks[key] = asyncio.get_running_loop().create_task(self._supervise_run(key))

    def _find_actor(self, run: dict[str, Any]) -> Any | None:
        """The live actor of the run, by the name the run recorded for it (none after it was released)."""
        actor_name = run["status"].get("actorName")
        return self._launcher.find(actor_name) if actor_name else None

    async def _note(self, key: Key, patch: dict[str, Any]) -> None:
        """Record the run's attempt, actor name or losses (a finished run is left as it is)."""
        async with self._registry.locks[key]:
            run = self._registry.runs.get(key)
            if run is None or run["status"]["phase"] in RUN_TERMINAL_PHASES:
                return
            merge_status(run["status"], patch)
            await self._registry.persist_run(key)

    async def _start_actor(self, key: Key) -> Any:
        """A new actor for the run's next attempt: a pre-started one from the pool when one is
        parked (no process start to wait for), else a fresh one. The attempt and the actor's
        name are written before the actor gets the run, so a restarted control plane finds it."""
        run = self._registry.runs[key]
        project, name = key
        attempt = int(run["status"].get("attempts") or 0) + 1
        config = await run_config(
            self._registry,
            self._settings,
            key,
            attempt,
            workspace=self.workspace(project, name),
            hidden_paths=self.hidden_paths(),
        )
        # One kept for its Agent first; an Agent that sizes its actors (spec.cpu/memory) gets a
        # fresh one, since a pre-started actor holds no resources.
        sized = bool(actor_resources(config.agent_spec))
        slot = None if sized else self._pool.take((project, str(run["spec"]["agent"])))
        if slot is not None:
            await self._note(key, {"attempts": attempt, "actorName": slot.name})
            assigned = self._pool.assign(slot, config)
            self._pool.fill()
            if assigned:
                return slot.handle
            self._pool.discard(slot)  # it died while parked: start a fresh one instead
        actor_name = run_actor_name(project, name, attempt)
        await self._note(key, {"attempts": attempt, "actorName": actor_name})
        return self._launcher.start(actor_name, config)

    async def _supervise_run(self, key: Key) -> None:
        """Keep one live actor on an unfinished run until it ends; replace actors that die."""
        project, name = key
        is_over = self._registry.is_over
        try:
            while not is_over(key):
                run = self._registry.runs[key]
                if parked(run):
                    return  # suspended (its actor killed on purpose): no replacement, no loss
                actor = self._find_actor(run)
                if actor is None:
                    # It had a live actor, and that one is gone.
                    if run["status"].get("actorName") and await self._lost_too_often(key):
                        return
                    try:
                        actor = await self._start_actor(key)
                    except Exception:  # noqa: BLE001 - e.g. the run was deleted meanwhile
                        if is_over(key):
                            return
                        logger.exception("could not start an actor for run %s/%s", project, name)
                        await self._fail(
                            key, RunReason.INTERNAL_ERROR, "the run's actor could not be started"
                        )
                        return
                self._actors[key] = actor
                if is_over(key) or parked(self._registry.runs[key]):  # cancelled, deleted or suspended
                    return
                try:
                    outcome = await actor.run.remote()
                except RayActorError:
                    logger.warning(
                        "actor of run %s/%s died; replaying its journal in a new actor", project, name
                    )
                    continue
                except Exception as error:  # noqa: BLE001 - a bug in a run must fail that run only
                    if is_over(key):
                        return
                    cause = getattr(error, "cause", None) or error
                    if isinstance(cause, Fenced | JournalConflict):
                        # Two actors of the run were alive at once (one frozen, or cut off, then
                        # back). This one stopped writing; a fresh attempt fences them both.
                        logger.warning("run %s/%s: %s; starting a new attempt", project, name, cause)
                        self._launcher.kill(actor)
                        # Counted as a loss (and so bounded by NODUS_MAX_ACTOR_RESTARTS), found here.
                        if await self._lost_too_often(key):
                            return
                        continue
                    logger.exception("run %s/%s failed inside its actor", project, name)
                    first_line = str(cause).splitlines()[0][:400] if str(cause) else ""
                    await self._fail(key, RunReason.INTERNAL_ERROR, f"{type(cause).__name__}: {first_line}")
                    return
                self._losses_in_a_row.pop(key, None)  # its program ended or parked: it progressed
                try:
                    resumed = await self.finish(key, outcome.to_patch(), actor_outcome=True)
                except IllegalTransition as illegal:  # a bug, made visible: the run fails, it never hangs
                    logger.error("run %s/%s: %s", project, name, illegal)
                    await self._fail(key, RunReason.INTERNAL_ERROR, str(illegal))
                    return
                after = self._registry.runs.get(key)
                if resumed or (after is not None and not is_over(key) and not parked(after)):
                    # A message or credits arrived while the actor was finishing (or while this
                    # task reported the outcome, after which a sender found no task to start):
                    # a new actor replays the journal and goes on.
                    self._launcher.kill(actor)
                    continue
                return
        finally:
            await self._release_actor(key)

    def forget_losses(self, key: Key) -> None:
        """A retried run starts counting its lost actors again."""
        self._losses_in_a_row.pop(key, None)

    async def _lost_too_often(self, key: Key) -> bool:
        """Count one lost actor of the run (and forget its name); fail the run with `RunnerLost`
        when more than NODUS_MAX_ACTOR_RESTARTS were lost in a row, with no program end or park
        between them: a keep-alive run that lives for days may lose many actors, one at a time."""
        losses = int(self._registry.runs[key]["status"].get("actorLosses") or 0) + 1
        in_a_row = self._losses_in_a_row[key] = self._losses_in_a_row.get(key, 0) + 1
        await self._note(key, {"actorLosses": losses, "actorName": None})
        if in_a_row <= self._settings.max_actor_restarts:
            return False
        await self._fail(
            key,
            RunReason.RUNNER_LOST,
            f"the run's actor was lost {in_a_row} times in a row ({losses} in all)",
        )
        return True

    async def _release_actor(self, key: Key) -> None:
        """End the run's actor once the run no longer needs one; a cancelled run loses its sandbox.

        This runs however supervision ends, so a cancel that raced an actor's start still
        leaves no actor running and no workspace behind.
        """
        actor = self._actors.pop(key, None)
        if actor is not None:
            self._launcher.kill(actor)
        for queued in self.workers.release(key):  # its worker goes to the Agent's oldest queued run
            self.supervise(queued)
        run = self._registry.runs.get(key)
        if run is not None and run["status"]["phase"] == RunPhase.CANCELLED:
            await asyncio.to_thread(self.remove_workspace, *key)

    def _affordable(self, project: str, needed: str | None) -> bool:
        return needed is not None and self._credits.project(project).available >= Decimal(needed)

    async def _fail(self, key: Key, reason: RunReason, message: str) -> bool:
        """Fail the run for a reason of the supervisor's own (its actor lost, its deadline passed).

        No actor reports the run's final cost then, and the last report may lag the journal (a
        model call recorded, its report lost with the actor): the cost is the journal's.
        """
        outcome: dict[str, Any] = {"phase": RunPhase.FAILED.value, "reason": reason.value, "message": message}
        outcome["cost"] = await asyncio.to_thread(self._journaled_costs, key)
        return await self.finish(key, outcome)

    def _journaled_cost(self, key: Key) -> Decimal:
        """What the run's journal says it cost: the sum of its completed steps' costs (and of
        its earlier generations', `control.generations`)."""
        run = self._registry.runs.get(key)
        return journaled_cost(self._registry.storage, key, run["status"] if run is not None else {})

    def _journaled_costs(self, key: Key) -> dict[str, str]:
        """Every ``status.cost`` figure by the journal: the model spend and the sandbox charges
        its steps recorded (`generations.journaled_costs`), so a crash loses no recorded charge."""
        run = self._registry.runs.get(key)
        return journaled_costs(self._registry.storage, key, run["status"] if run is not None else {})

    async def finish(self, key: Key, outcome: dict[str, Any], *, actor_outcome: bool = False) -> bool:
        """Record how the actor's program ended; True when the run must go on at once instead.

        That is a run that parked for a message while one arrived, for credits while they were
        added, or for children that all ended meanwhile: the message (the grant, the child's
        end) came either before this check (then it is seen here) or after (then the run is
        parked already, and the sender, `add_credits` or the child's end starts it). The outcome
        of an actor a suspend killed is dropped: the run is parked, and a replay reaches it again.
        """
        async with self._registry.locks[key]:
            run = self._registry.runs.get(key)
            if run is None or run["status"]["phase"] in RUN_TERMINAL_PHASES:
                return False
            if actor_outcome and suspended(run):
                return False
            outcome = dict(outcome)
            check_run_transition(run["status"]["phase"], outcome["phase"])  # before anything changes
            if outcome.get("phase") in RUN_TERMINAL_PHASES:
                outcome.setdefault("finishedAt", utc_now())
            resume = await self._goes_on_at_once(key, outcome)
            if resume:
                outcome.update({"phase": RunPhase.RUNNING.value, "reason": None, "message": None})
                outcome.update({"wakeAt": None, "waitingFor": None})
            if resume or (
                outcome.get("phase") == RunPhase.WAITING and outcome.get("reason") in PARKED_REASONS
            ):
                outcome["actorName"] = None  # given back on purpose: not a lost actor
            merge_status(run["status"], outcome)
            # The ledger charges what the run's status says it cost (no report may come any more),
            # in the same step as the status changes: whoever sees the one sees the other.
            self._credits.record_run_spend(*key, Decimal(run["status"]["cost"].get("totalUSD") or "0"))
            await self._registry.persist_run(key)
        crash_point("run-ended-untold", f"{key[0]}/{key[1]}")
        await self._registry.run_changed(key)
        if parked(run):
            self.arm_deadline(key)
            self.wake_timers.arm(key)
        return resume

    async def _goes_on_at_once(self, key: Key, outcome: dict[str, Any]) -> bool:
        """Whether what the program parks for is there already (a message, credits, its children)."""
        reason = outcome.get("reason")
        needed = outcome.pop("creditsNeededUSD", None)
        if reason == RunReason.INSUFFICIENT_CREDITS:
            return self._affordable(key[0], needed)  # credits were added while the actor was finishing
        budget_needed = outcome.pop("budgetNeededUSD", None)
        if reason == RunReason.BUDGET_EXCEEDED:  # the Budget was raised while the actor was finishing
            if budget_needed is not None:  # kept in the status, so a restarted service knows it too
                outcome["waitingFor"] = {"budgetUSD": str(budget_needed)}
            return self.budget_affordable(key[0], budget_needed, key[1])
        waiting_for = outcome.get("waitingFor") or {}
        if reason == RunReason.AWAITING_MESSAGE:
            if waiting_for.get("message"):  # a Python program waits for a message of one name
                after, name = int(waiting_for.get("after") or 0), str(waiting_for["message"])
                return await asyncio.to_thread(self._inboxes.unread, key, after, name)
            read = int((outcome.get("messages") or {}).get("read") or 0)
            return await asyncio.to_thread(self._inboxes.unread, key, read)
        if reason == RunReason.AWAITING_CHILDREN:
            names = [str(name) for name in waiting_for.get("children") or []]
            return bool(names) and children_ended(self._registry.runs, key[0], names)
        return False

    # -- deadlines --------------------------------------------------------------------------

    def arm_deadline(self, key: Key) -> None:
        """A parked or queued run has no actor to watch its deadline; a timer does, without polling."""
        run = self._registry.runs.get(key)
        deadline_at = run["status"].get("deadlineAt") if run else None
        if deadline_at:
            asyncio.get_running_loop().create_task(self._expire_when_due(key, deadline_at))

    async def _expire_when_due(self, key: Key, deadline_at: str) -> None:
        due = parse_timestamp(deadline_at)
        await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
        run = self._registry.runs.get(key)
        if run is None or run["status"]["phase"] in RUN_TERMINAL_PHASES:
            return
        if not (parked(run) or awaits_admission(run) or queued_for_worker(run)):
            return  # it has an actor, which watches its own deadline
        deadline = run["spec"].get("deadline") or run["status"].get("deadlineAt")
        await self._fail(
            key,
            RunReason.DEADLINE_EXCEEDED,
            f"the run passed its deadline ({deadline}) while waiting ({run['status'].get('reason')})",
        )
        await asyncio.to_thread(self.remove_workspace, *key)

    # -- ending runs ------------------------------------------------------------------------

    async def cancel(self, key: Key, reason: str, message: str) -> dict[str, Any]:
        """Cancel the run (a finished one stays as it is): its command is killed, its sandbox deleted."""
        run = self._registry.runs[key]
        async with self._registry.locks[key]:
            if run["status"]["phase"] in RUN_TERMINAL_PHASES:
                return run
            # Terminal first, so neither the supervisor nor a late report revives the run.
            patch = run_transition(run["status"], RunPhase.CANCELLED, reason, message)
            run["status"].update({**patch, "finishedAt": utc_now()})
            await self._registry.persist_run(key)
        await self._registry.run_changed(key)
        await self.stop_actor(key, run)
        await self.settle_cost(key)
        return run

    def kill_actor(self, key: Key) -> None:
        """End the run's actor (and so its sandbox's process), keeping its workspace: a suspend."""
        run = self._registry.runs.get(key)
        actor = self._actors.get(key) or (self._find_actor(run) if run is not None else None)
        if actor is not None:
            self._launcher.kill(actor)

    async def settle_cost(self, key: Key) -> None:
        """A run stopped by the control plane (cancelled, suspended): once its actor is stopped,
        its cost is the journal's, which a step finished meanwhile may have raised past the last
        report."""
        costs = await asyncio.to_thread(self._journaled_costs, key)
        total = Decimal(costs["totalUSD"])
        async with self._registry.locks[key]:
            run = self._registry.runs.get(key)
            cost = run["status"]["cost"] if run is not None else {}
            if run is None or all(
                Decimal(str(cost.get(field) or "0")) == Decimal(value) for field, value in costs.items()
            ):
                return
            cost.update(costs)
            self._credits.record_run_spend(*key, total)
            await self._registry.persist_run(key)
        await self._registry.run_changed(key)

    async def stop_actor(self, key: Key, run: dict[str, Any]) -> None:
        """Ask the run's actor to stop its command and delete its sandbox, then end the actor."""
        project, name = key
        actor = self._actors.get(key) or self._find_actor(run)
        if actor is not None:
            try:
                await asyncio.wait_for(actor.cancel.remote(), timeout=_CANCEL_GRACE_SECONDS)
            except Exception:  # noqa: BLE001 - a dead or stuck actor is killed below either way
                logger.warning("actor of run %s/%s did not cancel cleanly", project, name)
            self._launcher.kill(actor)
        if run["status"]["phase"] == RunPhase.CANCELLED:
            await asyncio.to_thread(self.remove_workspace, project, name)

    async def remove(self, key: Key) -> None:
        """Cancel the run if unfinished, end its actor, then remove its workspace, journal and resource."""
        registry = self._registry
        run = registry.runs.get(key)
        if run is None:
            return
        if run["status"]["phase"] not in RUN_TERMINAL_PHASES:
            await self.cancel(key, RunReason.CANCELLED.value, "cancelled because it was deleted")
        else:
            await self.stop_actor(key, run)
        async with registry.locks[key]:
            await asyncio.to_thread(self.remove_workspace, *key)
            await asyncio.to_thread(registry.storage.delete_tree, layout.run_prefix(*key))
            await asyncio.to_thread(self.budget_forget, *key)
            await asyncio.to_thread(self._credits.forget_run, *key)
            registry.runs.pop(key, None)
            self._inboxes.forget(key)
        self.sweeper.sweep_soon()  # what an earlier run of the name, or an unfinished delete, left
