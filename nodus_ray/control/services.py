"""The control plane's services, composed: who gets which collaborator, and recovery's order.

`compose` is the one place the services are wired together; the actor (`plane`) calls it with
Ray's launchers, the unit tests with fakes, so both run the same wiring. A new `compose` over
the same storage followed by `Services.recover` is what a restarted control plane does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from nodus_ray.control.access import AccessService
from nodus_ray.control.agents import AgentService
from nodus_ray.control.batches import BatchRecords
from nodus_ray.control.budgets import BudgetService
from nodus_ray.control.children import ChildService
from nodus_ray.control.credits import CreditService
from nodus_ray.control.evaluations import EvaluationService
from nodus_ray.control.generations import GenerationService
from nodus_ray.control.group_actors import Graders, GroupSupervisors, RayGraders
from nodus_ray.control.group_link import GroupLink
from nodus_ray.control.groups import GroupService
from nodus_ray.control.inbox import Inboxes
from nodus_ray.control.messages import MessageService
from nodus_ray.control.registry import Registry
from nodus_ray.control.resolution import ResolutionService
from nodus_ray.control.run_controls import RunControls
from nodus_ray.control.run_images import LocalImages
from nodus_ray.control.run_launcher import RunActorLauncher
from nodus_ray.control.run_pool import RunActorPool, RunPoolService
from nodus_ray.control.run_supervisor import RunSupervisor
from nodus_ray.control.runs import RunService
from nodus_ray.control.secret_service import SecretService
from nodus_ray.control.secrets import SecretStore
from nodus_ray.control.sessions import SessionService
from nodus_ray.control.tokens import TokenStore
from nodus_ray.control.webhook_service import WebhookService
from nodus_ray.money.credits import CreditLedger
from nodus_ray.money.prices import PriceTable
from nodus_ray.settings import ServerSettings
from nodus_ray.store.secret_box import SecretBox, load_or_create_key
from nodus_ray.store.storage import Storage

__all__ = ["Services", "compose"]


@dataclass
class Services:
    """Every service of one control plane, and the stores recovery reloads."""

    registry: Registry
    secret_store: SecretStore
    token_store: TokenStore
    agents: AgentService
    run_pool: RunPoolService
    supervisor: RunSupervisor
    evaluations: EvaluationService
    group_link: GroupLink
    groups: GroupService
    credits: CreditService
    budgets: BudgetService
    runs: RunService
    messages: MessageService
    sessions: SessionService
    resolution: ResolutionService
    secrets: SecretService
    access: AccessService
    children: ChildService
    controls: RunControls
    generations: GenerationService
    webhooks: WebhookService

    async def recover(self) -> None:
        """Reload every resource from storage, then bring back what runs: supervision, groups, pool.

        In this order: the resources first (everything after reads them), spend before any run
        goes on (a resumed run reserves credits), the groups' supervisors woken and the pool
        filled, and the runs' actors last: they start once recovery is over, as they did when
        each start waited for the control plane to have started (started mid-recovery, the
        fault suite's `ray stop --force`-then-`nodus up` test failed: a command run twice).
        """
        await asyncio.to_thread(self.registry.load)
        await asyncio.to_thread(self.secret_store.load)
        await asyncio.to_thread(self.token_store.load)
        await self.webhooks.recover()  # before anything changes a run: changes after it are events
        self.credits.recover()
        await self.groups.recover()
        await self.run_pool.refill()
        self.supervisor.recover()
        await self.budgets.recover()  # before any run reserves (reservations wait for recovery)
        await self.children.recover()  # wake-ups a stop came between: a child's end, a message
        await self.messages.recover()
        self.sessions.recover()  # the session keys' index, from the runs' spec.sessionKey
        self.supervisor.sweeper.sweep_soon()  # workspaces of runs that are gone (this node's disk)


def compose(
    settings: ServerSettings,
    *,
    run_actors: RunActorLauncher,
    group_actors: GroupSupervisors,
    graders: Graders | None = None,
) -> Services:
    """Build the services over the settings' storage; the launchers are the Ray boundary."""
    storage = Storage(settings.storage_uri)
    secret_store = SecretStore(storage, SecretBox(load_or_create_key(settings.secret_key_file)))
    token_store = TokenStore(storage)
    ledger = CreditLedger(storage, Decimal(settings.initial_credits_usd))
    batches = BatchRecords(storage)
    registry = Registry(storage, batches)
    inboxes = Inboxes(storage)

    agents = AgentService(registry, PriceTable.load(settings.prices_file))
    run_pool = RunPoolService(RunActorPool(settings.run_pool_per_node), secret_store, agents, registry)
    supervisor = RunSupervisor(registry, settings, run_pool.pool, run_actors, inboxes, ledger)
    if graders is None:
        grading_root = str(Path(settings.sandbox_root) / ".grading")
        graders = RayGraders(storage, grading_root, supervisor.hidden_paths())
    local_images = LocalImages.parse(settings.image_paths)
    evaluations = EvaluationService(
        registry,
        settings.sandbox_root,
        group_actors,
        graders,
        PriceTable.load(settings.prices_file),
        local_images,
    )
    link = GroupLink(registry, supervisor, group_actors, evaluations)
    groups = GroupService(registry, supervisor, group_actors, evaluations, link)
    credits = CreditService(registry, ledger, supervisor)
    budgets = BudgetService(registry, supervisor.supervise)
    supervisor.budget_affordable = budgets.affordable
    supervisor.budget_forget = budgets.forget_run
    link.budget_left = budgets.left
    budgets.on_room.append(link.budget_changed)
    groups.budget_forget_group = budgets.forget_group
    budgets.grading = evaluations.grading_usd
    evaluations.budget_hold = budgets.hold_grading
    evaluations.budget_release = budgets.release_grading
    runs = RunService(registry, batches, supervisor, link, evaluations, credits, local_images)
    evaluations.connect(create_runs=runs.create_members, take_status=link.take_status)
    messages = MessageService(registry, inboxes, supervisor)
    return Services(
        registry=registry,
        secret_store=secret_store,
        token_store=token_store,
        agents=agents,
        run_pool=run_pool,
        supervisor=supervisor,
        evaluations=evaluations,
        group_link=link,
        groups=groups,
        credits=credits,
        budgets=budgets,
        runs=runs,
        messages=messages,
        sessions=SessionService(registry, runs, messages),
        resolution=ResolutionService(registry, supervisor),
        secrets=SecretService(registry, secret_store, run_pool, settings.anthropic_base_url),
        access=AccessService(token_store),
        children=ChildService(registry, runs, supervisor),
        controls=RunControls(registry, supervisor),
        generations=GenerationService(registry),
        webhooks=WebhookService(registry, secret_store, settings),
    )
