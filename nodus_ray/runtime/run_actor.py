"""One detached Ray actor per run: its sandbox, its journal and its program.

The actor is disposable. Everything it knows that matters is in the journal, so when it dies
(a crash, a killed node, ``ray stop``) the control plane starts another that loads the
journal and runs the same program, which replays what was recorded and continues. The actor
reports progress upward to the control plane, which alone writes the run's resource.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import shutil
import socket
import threading
from collections.abc import Coroutine
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from nodus.errors import NodusError
from nodus.lifecycle import RunPhase, RunReason
from nodus_ray import tracing
from nodus_ray.control.client import ControlPlaneClient, FailFast, RunOutcome, RunReport
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.fencing import Epoch, Fenced
from nodus_ray.durable.journal import Journal
from nodus_ray.durable.steps import Steps
from nodus_ray.faults import crash_point
from nodus_ray.models import ModelProvider, provider_for
from nodus_ray.money.billing import RunBudget
from nodus_ray.money.prices import PriceTable
from nodus_ray.money.spend import BudgetExceeded, CreditsExhausted, RunSpend
from nodus_ray.runtime.conversation import Conversation, ConversationSpec
from nodus_ray.runtime.interrupted import command_attempts, undoable_command
from nodus_ray.runtime.program.ends import ContinuedAsNew, is_program
from nodus_ray.runtime.rate_limited import limit_calls
from nodus_ray.runtime.router import ROUTER_ACTOR_NAME
from nodus_ray.runtime.run_config import RunConfig
from nodus_ray.runtime.run_outcomes import RUN_STOPS, answered_outcome, run_cost, run_outcome, stopped_outcome
from nodus_ray.runtime.turn_record import TurnRecord
from nodus_ray.runtime.waiting import command_evidence
from nodus_ray.sandbox import Sandbox, bwrap_available, create_sandbox
from nodus_ray.sandbox.images import ImageError, ImageRoot, run_image
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots, accepted_states
from nodus_ray.settings import NAMESPACE
from nodus_ray.store import layout
from nodus_ray.store.storage import Storage
from nodus_ray.store.timestamps import parse_timestamp, utc_now

if TYPE_CHECKING:  # loaded by the runs that use them: a program's, one that reaches hosts
    from nodus_ray.egress.run_egress import RunEgress
    from nodus_ray.runtime.program.python_program import PythonProgram

__all__ = ["RunConfig", "RunActor", "run_actor_name"]

logger = logging.getLogger(__name__)

_ROUTER_TIMEOUT_SECONDS = 5.0
_CONTROL_PLANE_PATIENCE_SECONDS = 120.0


def run_actor_name(project: str, name: str, attempt: int) -> str:
    """Unique per attempt, so a replacement never races the dead actor's name."""
    return f"run.{project}.{name}.{attempt}"


class RunActor:
    """Runs the program once per actor; `run` can be awaited any number of times."""

    def __init__(self, config: RunConfig | str, *, warm_anthropic: bool = False):
        if isinstance(config, str):
            config = self._claim(config, warm_anthropic)
        self.config = config
        self.phase: RunPhase = RunPhase.PENDING
        self._task: asyncio.Task[RunOutcome] | None = None
        self._sandbox: Sandbox | None = None
        self._sandbox_lock = threading.Lock()  # an open and the deletion, one at a time
        self._sandbox_deleted = False
        self._cancelled = False
        self._storage = Storage(config.storage_uri)
        self._control_plane = ControlPlaneClient.for_engine(_CONTROL_PLANE_PATIENCE_SECONDS)
        self._epoch = Epoch(self._storage, layout.run_prefix(config.project, config.name), config.attempt)
        self._workspace = WorkspaceSnapshots(
            self._storage,
            layout.run_prefix(config.project, config.name),
            Path(config.workspace),
            enabled=config.workspace_snapshots,
            seeded=config.workspace_seeded,
            fence=self._epoch.check,
            history=True,  # every command's state stays: a fork may start from any (decision 58)
        )
        self._workspace_states: tuple[int, ...] = ()
        # (the interrupted command's Started seq, the state to put back) when this actor is to
        # undo an interrupted command, and the seq it did undo (`_open_sandbox`).
        self._undo: tuple[int, int] | None = None
        self._undone: int | None = None
        self._journal: Journal | None = None
        self._steps: Steps | None = None
        self._program_logs: list[str] = []  # what the program printed, over its generations
        self._workspace_origin = "local"
        self._env: dict[str, str] = {}  # spec.env, secret values opened: memory only
        self._image: ImageRoot | None = None  # the run's image on this node (None: the host's root)
        allowed = ((config.agent_spec.get("network") or {}).get("allowedHosts")) or []
        self._allowed_hosts: list[str] = list(allowed)
        # With storage, the proxy writes each command's connections as they happen: the
        # evidence a person needs when that command is interrupted (`runtime.waiting`).
        self._egress: RunEgress | None = None
        if allowed:
            from nodus_ray.egress.run_egress import RunEgress

            self._egress = RunEgress(
                allowed,
                config.egress_private_networks,
                storage=self._storage,
                run_prefix=layout.run_prefix(config.project, config.name),
            )

    @staticmethod
    def _claim(slot: str, warm_anthropic: bool) -> RunConfig:
        """A pooled actor (`run_pool`): wait, inside ``__init__``, for the one run it will serve.

        Ray takes the actor's ``__repr__`` for the dashboard when ``__init__`` returns, so
        returning only with a run is what makes a pooled actor show its run there.
        """
        # What a run pays for in its first steps is paid here, while nothing waits: the
        # bubblewrap probe (once per process), the price table, the Anthropic SDK when needed.
        bwrap_available()
        PriceTable.load()
        if warm_anthropic:  # the SDK takes about 1 s to import here; a run on Claude needs it
            importlib.import_module("nodus_ray.models.anthropic_provider")
        config = ControlPlaneClient(FailFast()).claim_slot(slot)  # no retry: a slot outlives no control plane
        if config is None:
            raise RuntimeError(f"run slot {slot} was retired without a run")
        return config

    def __repr__(self) -> str:
        c = getattr(self, "config", None)
        if c is None:  # a parked actor whose claim failed in __init__: Ray still asks its repr
            return "RunActor(unclaimed)"
        group = f", group={c.group}" if c.group else ""
        return f"RunActor(run={c.project}/{c.name}{group}, agent={c.agent}@{c.agent_revision}, phase={self.phase})"

    async def run(self) -> RunOutcome:
        """Start the program if it has not started, and return its outcome when it ends."""
        if self._task is None:
            self._task = asyncio.create_task(tracing.traced_run(self.config, self._execute()))
        return await asyncio.shield(self._task)

    async def cancel(self) -> None:
        """Stop the running command and delete the sandbox; the control plane records why."""
        self._cancelled = True
        # The program first, so that the killed command is not journaled as a finished step;
        # then the command itself, whose thread the task's cancellation cannot stop.
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._sandbox is not None:
            await asyncio.to_thread(self._sandbox.cancel)
        if self._task is not None:
            try:
                await self._task
            except BaseException:  # noqa: BLE001 - the task's end is the cancel we asked for
                pass
        await asyncio.to_thread(self._delete_sandbox)
        self.phase = RunPhase.CANCELLED

    def _delete_sandbox(self) -> None:
        # An open still going on in its thread (the program's task was cancelled while it
        # awaited it: a cancel, a passed deadline) is waited for, and no open starts after this:
        # otherwise it created the workspace after the deletion, and the ended run left it.
        with self._sandbox_lock:
            self._sandbox_deleted = True
            if self._sandbox is not None:
                self._sandbox.delete()
            else:  # never opened by this actor (a replacement): the directory is all there is
                shutil.rmtree(self.config.workspace, ignore_errors=True)
            self._workspace.forget()

    async def _report(self, report: RunReport) -> None:
        report.attempt = self.config.attempt  # a zombie's reports are dropped (`RunService.report`)
        await self._control_plane.report(self.config.project, self.config.name, report)

    def _open_sandbox(self) -> Sandbox:
        with self._sandbox_lock:
            if self._sandbox_deleted:
                raise RuntimeError(f"run {self.config.name} has ended: its sandbox was deleted")
            return self._open_sandbox_locked()

    def _open_sandbox_locked(self) -> Sandbox:
        if self._undo is not None and self._undone is None and self._workspace.restore_state(self._undo[1]):
            # The interrupted command may have half changed the local copy: what the snapshot
            # before it holds is the workspace now, and the command runs again.
            self._workspace_origin, self._undone = "restored", self._undo[0]
        elif is_program(self.config.agent_spec):  # its snapshots follow its steps, not commands
            from nodus_ray.runtime.program.wiring import ensure_program_workspace

            self._workspace_origin = ensure_program_workspace(self._workspace)
        else:
            # The journal's commands happened in a workspace that may be on another node's
            # disk: use it here only if it is that workspace, else restore its snapshot, else fail.
            self._workspace_origin = self._workspace.ensure(self._workspace_states)
        # Other runs' workspaces and the storage are mounted away, not merely unreadable.
        self._sandbox = create_sandbox(
            Path(self.config.workspace),
            uid=self.config.sandbox_uid,
            hidden_paths=[Path(path) for path in self.config.hidden_paths],
            env=self._env,
            egress_socket=self._egress.start() if self._egress is not None else None,
            image=self._image,
        )
        return self._sandbox

    async def _provider(self, prices: PriceTable) -> tuple[ModelProvider, str, dict[str, str]]:
        """The provider and access of this run, and the user's own key to redact (BYOK); the
        key stays in this actor's memory only."""
        access = await self._control_plane.model_access(self.config.project, self.config.name)
        provider = provider_for(
            access, family_models=prices.family_models, latency_seconds=self.config.offline_latency_seconds
        )
        provider = limit_calls(provider, access, self.config.rate_limits, self._report)  # NODUS_RATE_LIMITS
        secret = (self.config.agent_spec.get("model") or {}).get("apiKeySecret")
        own_key = {f"{secret}/ANTHROPIC_API_KEY": access["apiKey"]} if access.get("access") == "BYOK" else {}
        return provider, str(access.get("access") or "Nodus"), own_key

    async def _route(self, prompt: str, allowed: list[str]) -> dict[str, Any]:
        router = ray.get_actor(ROUTER_ACTOR_NAME, namespace=NAMESPACE)
        return await asyncio.wait_for(router.route.remote(prompt, allowed), timeout=_ROUTER_TIMEOUT_SECONDS)

    async def _reserve_credits(self, amount: Decimal) -> None:
        """Hold the call's worst case from the project's credits, or wait without an actor."""
        config = self.config
        if not await self._control_plane.reserve_credits(
            config.project, config.name, str(amount), config.attempt
        ):
            raise CreditsExhausted(amount)

    async def _reserve_budget(self, amount: Decimal) -> None:
        """Hold the next step's largest price against the project's Budget, or wait without an
        actor until the Budget is raised or a new period begins."""
        config = self.config
        if not await self._control_plane.reserve_budget(
            config.project, config.name, str(amount), config.attempt
        ):
            raise BudgetExceeded(amount)

    async def _execute(self) -> RunOutcome:
        try:
            outcome = await self._program()
        except Fenced as fenced:
            # A newer actor serves the run (this one was frozen or cut off, then came back):
            # it stops here, having written nothing, and the control plane ignores it.
            logger.warning("run %s: %s; this actor stops", self.config.name, fenced)
            crash_point("actor-fenced", f"{self.config.project}/{self.config.name}")
            raise
        finally:
            if self._egress is not None:  # no command runs any more: nothing can connect
                await asyncio.to_thread(self._egress.close)
        # This actor appends no more: fold its records into a few objects, so the next replay
        # (the next message of a keep-alive run, a restart) reads a few objects, not one per record.
        if self._journal is not None:
            try:
                await asyncio.to_thread(self._journal.compact)
            except Exception:  # noqa: BLE001 - the segments stay as they are, which is correct too
                logger.warning("run %s: could not compact its journal", self.config.name, exc_info=True)
        return outcome

    async def _program(self) -> RunOutcome:
        # The epoch first, the journal second: a zombie's Started is then either in what this
        # actor loads, or written after this claim, which the zombie sees and stops at.
        await asyncio.to_thread(self._epoch.claim)
        while True:
            try:
                return await self._generation()
            except ContinuedAsNew as switched:
                # The control plane recorded the next generation (`control.generations`): this
                # actor runs it, same attempt and epoch, on its empty journal with the new input.
                self.config = replace(
                    self.config,
                    generation=switched.generation,
                    generation_input=switched.input_text,
                    journal_first_seq=switched.first_seq,
                    prior_cost_usd=switched.prior_usd,
                    prior_sandbox_usd=switched.prior_sandbox_usd,
                    messages_read=switched.read,
                )

    async def _generation(self) -> RunOutcome:
        """One journal generation of the run (a Claude run, and most programs, have one)."""
        config = self.config
        journal = self._journal = Journal(
            self._storage,
            layout.journal_generation_folder(config.project, config.name, config.generation),
            fence=self._epoch.check,
            first_seq=config.journal_first_seq,
        )
        await asyncio.to_thread(journal.load)
        attempts = command_attempts(journal.records)
        self._workspace_states = accepted_states(attempts)
        if self._egress is None:  # it reaches nothing outside: an interrupted command can be undone
            self._undo = undoable_command(journal.records, attempts)
        steps = self._steps = Steps(journal)
        agent = config.agent_spec
        model = agent.get("model") or {}
        prices = PriceTable.load(config.prices_file)
        try:
            provider, access, own_key = await self._provider(prices)
            secrets = await self._control_plane.run_secrets(config.project, config.name)
        except NodusError as refused:
            self.phase = RunPhase.FAILED
            return RunOutcome(
                phase=RunPhase.FAILED, reason=refused.code, message=refused.message, finishedAt=utc_now()
            )
        try:  # the pinned image, unpacked on this node once per digest (`sandbox.images`)
            self._image = await asyncio.to_thread(
                run_image,
                config.image,
                config.images_cache,
                egress=self._egress is not None,
                program=is_program(agent),
            )
            if self._image is not None and not bwrap_available():  # the fallback has no root of its own
                raise ImageError(f"image {self._image.ref} needs bubblewrap, which this node cannot run")
        except ImageError as unusable:
            self.phase = RunPhase.FAILED
            return RunOutcome(
                phase=RunPhase.FAILED,
                reason=RunReason.IMAGE_PULL_FAILED.value,
                message=str(unusable),
                finishedAt=utc_now(),
            )
        cap = Decimal(config.cap_usd) if access == "Nodus" and config.cap_usd else None
        prior = Decimal(config.prior_cost_usd)  # the earlier generations': the cap is the run's
        budget = RunBudget(cap=cap, spent=prior if cap is None else min(prior, cap))
        spend = RunSpend(
            prices=prices,
            access=access,
            budget=budget,
            reserve_credits=self._reserve_credits,
            reserve_budget=self._reserve_budget,
        )
        redact = Redactor({**secrets["redact"], **own_key})
        conversation: Conversation | PythonProgram
        if is_program(agent):  # the Agent is a Python program: it runs in the sandbox, served here
            from nodus_ray.runtime.program.wiring import build_program

            program = build_program(
                config=config,
                steps=steps,
                storage=self._storage,
                control=self._control_plane,
                provider=provider,
                spend=spend,
                router=self._route,
                open_sandbox=self._open_sandbox,
                on_progress=self._on_progress,
                workspace=self._workspace,
                redact=redact,
            )
            program.logs = self._program_logs  # one log per attempt, over its generations
            conversation = program
        else:
            conversation = Conversation(
                steps=steps,
                provider=provider,
                spec=ConversationSpec(
                    system=agent.get("system", ""),
                    families=model.get("families"),
                    model_name=model.get("name"),
                    max_tokens=int(agent.get("maxTokens", 1024)),
                    max_tool_calls=int(agent.get("maxToolCalls", 50)),
                    prompt=config.run_spec.get("input", ""),
                    keep_alive=bool(config.run_spec.get("keepAlive")),
                ),
                spend=spend,
                router=self._route,
                open_sandbox=self._open_sandbox,
                on_progress=self._on_progress,
                next_message=self._next_message,
                on_answer=self._write_answer,
                after_command=self._workspace.after_command,
                redact=redact,
                take_egress=self._egress.take if self._egress is not None else None,
                begin_egress=self._egress.begin if self._egress is not None else None,
                egress_evidence=(
                    partial(command_evidence, self._storage, layout.run_prefix(config.project, config.name))
                    if self._egress is not None
                    else None
                ),
                restored_before=lambda seq: seq == self._undone,
            )
        self._env = secrets["env"]
        self._conversation = conversation
        if self.phase == RunPhase.RUNNING:  # a later generation: the run has been Running since
            return await self._conclude(conversation)
        self.phase = RunPhase.RUNNING
        await self._report(
            RunReport(
                phase=RunPhase.RUNNING,
                reason=None,
                message=None,
                startedAt=utc_now(),
                sandbox={
                    "node": socket.gethostname(),
                    "nodeId": ray.get_runtime_context().get_node_id(),
                    "workspace": config.workspace,
                },
            )
        )
        return await self._conclude(conversation)

    async def _conclude(self, conversation: Conversation | PythonProgram) -> RunOutcome:
        """Run the conversation (or program) to its end, and say how it ended (`run_outcomes`)."""
        config = self.config
        try:
            answer = await self._with_deadline(conversation.run())
        except RUN_STOPS as stopped:
            return self._ended(stopped_outcome(config, stopped, conversation, self._allowed_hosts))
        except TimeoutError:
            if self._sandbox is not None:
                await asyncio.to_thread(self._sandbox.cancel)
            await asyncio.to_thread(self._delete_sandbox)
            return self._outcome(
                RunPhase.FAILED,
                RunReason.DEADLINE_EXCEEDED,
                f"the run passed its deadline ({config.run_spec.get('deadline') or config.deadline_at})",
                conversation,
            )
        await self._write_answer(answer)
        return self._ended(answered_outcome(config, answer, conversation))

    def _ended(self, outcome: RunOutcome) -> RunOutcome:
        self.phase = outcome.phase
        return outcome

    def _outcome(
        self,
        phase: RunPhase,
        reason: str,
        message: str | None,
        conversation: Conversation | PythonProgram,
        *,
        answer: str | None = None,
    ) -> RunOutcome:
        return self._ended(run_outcome(self.config, phase, reason, message, conversation, answer=answer))

    async def _write_answer(self, answer: str) -> None:
        """The latest answer, whole (a keep-alive run rewrites it after every turn)."""
        config = self.config
        await asyncio.to_thread(self._epoch.check, "before writing the answer")
        await asyncio.to_thread(
            self._storage.write_bytes,
            layout.run_answer(config.project, config.name),
            answer.encode("utf-8"),
        )

    async def _next_message(self, after_seq: int) -> dict[str, Any] | None:
        return await self._control_plane.next_message(self.config.project, self.config.name, after_seq)

    async def _with_deadline(self, program: Coroutine[Any, Any, str]) -> str:
        if not self.config.deadline_at:
            return await program
        deadline = parse_timestamp(self.config.deadline_at)
        remaining = (deadline - datetime.now(UTC)).total_seconds()
        if remaining <= 0:
            program.close()
            raise TimeoutError
        return await asyncio.wait_for(program, timeout=remaining)

    async def _on_progress(self, turns: list[TurnRecord]) -> None:
        # While replaying, the turns and the cost rebuilt so far are less than what the run
        # already reported: a report now would lower status.cost (and the spend the project's
        # credits and Budget derive from it) until the replay caught up. Report once it has.
        if self._steps is not None and self._steps.replaying:
            return
        conversation = self._conversation
        await self._report(
            RunReport(
                turns=[turn.to_status() for turn in turns],
                cost=run_cost(self.config, conversation),
                sandbox={
                    "backend": conversation.sandbox_info.get("backend"),
                    "note": conversation.sandbox_info.get("note"),
                    "workspace": self.config.workspace,
                    "origin": self._workspace_origin,
                },
            )
        )


RemoteRunActor = ray.remote(num_cpus=0, max_restarts=0)(RunActor)
