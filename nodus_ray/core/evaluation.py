"""An evaluation's cases and what they add up to: pure functions, no Ray, no storage.

An evaluation group runs ``tasks x repetitions`` cases. Each case is one member run whose
input is the task's prompt; once the run ends the case gets a final state:

* ``Scored``: the grader gave a verdict (pass, partial, fail, invalid) and a reward;
* unscored (`UNSCORED_STATES`): the run failed or was cancelled, it left no answer, the grader
  failed, grading did not finish by the deadline, or the group was cancelled while grading.

The pass rate and the mean reward are over scored cases only: a case the system failed to
judge says nothing about the agent, so it never counts as a zero (document 002).
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nodus.resources import UNSCORED_STATES, member_run_name
from nodus_ray.core.eval_statistics import evaluation_statistics

__all__ = [
    "Case",
    "plan_cases",
    "case_labels",
    "final_record",
    "live_record",
    "summarize",
    "final_phase",
    "results_parquet",
    "TASK_LABEL",
    "REPETITION_LABEL",
    "FINAL_STATES",
]

TASK_LABEL = "nodus.dev/task-id"
REPETITION_LABEL = "nodus.dev/repetition"
FINAL_STATES: frozenset[str] = frozenset({"Scored", *UNSCORED_STATES})


@dataclass(frozen=True)
class Case:
    """One task at one repetition: the member run ``<group>-<key>``."""

    task_index: int
    task_id: str
    repetition: int  # from 1
    key: str  # the member's taskKey
    run: str


def plan_cases(group: str, task_ids: Sequence[str], repetitions: int) -> list[Case]:
    """Every case in order: task by task, each task's repetitions together."""
    cases = []
    for index, task_id in enumerate(task_ids):
        for repetition in range(1, repetitions + 1):
            key = task_id if repetitions == 1 else f"{task_id}-r{repetition}"
            cases.append(Case(index, task_id, repetition, key, member_run_name(group, key)))
    return cases


def case_labels(case: Case) -> dict[str, str]:
    return {TASK_LABEL: case.task_id, REPETITION_LABEL: str(case.repetition)}


def final_record(
    case: Case,
    state: str,
    *,
    verdict: str | None = None,
    reward: float | None = None,
    evidence: str = "",
    reason: str | None = None,
    seconds: float | None = None,
    at: str | None = None,
    grading_cpu_seconds: float | None = None,
    grading_usd: str | None = None,
) -> dict[str, Any]:
    """The stored result of a case: what `results()` shows, never the task or the hidden answer.

    A graded case also keeps the CPU its grading used and what that was billed to the group
    (``gradingCpuSeconds``, ``gradingUSD``): the durable record the group's cost is summed from.
    """
    if state not in FINAL_STATES:
        raise ValueError(f"{state!r} is not a final case state")
    billing: dict[str, Any] = {}
    if grading_usd is not None:
        billing = {"gradingCpuSeconds": grading_cpu_seconds or 0.0, "gradingUSD": grading_usd}
    return {
        "taskId": case.task_id,
        "repetition": case.repetition,
        "run": case.run,
        "state": state,
        "verdict": verdict,
        "reward": reward,
        "evidence": evidence,
        "reason": reason,
        "gradingSeconds": seconds,
        "finishedAt": at,
        **billing,
    }


def live_record(case: Case, state: str) -> dict[str, Any]:
    """A case that is not final yet (``Pending`` or ``Grading``)."""
    return {
        "taskId": case.task_id,
        "repetition": case.repetition,
        "run": case.run,
        "state": state,
        "verdict": None,
        "reward": None,
        "evidence": "",
        "reason": None,
        "gradingSeconds": None,
        "finishedAt": None,
    }


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The counting part of ``status.evaluation``: rates over scored cases only, and their
    error bars, pass@k and pass^k (``statistics``, `eval_statistics`; None before a score)."""
    records = list(records)
    scored = unscored = pending = passed = 0
    rewards: list[float] = []
    reasons: Counter[str] = Counter()
    graded = 0
    seconds = 0.0
    for record in records:
        state = record["state"]
        if record.get("gradingSeconds") is not None:
            graded += 1
            seconds += float(record["gradingSeconds"])
        if state == "Scored":
            scored += 1
            rewards.append(float(record["reward"]))
            passed += record.get("verdict") == "pass"
        elif state in UNSCORED_STATES:
            unscored += 1
            reasons[state] += 1
        else:
            pending += 1
    return {
        "scored": scored,
        "unscored": unscored,
        "pending": pending,
        "passed": passed,
        "passRate": round(passed / scored, 6) if scored else None,
        "meanReward": round(sum(rewards) / scored, 6) if scored else None,
        "unscoredReasons": dict(sorted(reasons.items())),
        "grading": {"graded": graded, "seconds": round(seconds, 3), "modelCostUSD": "0"},
        "statistics": evaluation_statistics(records),
    }


def final_phase(summary: dict[str, Any], *, cancelled: bool) -> tuple[str, str | None, str]:
    """The group's end once every case is final: (phase, reason, message).

    Succeeded when at least one case was scored, whatever the others did: unscored cases are
    the evaluation's findings, shown in ``status.evaluation``, not a failure of the group.
    Failed (``NoCasesScored``) when nothing could be scored: there is no result to read.
    """
    scored, unscored = summary["scored"], summary["unscored"]
    message = f"{scored} of {scored + unscored} cases scored"
    if summary["passRate"] is not None:
        message += f"; pass rate {summary['passRate']:.2%}, mean reward {summary['meanReward']:.3f}"
    if cancelled:
        return "Cancelled", "GroupCancelled", message
    if scored == 0:
        return "Failed", "NoCasesScored", message
    return "Succeeded", "Evaluated", message


_RESULT_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("environment", pa.string()),
        ("split", pa.string()),
        ("seed", pa.int64()),
        ("taskId", pa.string()),
        ("repetition", pa.int32()),
        ("run", pa.string()),
        ("state", pa.string()),
        ("verdict", pa.string()),
        ("reward", pa.float64()),
        ("evidence", pa.string()),
        ("reason", pa.string()),
        ("gradingSeconds", pa.float64()),
        ("finishedAt", pa.string()),
    ]
)


def results_parquet(group: str, evaluation: dict[str, Any], records: Sequence[dict[str, Any]]) -> bytes:
    """The per-case records as one Parquet file, with the evaluation's identity on every row."""
    rows = [
        {
            "group": group,
            "environment": evaluation["environment"],
            "split": evaluation["split"],
            "seed": int(evaluation["seed"]),
            **{name: record.get(name) for name in _RESULT_SCHEMA.names[4:]},
        }
        for record in records
    ]
    table = pa.Table.from_pylist(rows, schema=_RESULT_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()
