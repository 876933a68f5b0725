"""An evaluation group's plan and its book of cases: what the evaluation service works from.

`plan_evaluation` resolves the Environment and generates the task batch when the group is
created, refusing anything that could not run before a byte is stored; `Evaluation` is one live
evaluation's cases in memory (rebuilt after a restart from the Environment and the stored case
records). `member_run` is one case's run; `grading_request` is what the grader is asked for
one finished case.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodus.errors import Invalid, NotFound
from nodus.resources import API_VERSION, AgentRun, EvaluationStatus, parse_duration, parse_resource
from nodus_ray.control.run_images import LocalImages, pin_images
from nodus_ray.core.evaluation import Case, case_labels, live_record, plan_cases
from nodus_ray.environments import EnvironmentNotFound, Task, resolve
from nodus_ray.store import layout
from nodus_ray.store.timestamps import format_timestamp, parse_timestamp

__all__ = ["Evaluation", "grading_request", "member_run", "plan_evaluation"]


@dataclass
class Evaluation:
    """One live evaluation group's cases: the final records and what is being graded now."""

    cases: list[Case]
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # run name -> final record
    grading: set[str] = field(default_factory=set)
    tasks: list[Task] = field(default_factory=list, repr=False)  # in this process only; never stored
    seeded: set[str] = field(default_factory=set)  # runs whose task gives files (a seed in storage)
    runs_phase: str | None = None  # the phase the supervisor last gave for the runs alone

    def by_run(self, run: str) -> Case | None:
        return next((case for case in self.cases if case.run == run), None)

    def case_records(self) -> list[dict[str, Any]]:
        """One record per case, in case order: the final one, else a live Grading or Pending."""
        records = []
        for case in self.cases:
            record = self.records.get(case.run)
            if record is None:
                record = live_record(case, "Grading" if case.run in self.grading else "Pending")
            records.append(record)
        return records


def member_run(group: dict[str, Any], case: Case, task: Task) -> AgentRun:
    """The run of one case: the group's Agent on the task's prompt, labelled with its case."""
    run = parse_resource(
        {
            "apiVersion": API_VERSION,
            "kind": "AgentRun",
            "metadata": {"name": case.run, "labels": case_labels(case)},
            "spec": {
                "agent": group["spec"]["agent"],
                "input": task.prompt,
                "group": group["metadata"]["name"],
                "taskKey": case.key,
            },
        },
        expected_kind="AgentRun",
    )
    assert isinstance(run, AgentRun)
    return run


async def plan_evaluation(
    name: str,
    spec: dict[str, Any],
    created: str,
    agent_image: str | None = None,
    local_images: LocalImages = LocalImages(),
) -> tuple[dict[str, Any], list[Task]]:
    """Resolve the Environment and generate the batch; refused before anything is stored.

    The image the cases run on is resolved too, and its digest recorded (``imageDigest``): the
    Environment's ``image`` when it names one (the member runs then run on it, whatever image
    their Agent names), else the Agent's ``spec.image`` (``agent_image``), else none.
    """
    evaluation = spec["evaluation"]
    ref = evaluation["environment"]
    field_name = "spec.evaluation.environment"
    try:
        environment = await asyncio.to_thread(resolve, ref)
    except EnvironmentNotFound as error:
        raise NotFound(
            f"{field_name}: {error}",
            code="EnvironmentNotFound",
            details={"field": field_name, "kind": "Environment", "name": ref},
        ) from None
    except ValueError as error:
        raise Invalid(f"{field_name}: {error}", details={"field": field_name}) from None
    split = evaluation.get("split", "test")
    if split not in environment.splits:
        raise Invalid(
            f"spec.evaluation.split: {ref} has no split {split!r} (splits: {', '.join(environment.splits)})",
            details={"field": "spec.evaluation.split"},
        )
    count = int(evaluation["tasks"])
    if count > environment.max_tasks:
        raise Invalid(
            f"spec.evaluation.tasks: {ref} has {environment.max_tasks} tasks in a split, not {count}",
            details={"field": "spec.evaluation.tasks"},
        )
    tasks = await asyncio.to_thread(environment.tasks, split, int(evaluation.get("seed", 0)), count)
    repetitions = int(evaluation.get("repetitions", 1))
    cases = plan_cases(name, [task.id for task in tasks], repetitions)
    longest = max(cases, key=lambda case: len(case.run)).run
    if len(longest) > 63:
        raise Invalid(
            f"metadata.name: an evaluation's runs are named <group>-<case> ({longest[:70]!r}...), "
            f"which must fit in 63 characters; use a group name of at most "
            f"{63 - (len(longest) - len(name))} characters",
            details={"field": "metadata.name"},
        )
    max_pending = int((spec.get("limits") or {}).get("maxPending", 10000))
    if len(cases) > max_pending:
        raise Invalid(
            f"spec.limits.maxPending: the evaluation runs {len(cases)} cases, more than the group's "
            f"maxPending {max_pending}",
            details={"field": "spec.limits.maxPending"},
        )
    deadline = parse_timestamp(created) + parse_duration(evaluation.get("timeout", "30m"))
    image, image_from = (environment.image, "Environment") if environment.image else (agent_image, "Agent")
    digest = await _image_digest(
        image, field_name if image_from == "Environment" else "spec.agent", local_images
    )
    status = EvaluationStatus(
        environment=ref,
        version=environment.version,
        imageDigest=digest,
        split=split,
        seed=int(evaluation.get("seed", 0)),
        tasks=count,
        repetitions=repetitions,
        cases=len(cases),
        deadlineAt=format_timestamp(deadline),
        pending=len(cases),
    ).model_dump(mode="json")
    if image:
        status.update({"image": image, "imageFrom": image_from})
    return status, tasks


async def _image_digest(image: str | None, field_name: str, local_images: LocalImages) -> str | None:
    """The digest ``image`` names now; an image that cannot be resolved refuses the evaluation
    (none of its cases could run), naming the field it came from."""
    if not image:
        return None
    pins = await pin_images([image], local_images)
    failure = pins.failure_of(image)
    if failure is not None:
        raise Invalid(f"{field_name}: {failure}", code="ImagePullFailed", details={"field": field_name})
    return pins.pinned[image]


_GRADER_UID_OFFSET = 1_000_000_000


def _grader_uid(status: dict[str, Any]) -> int | None:
    """The grading sandbox's uid: one per case, never a run's (runs count up from 300000).

    Unique, because the process fallback ends every process of its uid after each command:
    two grades sharing a uid could kill each other's checks.
    """
    uid = (status.get("sandbox") or {}).get("uid")
    return uid + _GRADER_UID_OFFSET if isinstance(uid, int) else None


def grading_request(
    evaluation: dict[str, Any],
    case: Case,
    project: str,
    status: dict[str, Any],
    answer: str,
    local_workspace: Path,
) -> dict[str, Any]:
    """What the grader is asked for one case: the task, the run's answer and where its workspace is."""
    return {
        "environment": evaluation["environment"],
        "split": evaluation["split"],
        "seed": evaluation["seed"],
        "tasks": evaluation["tasks"],
        "taskIndex": case.task_index,
        "run": case.run,
        "runPrefix": layout.run_prefix(project, case.run),
        "localWorkspace": str(local_workspace),
        "commands": sum(int(turn.get("toolCalls") or 0) for turn in status.get("turns") or []),
        "uid": _grader_uid(status),
        "answer": answer,
    }
