"""The control plane: one detached async actor that owns every resource.

It validates each change, writes it to storage before answering (storage is the only durable
state), and supervises one run actor per unfinished run. On start it reloads everything from
storage and re-attaches to, or replaces, the actors of unfinished runs, which is what makes
``ray stop --force`` followed by ``nodus up`` lose nothing.

The way Ray Serve's controller is built: the actor is a thin facade over services it composes,
each with its own state and the collaborators it is given (agents, runs, run supervision,
groups, evaluations, messages, resolution, secrets, credits, tokens, the run pool), sharing the
resources through one `registry.Registry`. Every public method delegates to one service, after
the one `recovery.RecoveryGate` has let it through.

Ownership is strict: run actors report progress here and never write a run's resource
themselves, so there is exactly one writer per resource file.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import ray

from nodus_ray.control.plane_export import ExportFacade
from nodus_ray.control.plane_forks import ForkFacade
from nodus_ray.control.plane_listing import ListingFacade
from nodus_ray.control.plane_statistics import EvaluationStatisticsFacade
from nodus_ray.control.plane_webhooks import WebhookFacade
from nodus_ray.control.recovery import RecoveryGate, after_recovery
from nodus_ray.store.storage import redact_uri

# The services are imported where the facade is built (`ControlPlane.__init__`), not here: every
# process that holds a handle to this actor (each run actor, each group supervisor, the API)
# has Ray load this module to learn the actor's methods, and importing every service there cost
# each run about 0.3 CPU-seconds (issue 19, decision 54).
if TYPE_CHECKING:
    from nodus_ray.control.group_actors import Graders, GroupSupervisors
    from nodus_ray.control.run_launcher import RunActorLauncher
    from nodus_ray.runtime.run_config import RunConfig
    from nodus_ray.settings import ServerSettings

__all__ = ["ControlPlane", "RemoteControlPlane"]

_VERSION = "0.1.0"


class ControlPlane(ListingFacade, ForkFacade, ExportFacade, EvaluationStatisticsFacade, WebhookFacade):
    """The facade: composes the services, recovers once, delegates each call to one service."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        run_actors: RunActorLauncher | None = None,
        group_actors: GroupSupervisors | None = None,
        graders: Graders | None = None,
    ):
        """``run_actors``, ``group_actors`` and ``graders`` are the Ray boundary (Ray's own
        launchers when None); tests and the control-plane simulation pass their own."""
        from nodus_ray.control.group_actors import RayGroupSupervisors
        from nodus_ray.control.node_workspaces import remove_on_node
        from nodus_ray.control.retention import RetentionSweeper
        from nodus_ray.control.run_files import RunFiles
        from nodus_ray.control.run_launcher import RayRunActors
        from nodus_ray.control.services import compose

        self.settings = settings
        services = compose(
            settings,
            run_actors=run_actors or RayRunActors(),
            group_actors=group_actors or RayGroupSupervisors(),
            graders=graders,
        )
        self._services = services
        self.registry = services.registry
        self.agents = services.agents
        self.runs = services.runs
        self.groups = services.groups
        self.group_link = services.group_link
        self.evaluations = services.evaluations
        self.messages = services.messages
        self.sessions = services.sessions
        self.resolution = services.resolution
        self.secrets = services.secrets
        self.credits = services.credits
        self.budgets = services.budgets
        self.access = services.access
        self.run_pool = services.run_pool
        self.children = services.children
        self.controls = services.controls
        self.generations = services.generations
        self.run_files = RunFiles(services.registry)
        # Finished runs' payloads and workspaces, deleted when their retention is up (decision 46).
        self.retention = RetentionSweeper(
            services.registry, settings, services.evaluations.forget, remove_on_node=remove_on_node
        )
        self._background: list[asyncio.Task[None]] = []
        # Started by the first call, not here: Ray may run a constructor on a loop other than the
        # one that serves calls, and a recovery there raced the one the calls waited for.
        self._recovery = RecoveryGate(self._recover)

    def __repr__(self) -> str:
        return (
            f"ControlPlane(storage={redact_uri(self.settings.storage_uri)}, "
            f"agents={len(self.registry.agents)}, runs={len(self.registry.runs)})"
        )

    @property
    def recovery(self) -> RecoveryGate:
        return self._recovery

    # -- start and recovery ---------------------------------------------------------------

    async def _recover(self) -> None:
        """Reload every resource and bring back what runs; then the background loops start."""
        from nodus_ray.control.templates import ensure_templates

        await self._services.recover()
        self.retention.start()  # after recovery: what came due while the service was down goes first
        # After the agents are loaded (an absent template is absent, not unread), before any call.
        await ensure_templates(self.agents, self.registry)
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self.run_pool.keep_filled()),
            loop.create_task(self.runs.publish_metrics()),
        ]

    @after_recovery
    async def ready(self) -> dict[str, Any]:
        """Describe the service once it has recovered: the readiness probe and ``/v1/info``."""
        from nodus_ray.sandbox.backend import bwrap_available

        has_key = await asyncio.to_thread(self.secrets.has_server_key)
        return {
            "version": _VERSION,
            "storage": redact_uri(self.settings.storage_uri),
            "modelBackend": "anthropic" if has_key else "offline",
            "prices": {"effective": (await self.agents.price_table())["effective"]},
            "sandbox": "bubblewrap" if await asyncio.to_thread(bwrap_available) else "process",
            "sandboxRoot": self.settings.sandbox_root,
            "settingsDigest": self.settings.digest(),
            "agents": len(self.registry.agents),
            "runs": len(self.registry.runs),
        }

    # Not gated: a parked run actor of an earlier incarnation asks, and is told to end.
    async def claim_slot(self, slot: str) -> RunConfig | None:
        """A pre-started run actor waits here (inside its ``__init__``) for the run it will serve."""
        return await self.run_pool.claim_slot(slot)

    async def running_settings(self) -> dict[str, object]:
        """The running settings, credentials redacted (for `nodus up` to explain a mismatch)."""
        return self.settings.describe()

    # -- agents ---------------------------------------------------------------------------

    @after_recovery
    async def apply_agent(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self.agents.apply_agent(project, document, mode)

    @after_recovery
    async def patch_agent(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self.agents.patch_agent(project, name, patch)

    @after_recovery
    async def get_agent(self, project: str, name: str) -> dict[str, Any]:
        return await self.agents.get_agent(project, name)

    @after_recovery
    async def list_agents(self, project: str) -> list[dict[str, Any]]:
        return await self.agents.list_agents(project)

    @after_recovery
    async def delete_agent(self, project: str, name: str) -> dict[str, Any]:
        return await self.agents.delete_agent(project, name)

    async def price_table(self) -> dict[str, Any]:
        return await self.agents.price_table()

    # -- runs -----------------------------------------------------------------------------

    @after_recovery
    async def create_run(
        self, project: str, document: dict[str, Any], mode: str = "create"
    ) -> dict[str, Any]:
        # A run naming spec.sessionKey goes to its session: created, or delivered as a message.
        return await self.sessions.create_run(project, document, mode)

    @after_recovery
    async def create_runs(
        self, project: str, document: dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        return await self.runs.create_runs(project, document, idempotency_key)

    @after_recovery
    async def get_run(self, project: str, name: str) -> dict[str, Any]:
        return await self.runs.get_run(project, name)

    @after_recovery
    async def list_runs(
        self, project: str, agent: str | None = None, group: str | None = None, parent: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.runs.list_runs(project, agent, group, parent)

    @after_recovery
    async def run_steps(self, project: str, name: str) -> list[dict[str, Any]]:
        return await self.runs.run_steps(project, name)

    @after_recovery
    async def run_events(self, project: str, name: str, after_seq: int) -> dict[str, Any]:
        return await self.runs.run_events(project, name, after_seq)

    @after_recovery
    async def run_answer(self, project: str, name: str) -> dict[str, Any]:
        return await self.runs.run_answer(project, name)

    # -- Python agents: sources, a run's outputs and program log ----------------------------

    @after_recovery
    async def upload_source(self, project: str, files: dict[str, str]) -> dict[str, Any]:
        return await self.agents.sources.upload_source(project, files)

    @after_recovery
    async def run_outputs(self, project: str, name: str) -> list[dict[str, Any]]:
        return await self.run_files.run_outputs(project, name)

    @after_recovery
    async def run_output(self, project: str, name: str, output: str) -> bytes:
        return await self.run_files.run_output(project, name, output)

    @after_recovery
    async def run_logs(self, project: str, name: str) -> str:
        return await self.run_files.run_logs(project, name)

    @after_recovery
    async def cancel_run(self, project: str, name: str) -> dict[str, Any]:
        return await self.runs.cancel_run(project, name)

    @after_recovery
    async def delete_run(self, project: str, name: str) -> dict[str, Any]:
        return await self.runs.delete_run(project, name)

    @after_recovery
    async def report(self, project: str, name: str, patch: dict[str, Any]) -> None:
        await self.runs.report(project, name, patch)

    @after_recovery
    async def resolve_run(self, project: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.resolution.resolve_run(project, name, body)

    @after_recovery
    async def send_message(
        self,
        project: str,
        name: str,
        payload: Any,
        message_key: str | None = None,
        message_name: str = "message",
    ) -> dict[str, Any]:
        return await self.messages.send_message(project, name, payload, message_key, message_name)

    @after_recovery
    async def next_message(
        self, project: str, name: str, after_seq: int, message_name: str | None = None
    ) -> dict[str, Any] | None:
        return await self.messages.next_message(project, name, after_seq, message_name)

    # -- a Python program's children, and a person's controls of a run ------------------------

    @after_recovery
    async def spawn_child(
        self,
        project: str,
        parent: str,
        key: str,
        input_text: str,
        deadline: str | None = None,
        cap_usd: str | None = None,
    ) -> dict[str, Any]:
        return await self.children.spawn_child(project, parent, key, input_text, deadline, cap_usd)

    @after_recovery
    async def children_status(self, project: str, parent: str, names: list[str]) -> list[dict[str, Any]]:
        return await self.children.children_status(project, parent, names)

    @after_recovery
    async def continue_as_new(
        self,
        project: str,
        name: str,
        attempt: int,
        generation: int,
        input_text: str,
        read: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        return await self.generations.continue_as_new(project, name, attempt, generation, input_text, read)

    @after_recovery
    async def suspend_run(self, project: str, name: str) -> dict[str, Any]:
        return await self.controls.suspend_run(project, name)

    @after_recovery
    async def resume_run(self, project: str, name: str) -> dict[str, Any]:
        return await self.controls.resume_run(project, name)

    @after_recovery
    async def retry_run(self, project: str, name: str) -> dict[str, Any]:
        return await self.controls.retry_run(project, name)

    # -- groups and evaluations -----------------------------------------------------------

    @after_recovery
    async def get_group(self, project: str, name: str) -> dict[str, Any]:
        return await self.groups.get_group(project, name)

    @after_recovery
    async def list_groups(self, project: str) -> list[dict[str, Any]]:
        return await self.groups.list_groups(project)

    @after_recovery
    async def apply_group(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self.groups.apply_group(project, document, mode)

    @after_recovery
    async def patch_group(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self.groups.patch_group(project, name, patch)

    @after_recovery
    async def cancel_group(self, project: str, name: str) -> dict[str, Any]:
        return await self.groups.cancel_group(project, name)

    @after_recovery
    async def delete_group(self, project: str, name: str) -> dict[str, Any]:
        return await self.groups.delete_group(project, name)

    @after_recovery
    async def group_snapshot(self, project: str, name: str) -> dict[str, Any]:
        return await self.group_link.group_snapshot(project, name)

    @after_recovery
    async def start_member(self, project: str, name: str) -> bool:
        return await self.group_link.start_member(project, name)

    @after_recovery
    async def cancel_member(self, project: str, name: str, reason: str) -> None:
        await self.group_link.cancel_member(project, name, reason)

    @after_recovery
    async def group_status(
        self, project: str, name: str, status: dict[str, Any], queued_reasons: dict[str, str]
    ) -> None:
        await self.group_link.group_status(project, name, status, queued_reasons)

    @after_recovery
    async def group_results(self, project: str, name: str) -> dict[str, Any]:
        return await self.evaluations.group_results(project, name)

    async def list_environments(self, project: str) -> list[dict[str, Any]]:
        return await self.evaluations.list_environments(project)

    # -- secrets and the model key --------------------------------------------------------

    @after_recovery
    async def apply_secret(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self.secrets.apply_secret(project, document, mode)

    @after_recovery
    async def get_secret(self, project: str, name: str) -> dict[str, Any]:
        return await self.secrets.get_secret(project, name)

    @after_recovery
    async def list_secrets(self, project: str) -> list[dict[str, Any]]:
        return await self.secrets.list_secrets(project)

    @after_recovery
    async def delete_secret(self, project: str, name: str) -> dict[str, Any]:
        return await self.secrets.delete_secret(project, name)

    @after_recovery
    async def configure_model_key(self, key: str | None) -> str:
        return await self.secrets.configure_model_key(key)

    @after_recovery
    async def model_access(self, project: str, name: str) -> dict[str, Any]:
        return await self.secrets.model_access(project, name)

    @after_recovery
    async def run_secrets(self, project: str, name: str) -> dict[str, Any]:
        return await self.secrets.run_secrets(project, name)

    # -- credits --------------------------------------------------------------------------

    @after_recovery
    async def get_credits(self, project: str) -> dict[str, Any]:
        return await self.credits.get_credits(project)

    @after_recovery
    async def add_credits(self, project: str, amount: str) -> dict[str, Any]:
        return await self.credits.add_credits(project, amount)

    @after_recovery
    async def reserve_credits(self, project: str, name: str, amount: str, attempt: int | None = None) -> bool:
        return await self.credits.reserve_credits(project, name, amount, attempt)

    # -- the project Budget -----------------------------------------------------------------

    @after_recovery
    async def reserve_budget(self, project: str, name: str, amount: str, attempt: int | None = None) -> bool:
        return await self.budgets.reserve_budget(project, name, amount, attempt)

    @after_recovery
    async def apply_budget(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self.budgets.apply_budget(project, document, mode)

    @after_recovery
    async def patch_budget(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self.budgets.patch_budget(project, name, patch)

    @after_recovery
    async def get_budget(self, project: str, name: str) -> dict[str, Any]:
        return await self.budgets.get_budget(project, name)

    @after_recovery
    async def list_budgets(self, project: str) -> list[dict[str, Any]]:
        return await self.budgets.list_budgets(project)

    @after_recovery
    async def delete_budget(self, project: str, name: str) -> dict[str, Any]:
        return await self.budgets.delete_budget(project, name)

    # -- tokens ---------------------------------------------------------------------------

    @after_recovery
    async def authenticate(self, digest: str) -> dict[str, Any] | None:
        return await self.access.authenticate(digest)

    @after_recovery
    async def create_token(self, project: str, document: dict[str, Any], created_by: str) -> dict[str, Any]:
        return await self.access.create_token(project, document, created_by)

    @after_recovery
    async def get_token(self, project: str, name: str) -> dict[str, Any]:
        return await self.access.get_token(project, name)

    @after_recovery
    async def list_tokens(self, project: str) -> list[dict[str, Any]]:
        return await self.access.list_tokens(project)

    @after_recovery
    async def revoke_token(self, project: str, name: str) -> dict[str, Any]:
        return await self.access.revoke_token(project, name)

    @after_recovery
    async def ensure_operator_token(self, current: str | None) -> str:
        return await self.access.ensure_operator_token(current)


RemoteControlPlane = ray.remote(  # type: ignore[call-overload]  # Ray's stubs lack max_concurrency
    num_cpus=0, max_restarts=-1, max_concurrency=1000
)(ControlPlane)
