"""The stored form of an accepted run: Pending, pinned to its agent's revision, with its deadline.

`RunService` decides what a new run is given (its cost limit against the Agent's budget, its
sandbox uid, its image's digest, an evaluation's fields); what resource those come to, and the
deadline a child inherits from its parent (`ChildOf`), depends on nothing else, so it is here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from nodus.lifecycle import RunPhase, RunReason
from nodus.resources import AgentRun, AgentRunStatus, ObjectMeta, parse_duration
from nodus_ray.store.timestamps import format_timestamp, parse_timestamp

__all__ = ["ChildOf", "new_run_resource"]


@dataclass(frozen=True)
class ChildOf:
    """What a child run takes from its parent (`children`): its name, the cap the program gave
    the child (``cap_usd``, at most the Agent's per-run cap) and the parent's deadline, which
    the child cannot outlive."""

    parent: str
    cap_usd: str | None = None
    deadline_at: str | None = None


def new_run_resource(
    project: str,
    run: AgentRun,
    agent: dict[str, Any],
    *,
    created: str,
    limit_usd: str | None,
    sandbox_uid: int,
    image: dict[str, Any] | None,
    group_index: int | None,
    member_status: dict[str, Any] | None,
    child_of: ChildOf | None,
) -> dict[str, Any]:
    """The run's resource as stored: Pending, pinned to the agent's current revision."""
    status = AgentRunStatus(
        phase=RunPhase.PENDING.value, agentRevision=agent["status"]["revision"], createdAt=created
    ).model_dump(mode="json")
    if agent["metadata"].get("project", project) != project:
        status["agentProject"] = agent["metadata"]["project"]  # a template's revision (`templates`)
    if agent["spec"].get("entrypoint"):
        status["program"] = "Python"  # a durable Python program, not a Claude conversation
    status["cost"]["limitUSD"] = limit_usd
    status["sandbox"]["uid"] = sandbox_uid
    if image is not None:
        status["sandbox"]["image"] = image  # the digest every actor of the run unpacks
    if run.spec.deadline:
        deadline = parse_timestamp(created) + parse_duration(run.spec.deadline)
        status["deadlineAt"] = format_timestamp(deadline)
    if child_of is not None:
        status["parent"] = child_of.parent
        parent_deadline = child_of.deadline_at
        if parent_deadline and (
            not status.get("deadlineAt")
            or parse_timestamp(parent_deadline) < parse_timestamp(status["deadlineAt"])
        ):
            status["deadlineAt"] = parent_deadline  # a child never outlives its parent's deadline
    if group_index is not None:
        status["groupIndex"] = group_index  # creation order in the group, which admission follows
        status["reason"] = (RunReason.DEPENDENCY_WAIT if run.spec.dependsOn else RunReason.GROUP_WAIT).value
        status.update(member_status or {})  # an evaluation's deadline and seed
    return {
        "apiVersion": run.apiVersion,
        "kind": "AgentRun",
        "metadata": ObjectMeta(
            name=run.metadata.name,
            project=project,
            uid=uuid.uuid4().hex,
            generation=1,
            creationTimestamp=created,
            labels=run.metadata.labels,
        ).model_dump(mode="json"),
        "spec": run.spec.model_dump(mode="json", exclude_none=True),
        "status": status,
    }
