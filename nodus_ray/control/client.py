"""The one client of the control plane: a typed method per call that crosses a process boundary.

Serve's API, run actors and group supervisors call the control plane (a named, restartable Ray
actor) through :class:`ControlPlaneClient`. Each method names the actor's method as an
attribute (``handle.get_run.remote(...)``), so a renamed or mistyped method is a type error and
a failed lookup, never a string that only fails at run time.

Callers differ only in what they do when the control plane is away, and that is the client's
``policy``:

* :class:`FailFast` (Serve): an HTTP request must answer now, so a missing control plane is
  ``Unavailable`` (503) at once, a dying one ``Unavailable`` too (the handle is looked up again
  on the next request), and an API error raised inside the control plane reaches the route as
  itself (its cause is unwrapped from Ray's ``RayTaskError``).
* :class:`RideOutRestarts` (run actors, group supervisors): the control plane reloads storage
  when Ray restarts it, so a caller that finds it gone waits for it to come back (backing off
  0.2 s to 2 s) instead of failing the run; only one that stays away longer than
  ``patience_seconds`` fails the call. Only calls that are safe to repeat go through it (every
  one actors make is: reports merge, starts and cancels are idempotent by run name).

Either way the handle is looked up once, not per call (every step of a run reports, and a
lookup is a round trip to Ray's GCS), and forgotten when the actor it named died.

What a run actor reports is a :class:`RunReport`, a typed partial status (`run_reports`); it
reaches the control plane as the dict ``merge_status`` merges (only the fields that were set).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import ray
from ray.exceptions import RayActorError, RayTaskError

from nodus.errors import NodusError, Unavailable
from nodus_ray.control.client_webhooks import WebhookCalls
from nodus_ray.control.list_query import ListPage, ListQuery
from nodus_ray.control.run_reports import RunOutcome, RunReport
from nodus_ray.export.page import ExportPage
from nodus_ray.settings import CONTROL_PLANE_NAME, NAMESPACE

if TYPE_CHECKING:  # the run actor's module imports this one
    from nodus_ray.runtime.run_actor import RunConfig

__all__ = ["ControlPlaneClient", "FailFast", "RideOutRestarts", "CallPolicy", "RunReport", "RunOutcome"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Invoke = Callable[[Any], Awaitable[T]]  # handle -> the awaitable of one actor method call


@dataclass(frozen=True)
class FailFast:
    """Serve's policy: no retry; the control plane away is ``Unavailable`` (503) at once."""


@dataclass(frozen=True)
class RideOutRestarts:
    """The engine's policy: retry a lost or missing control plane for up to ``patience_seconds``."""

    patience_seconds: float = 120.0
    first_delay_seconds: float = 0.2
    max_delay_seconds: float = 2.0


CallPolicy = FailFast | RideOutRestarts


def _locate_control_plane() -> Any:
    return ray.get_actor(CONTROL_PLANE_NAME, namespace=NAMESPACE)


def _describe(invoke: Callable[..., Any]) -> str:
    """``get_run`` for the lambda inside ``ControlPlaneClient.get_run`` (for the log)."""
    parts = getattr(invoke, "__qualname__", "").split(".")
    return parts[-3] if len(parts) >= 3 and parts[-1] == "<lambda>" else getattr(invoke, "__name__", "?")


class ControlPlaneClient(WebhookCalls):
    """Typed calls on the control plane actor, under one :data:`CallPolicy`.

    ``locate`` finds the actor's handle (by default Ray's named actor); tests pass a fake
    handle whose methods have a ``remote`` returning an awaitable.
    """

    def __init__(self, policy: CallPolicy, *, locate: Callable[[], Any] = _locate_control_plane) -> None:
        self._policy = policy
        self._locate = locate
        self._handle: Any = None

    @classmethod
    def for_serve(cls) -> ControlPlaneClient:
        return cls(FailFast())

    @classmethod
    def for_engine(cls, patience_seconds: float = 120.0) -> ControlPlaneClient:
        return cls(RideOutRestarts(patience_seconds))

    @property
    def policy(self) -> CallPolicy:
        return self._policy

    async def _call(self, invoke: Invoke[T]) -> T:
        if isinstance(self._policy, RideOutRestarts):
            return await self._ride_out(invoke, self._policy)
        return await self._fail_fast(invoke)

    async def _fail_fast(self, invoke: Invoke[T]) -> T:
        try:
            if self._handle is None:
                try:
                    self._handle = self._locate()
                except ValueError:
                    raise Unavailable("the control plane is not running; run `nodus up`") from None
            return await invoke(self._handle)
        except NodusError:
            raise
        except RayActorError:
            self._handle = None
            raise Unavailable("the control plane is restarting; try again shortly") from None
        except RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, NodusError):
                raise cause from None
            logger.exception("control plane call %s failed", _describe(invoke))
            raise

    async def _ride_out(self, invoke: Invoke[T], policy: RideOutRestarts) -> T:
        loop = asyncio.get_running_loop()
        delay = policy.first_delay_seconds
        deadline = loop.time() + policy.patience_seconds
        while True:
            try:
                if self._handle is None:
                    self._handle = self._locate()
                return await invoke(self._handle)
            except (RayActorError, ValueError):
                self._handle = None
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, policy.max_delay_seconds)

    # -- service ----------------------------------------------------------------------------

    async def ready(self) -> dict[str, Any]:
        return await self._call(lambda h: h.ready.remote())

    def claim_slot(self, slot: str) -> RunConfig | None:
        """Blocking, and the one call that is: a pre-started run actor waits inside its
        ``__init__`` for the run it will serve (Ray shows an actor's repr once ``__init__``
        returns, so the actor returns only with its run); None when its slot was retired."""
        if self._handle is None:
            self._handle = self._locate()
        claimed: RunConfig | None = ray.get(self._handle.claim_slot.remote(slot))
        return claimed

    async def price_table(self) -> dict[str, Any]:
        return await self._call(lambda h: h.price_table.remote())

    # -- agents -----------------------------------------------------------------------------

    async def list_agents(self, project: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.list_agents.remote(project))

    async def apply_agent(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self._call(lambda h: h.apply_agent.remote(project, document, mode))

    async def get_agent(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.get_agent.remote(project, name))

    async def patch_agent(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._call(lambda h: h.patch_agent.remote(project, name, patch))

    async def delete_agent(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.delete_agent.remote(project, name))

    # -- runs -------------------------------------------------------------------------------

    async def list_runs(
        self, project: str, agent: str | None = None, group: str | None = None, parent: str | None = None
    ) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.list_runs.remote(project, agent, group, parent))

    async def list_page(self, query: ListQuery) -> ListPage:
        """One filtered page of agents, runs or groups (`listing`): only the page crosses Ray."""
        return await self._call(lambda h: h.list_page.remote(query))

    async def create_run(
        self, project: str, document: dict[str, Any], mode: str = "create"
    ) -> dict[str, Any]:
        return await self._call(lambda h: h.create_run.remote(project, document, mode))

    async def create_runs(
        self, project: str, document: dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        return await self._call(lambda h: h.create_runs.remote(project, document, idempotency_key))

    async def get_run(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.get_run.remote(project, name))

    async def delete_run(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.delete_run.remote(project, name))

    async def cancel_run(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.cancel_run.remote(project, name))

    async def suspend_run(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.suspend_run.remote(project, name))

    async def resume_run(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.resume_run.remote(project, name))

    async def retry_run(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.retry_run.remote(project, name))

    async def fork_run(
        self, project: str, name: str, at: str, new_name: str | None, new_input: str | None
    ) -> dict[str, Any]:
        """A new run from a step of ``name`` (`control.forks`)."""
        return await self._call(lambda h: h.fork_run.remote(project, name, at, new_name, new_input))

    async def send_message(
        self,
        project: str,
        name: str,
        payload: Any,
        message_key: str | None = None,
        message_name: str = "message",
    ) -> dict[str, Any]:
        return await self._call(
            lambda h: h.send_message.remote(project, name, payload, message_key, message_name)
        )

    async def resolve_run(self, project: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call(lambda h: h.resolve_run.remote(project, name, body))

    async def run_events(self, project: str, name: str, after_seq: int) -> dict[str, Any]:
        return await self._call(lambda h: h.run_events.remote(project, name, after_seq))

    async def run_steps(self, project: str, name: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.run_steps.remote(project, name))

    async def run_answer(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.run_answer.remote(project, name))

    # -- Python agents: sources, a run's outputs and program log ------------------------------

    async def upload_source(self, project: str, files: dict[str, str]) -> dict[str, Any]:
        return await self._call(lambda h: h.upload_source.remote(project, files))

    async def run_outputs(self, project: str, name: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.run_outputs.remote(project, name))

    async def run_output(self, project: str, name: str, output: str) -> bytes:
        return await self._call(lambda h: h.run_output.remote(project, name, output))

    async def run_logs(self, project: str, name: str) -> str:
        return await self._call(lambda h: h.run_logs.remote(project, name))

    # -- what a run actor asks ----------------------------------------------------------------

    async def report(self, project: str, name: str, patch: RunReport | dict[str, Any]) -> None:
        """Merge a run's progress into its status (a dict: a patch as ``merge_status`` takes it)."""
        wire = patch.to_patch() if isinstance(patch, RunReport) else patch
        await self._call(lambda h: h.report.remote(project, name, wire))

    async def model_access(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.model_access.remote(project, name))

    async def run_secrets(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.run_secrets.remote(project, name))

    async def reserve_credits(self, project: str, name: str, amount: str, attempt: int | None = None) -> bool:
        return await self._call(lambda h: h.reserve_credits.remote(project, name, amount, attempt))

    async def reserve_budget(self, project: str, name: str, amount: str, attempt: int | None = None) -> bool:
        """Hold ``amount`` of the project's Budget for the run's next step (True: no Budget)."""
        return await self._call(lambda h: h.reserve_budget.remote(project, name, amount, attempt))

    async def next_message(
        self, project: str, name: str, after_seq: int, message_name: str | None = None
    ) -> dict[str, Any] | None:
        return await self._call(lambda h: h.next_message.remote(project, name, after_seq, message_name))

    async def spawn_child(
        self,
        project: str,
        parent: str,
        key: str,
        input_text: str,
        deadline: str | None = None,
        cap_usd: str | None = None,
    ) -> dict[str, Any]:
        """Create the child run ``<parent>-<key>`` once (the same key and input again: it)."""
        return await self._call(
            lambda h: h.spawn_child.remote(project, parent, key, input_text, deadline, cap_usd)
        )

    async def children_status(self, project: str, parent: str, names: list[str]) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.children_status.remote(project, parent, names))

    async def continue_as_new(
        self,
        project: str,
        name: str,
        attempt: int,
        generation: int,
        input_text: str,
        read: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """End the run's ``generation`` with ``input_text`` as the next one's input (once:
        asked again, the same switch); ``{"generation", "firstSeq", "priorUSD"}``. ``read``:
        the last message seq of each name the program took (the next generation reads after)."""
        return await self._call(
            lambda h: h.continue_as_new.remote(project, name, attempt, generation, input_text, read)
        )

    # -- groups -----------------------------------------------------------------------------

    async def list_groups(self, project: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.list_groups.remote(project))

    async def apply_group(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self._call(lambda h: h.apply_group.remote(project, document, mode))

    async def get_group(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.get_group.remote(project, name))

    async def patch_group(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._call(lambda h: h.patch_group.remote(project, name, patch))

    async def delete_group(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.delete_group.remote(project, name))

    async def cancel_group(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.cancel_group.remote(project, name))

    async def group_results(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.group_results.remote(project, name))

    async def compare_evaluations(self, project: str, a: str, b: str) -> dict[str, Any]:
        return await self._call(lambda h: h.compare_evaluations.remote(project, a, b))

    async def export_run(self, project: str, name: str, format: str) -> ExportPage:
        return await self._call(lambda h: h.export_run.remote(project, name, format))

    async def export_evaluation(self, project: str, name: str, format: str, page: int) -> ExportPage:
        return await self._call(lambda h: h.export_evaluation.remote(project, name, format, page))

    async def list_environments(self, project: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.list_environments.remote(project))

    # -- what a group supervisor asks ---------------------------------------------------------

    async def group_snapshot(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.group_snapshot.remote(project, name))

    async def start_member(self, project: str, name: str) -> bool:
        return await self._call(lambda h: h.start_member.remote(project, name))

    async def cancel_member(self, project: str, name: str, reason: str) -> None:
        await self._call(lambda h: h.cancel_member.remote(project, name, str(reason)))

    async def group_status(
        self, project: str, name: str, status: dict[str, Any], queued_reasons: dict[str, str]
    ) -> None:
        await self._call(lambda h: h.group_status.remote(project, name, status, queued_reasons))

    # -- secrets ----------------------------------------------------------------------------

    async def list_secrets(self, project: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.list_secrets.remote(project))

    async def apply_secret(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self._call(lambda h: h.apply_secret.remote(project, document, mode))

    async def get_secret(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.get_secret.remote(project, name))

    async def delete_secret(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.delete_secret.remote(project, name))

    # -- credits ----------------------------------------------------------------------------

    async def get_credits(self, project: str) -> dict[str, Any]:
        return await self._call(lambda h: h.get_credits.remote(project))

    async def add_credits(self, project: str, amount: str) -> dict[str, Any]:
        return await self._call(lambda h: h.add_credits.remote(project, amount))

    # -- the project Budget -------------------------------------------------------------------

    async def apply_budget(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        return await self._call(lambda h: h.apply_budget.remote(project, document, mode))

    async def patch_budget(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._call(lambda h: h.patch_budget.remote(project, name, patch))

    async def get_budget(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.get_budget.remote(project, name))

    async def list_budgets(self, project: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.list_budgets.remote(project))

    async def delete_budget(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.delete_budget.remote(project, name))

    # -- tokens -----------------------------------------------------------------------------

    async def authenticate(self, digest: str) -> dict[str, Any] | None:
        return await self._call(lambda h: h.authenticate.remote(digest))

    async def list_tokens(self, project: str) -> list[dict[str, Any]]:
        return await self._call(lambda h: h.list_tokens.remote(project))

    async def create_token(self, project: str, document: dict[str, Any], created_by: str) -> dict[str, Any]:
        return await self._call(lambda h: h.create_token.remote(project, document, created_by))

    async def get_token(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.get_token.remote(project, name))

    async def revoke_token(self, project: str, name: str) -> dict[str, Any]:
        return await self._call(lambda h: h.revoke_token.remote(project, name))
