"""What a run actor is given: the `RunConfig` of a run's next attempt, from its status and storage.

Kept apart from the supervision (`run_supervisor`), which only decides *when* an actor starts:
the config is read from the run's stored documents (its pinned agent, the generation it is on)
and the server's settings, and nothing here changes a run.
"""

from __future__ import annotations

import asyncio

from nodus_ray.control.generations import generation_of, prior_cost, prior_sandbox_cost, starting_generation
from nodus_ray.control.registry import Key, Registry
from nodus_ray.runtime.run_actor import RunConfig
from nodus_ray.sandbox.images import images_cache
from nodus_ray.settings import ServerSettings
from nodus_ray.store import layout

__all__ = ["run_config"]


async def run_config(
    registry: Registry,
    settings: ServerSettings,
    key: Key,
    attempt: int,
    *,
    workspace: str,
    hidden_paths: tuple[str, ...],
) -> RunConfig:
    """The config of attempt ``attempt`` of run ``key``, whose workspace is ``workspace``."""
    run = registry.runs[key]
    project, name = key
    pinned = await asyncio.to_thread(registry.storage.read_json, layout.run_agent(project, name))
    generation = generation_of(run["status"])
    started = await asyncio.to_thread(starting_generation, registry.storage, project, name, generation)
    return RunConfig(
        project=project,
        name=name,
        agent=run["spec"]["agent"],
        agent_revision=int(run["status"]["agentRevision"]),
        agent_spec=pinned["spec"],
        run_spec=run["spec"],
        storage_uri=settings.storage_uri,
        workspace=workspace,
        deadline_at=run["status"].get("deadlineAt"),
        offline_latency_seconds=settings.offline_latency_seconds,
        sandbox_uid=run["status"].get("sandbox", {}).get("uid"),
        hidden_paths=hidden_paths,
        cap_usd=run["status"]["cost"].get("limitUSD"),
        prices_file=settings.prices_file,
        group=run["spec"].get("group"),
        workspace_snapshots=settings.workspace_snapshots,
        workspace_seeded=bool(run["status"].get("workspaceSeeded")),
        egress_private_networks=settings.egress_private_networks,
        attempt=attempt,
        program_cpu_seconds=settings.program_cpu_seconds,
        generation=generation,
        generation_input=str(started["input"]) if started is not None else None,
        journal_first_seq=int(started.get("firstSeq") or 0) if started is not None else 0,
        prior_cost_usd=str(prior_cost(run["status"])),
        prior_sandbox_usd=str(prior_sandbox_cost(run["status"])),
        messages_read={str(k): int(v) for k, v in ((started or {}).get("read") or {}).items()},
        image=run["status"].get("sandbox", {}).get("image"),
        images_cache=str(images_cache(settings.sandbox_root)),
        uid=str(run["metadata"].get("uid") or ""),
        telemetry=settings.telemetry,
        rate_limits=settings.rate_limits,
    )
