"""Agents and their revisions: every accepted change of an Agent's spec is a new revision.

A revision is written before the agent that names it, so ``agent.json`` never names a revision
that is not stored; a run pins the revision it was created with (`runs`), and an evaluation
reads its group's revision back when it creates its runs after a restart.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from nodus.errors import Conflict, Invalid, NotFound
from nodus.lifecycle import GROUP_TERMINAL_PHASES, RUN_TERMINAL_PHASES
from nodus.resources import Agent, AgentStatus, ObjectMeta, parse_resource
from nodus_ray.control.registry import Registry, check_project
from nodus_ray.control.sources import SourceService
from nodus_ray.core.patch import patched_document
from nodus_ray.money.prices import PriceTable
from nodus_ray.store import layout
from nodus_ray.store.timestamps import utc_now

__all__ = ["AgentService"]


class AgentService:
    """Create, update, read and delete Agents; refuses what could only fail in a run later."""

    def __init__(self, registry: Registry, prices: PriceTable) -> None:
        self._registry = registry
        self._prices = prices
        # A Python agent's source is uploaded before the Agent that names it (`sources`).
        self.sources = SourceService(registry.storage)

    async def apply_agent(
        self, project: str, document: dict[str, Any], mode: str = "apply"
    ) -> dict[str, Any]:
        """Create (``mode="create"``) or create-or-update an Agent; a changed spec is a revision."""
        check_project(project)
        agent = parse_resource(document, expected_kind="Agent")
        assert isinstance(agent, Agent)
        key = (project, agent.metadata.name)
        registry = self._registry
        async with registry.locks[key]:
            existing = registry.agents.get(key)
            if existing is not None and mode == "create":
                raise Conflict(
                    f"agent {agent.metadata.name!r} already exists",
                    code="AlreadyExists",
                    details={"kind": "Agent", "name": agent.metadata.name},
                )
            self._check_model(agent)
            spec = agent.spec.model_dump(mode="json", exclude_none=True)
            if not spec.get("env"):  # agents stored before spec.env existed compare equal
                spec.pop("env", None)
            labels = agent.metadata.labels
            if (
                existing is not None
                and existing["spec"] == spec
                and existing["metadata"].get("labels", {}) == labels
            ):
                return {"resource": existing, "result": "unchanged"}
            await self.sources.check_agent(project, agent.spec)  # an unknown digest, no entrypoint
            revision = (existing["status"]["revision"] + 1) if existing else 1
            resource = Agent(
                metadata=ObjectMeta(
                    name=agent.metadata.name,
                    project=project,
                    uid=existing["metadata"]["uid"] if existing else uuid.uuid4().hex,
                    generation=revision,
                    creationTimestamp=existing["metadata"]["creationTimestamp"] if existing else utc_now(),
                    labels=labels,
                ),
                spec=agent.spec,
                status=AgentStatus(revision=revision, updatedAt=utc_now()),
            ).model_dump(mode="json")
            resource["spec"] = spec  # the same normal form the next apply compares against
            name = agent.metadata.name
            storage = registry.storage
            # The revision first: agent.json must never name a revision that is not stored.
            await asyncio.to_thread(
                storage.write_json, layout.agent_revision(project, name, revision), resource
            )
            await asyncio.to_thread(storage.write_json, layout.agent_document(project, name), resource)
            registry.agents[key] = resource
            return {"resource": resource, "result": "created" if existing is None else "configured"}

    def _check_model(self, agent: Agent) -> None:
        """Refuse what could only fail later: an unpriced model on Nodus access, BYOK without a
        secret. A BYOK agent may name any model: the user's own key pays for it and Nodus bills
        nothing, so the price table does not decide what it may call (an unpriced one shows no
        list cost)."""
        model = agent.spec.model
        if model.access == "Nodus" and model.name is not None and not self._prices.has(model.name):
            raise Invalid(
                f"spec.model.name: model {model.name!r} has no price in the price table "
                f"(effective {self._prices.effective}); the operator adds prices with NODUS_PRICES",
                code="UnpricedModel",
                details={"field": "spec.model.name"},
            )
        if model.access == "BYOK" and not model.apiKeySecret:
            raise Invalid(
                "spec.model.apiKeySecret: access BYOK needs the name of a Secret holding ANTHROPIC_API_KEY",
                details={"field": "spec.model.apiKeySecret"},
            )
        if model.access == "Nodus" and model.apiKeySecret:
            raise Invalid(
                "spec.model.apiKeySecret: only access BYOK uses a key of its own",
                details={"field": "spec.model.apiKeySecret"},
            )

    async def patch_agent(self, project: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        current = await self.get_agent(project, name)
        return await self.apply_agent(project, patched_document(current, patch, name), mode="apply")

    async def get_agent(self, project: str, name: str) -> dict[str, Any]:
        check_project(project)
        agent = self._registry.agents.get((project, name))
        if agent is None:
            raise NotFound(
                f"agent {name!r} not found in project {project!r}", details={"kind": "Agent", "name": name}
            )
        return agent

    async def list_agents(self, project: str) -> list[dict[str, Any]]:
        check_project(project)
        return [agent for (p, _), agent in sorted(self._registry.agents.items()) if p == project]

    async def delete_agent(self, project: str, name: str) -> dict[str, Any]:
        """Delete an agent that no unfinished run or group uses."""
        agent = await self.get_agent(project, name)
        key = (project, name)
        registry = self._registry
        async with registry.locks[key]:
            users = [
                run_name
                for (p, run_name), run in registry.runs.items()
                if p == project
                and run["spec"]["agent"] == name
                and run["status"]["phase"] not in RUN_TERMINAL_PHASES
            ]
            if users:
                raise Conflict(
                    f"agent {name!r} has unfinished runs ({', '.join(sorted(users)[:5])}); "
                    "cancel or delete them first",
                    details={"kind": "Agent", "name": name},
                )
            groups = [
                group_name
                for (p, group_name), group in registry.groups.items()
                if p == project
                and group["spec"]["agent"] == name
                and group["status"]["phase"] not in GROUP_TERMINAL_PHASES
            ]
            if groups:
                raise Conflict(
                    f"agent {name!r} is the agent of unfinished groups ({', '.join(sorted(groups)[:5])}); "
                    "cancel or delete them first",
                    details={"kind": "Agent", "name": name},
                )
            await asyncio.to_thread(registry.storage.delete_tree, layout.agent_prefix(project, name))
            registry.agents.pop(key, None)
        return agent

    async def price_table(self) -> dict[str, Any]:
        """The prices in force (dated), per model id, in USD per million tokens."""
        return self._prices.to_dict()

    def uses_byok(self) -> bool:
        """Whether any agent brings its own Anthropic key (then run actors warm the Anthropic SDK)."""
        return any(
            (agent["spec"].get("model") or {}).get("access") == "BYOK"
            for agent in self._registry.agents.values()
        )
