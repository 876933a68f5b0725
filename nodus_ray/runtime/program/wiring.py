"""Building a run actor's `PythonProgram` from its pinned config (kept out of `run_actor`).

The program gets the same pieces as the Claude conversation: the run's journal steps, its
model provider and spending rules, its router, its sandbox opener, its workspace snapshots,
its redactor; plus the control-plane calls of timers, messages and children.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any, cast

from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.steps import Steps
from nodus_ray.models import ModelProvider
from nodus_ray.money.spend import RunSpend
from nodus_ray.runtime.conversation import Router
from nodus_ray.runtime.program.ends import is_program
from nodus_ray.runtime.program.model_calls import ModelCalls
from nodus_ray.runtime.program.python_program import ProgramSpec, PythonProgram
from nodus_ray.runtime.program.waits import ProgramControlPlane, ProgramWaits
from nodus_ray.runtime.turn_record import TurnRecord
from nodus_ray.sandbox import Sandbox
from nodus_ray.sandbox.snapshots import WorkspaceSnapshots
from nodus_ray.store.storage import Storage

__all__ = ["is_program", "build_program", "ensure_program_workspace"]


def ensure_program_workspace(workspace: WorkspaceSnapshots) -> str:
    """The program's workspace here: the local one when it is at least as new as the newest
    snapshot (same node), else that snapshot restored (a node move); ``"local"``/``"restored"``.

    A program's snapshots are taken when it stops and after its external steps, named by the
    journal's last seq then, so the newest one is the state its journal describes."""
    local = workspace.local_seq()
    stored = workspace.stored_seq() if workspace.enabled else None
    if stored is None or (local is not None and local >= stored):
        return "local"
    return "restored" if workspace.restore_state(stored) else "local"


def build_program(
    *,
    config: Any,  # run_actor.RunConfig (not imported: run_actor imports this module)
    steps: Steps,
    storage: Storage,
    control: Any,
    provider: ModelProvider,
    spend: RunSpend,
    router: Router,
    open_sandbox: Callable[[], Sandbox],
    on_progress: Callable[[list[TurnRecord]], Awaitable[None]],
    workspace: WorkspaceSnapshots,
    redact: Redactor,
) -> PythonProgram:
    agent: dict[str, Any] = config.agent_spec
    model = agent.get("model") or {}
    source = agent.get("source") or {}
    cap = Decimal(config.cap_usd) if config.cap_usd else None
    generation = int(getattr(config, "generation", 0))
    given = getattr(config, "generation_input", None)  # a later generation's (continue_as_new)
    spec = ProgramSpec(
        project=config.project,
        run=config.name,
        attempt=config.attempt,
        input=str(given if given is not None else config.run_spec.get("input", "")),
        entrypoint=str(agent["entrypoint"]),
        source_digest=source.get("digest"),
        # Setup runs once per run: a later generation finds what it installed in the workspace.
        setup=agent.get("setup") if generation == 0 else None,
        memory=agent.get("memory"),
        cpu_seconds=int(getattr(config, "program_cpu_seconds", 3600)),
        cap_usd=cap,
    )
    models = ModelCalls(
        steps=steps,
        provider=provider,
        spend=spend,
        router=router,
        families=model.get("families"),
        model_name=model.get("name"),
        redact=redact,
        on_progress=on_progress,
    )
    waits = ProgramWaits(
        steps=steps,
        control=cast(ProgramControlPlane, control),
        storage=storage,
        project=config.project,
        run=config.name,
        workspace=workspace.workspace,
        cap_usd=cap,
        spent=lambda: spend.budget.spent,
        attempt=int(config.attempt),
        generation=generation,
        read_before=dict(getattr(config, "messages_read", None) or {}),
    )
    return PythonProgram(
        spec=spec,
        steps=steps,
        storage=storage,
        open_sandbox=open_sandbox,
        waits=waits,
        models=models,
        workspace=workspace,
        redact=redact,
    )
