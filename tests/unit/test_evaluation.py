"""Evaluation groups without a cluster: the spec's limits, the cases, and what they add up to."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from nodus.errors import Invalid
from nodus.resources import UNSCORED_STATES, parse_resource
from nodus_ray.core.evaluation import (
    FINAL_STATES,
    case_labels,
    final_phase,
    final_record,
    live_record,
    plan_cases,
    results_parquet,
    summarize,
)
from nodus_ray.sandbox.snapshots import NO_COMMAND, WorkspaceSnapshots, pack_files, seed_key
from nodus_ray.store.storage import Storage


def _group(evaluation: dict[str, Any], **spec: Any) -> Any:
    return parse_resource(
        {
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentGroup",
            "metadata": {"name": "e"},
            "spec": {"agent": "a", "evaluation": evaluation, **spec},
        }
    )


def _refusal(evaluation: dict[str, Any]) -> Invalid:
    with pytest.raises(Invalid) as caught:
        _group(evaluation)
    return caught.value


def test_the_spec_fills_the_documented_defaults() -> None:
    spec = _group({"environment": "nodus/arithmetic-v2@2.0.0", "tasks": 10, "seed": 42}).spec.evaluation
    assert (spec.split, spec.repetitions, spec.timeout, spec.seed) == ("test", 1, "30m", 42)


@pytest.mark.parametrize(
    ("evaluation", "field", "words"),
    [
        (
            {"environment": "nodus/arithmetic-v2", "tasks": 1},
            "spec.evaluation.environment",
            "names no version",
        ),
        ({"environment": "arithmetic", "tasks": 1}, "spec.evaluation.environment", "owner/name@version"),
        (
            {"environment": "nodus/a@1.0.0", "tasks": 51, "repetitions": 2},
            "spec.evaluation",
            "at most 100 cases",
        ),
        ({"environment": "nodus/a@1.0.0", "tasks": 101}, "spec.evaluation.tasks", "100"),
        (
            {"environment": "nodus/a@1.0.0", "tasks": 1, "timeout": "59s"},
            "spec.evaluation.timeout",
            "1m to 24h",
        ),
        (
            {"environment": "nodus/a@1.0.0", "tasks": 1, "timeout": "24h1m"},
            "spec.evaluation.timeout",
            "1m to 24h",
        ),
        ({"environment": "nodus/a@1.0.0"}, "spec.evaluation.tasks", "required"),
        (
            {"environment": "nodus/a@1.0.0", "tasks": 1, "hidden": True},
            "spec.evaluation.hidden",
            "unknown field",
        ),
    ],
)
def test_bad_evaluations_are_refused_naming_the_field(
    evaluation: dict[str, Any], field: str, words: str
) -> None:
    refusal = _refusal(evaluation)
    assert refusal.details["field"] == field
    assert words in refusal.message


def test_the_timeout_bounds_are_inclusive() -> None:
    for timeout in ("1m", "24h", "60s"):
        assert (
            _group({"environment": "nodus/a@1.0.0", "tasks": 1, "timeout": timeout}).spec.evaluation.timeout
            == timeout
        )


def test_cases_are_named_after_tasks_and_repetitions() -> None:
    single = plan_cases("eval", ["test-000", "test-001"], 1)
    assert [(c.key, c.run, c.repetition) for c in single] == [
        ("test-000", "eval-test-000", 1),
        ("test-001", "eval-test-001", 1),
    ]
    repeated = plan_cases("eval", ["test-000", "test-001"], 2)
    assert [c.key for c in repeated] == ["test-000-r1", "test-000-r2", "test-001-r1", "test-001-r2"]
    assert [c.task_index for c in repeated] == [0, 0, 1, 1]
    assert case_labels(repeated[1]) == {"nodus.dev/task-id": "test-000", "nodus.dev/repetition": "2"}


def test_unscored_cases_are_left_out_of_the_pass_rate_and_the_mean_reward() -> None:
    cases = plan_cases("g", [f"t-{i}" for i in range(7)], 1)
    records = [
        final_record(cases[0], "Scored", verdict="pass", reward=1.0, seconds=0.5),
        final_record(cases[1], "Scored", verdict="partial", reward=0.5, seconds=0.25),
        final_record(cases[2], "Scored", verdict="invalid", reward=0.0, seconds=0.25),
        final_record(cases[3], "RunFailed", reason="DeadlineExceeded"),
        final_record(cases[4], "GraderFailed", seconds=1.0),
        final_record(cases[5], "MissingAnswer"),
        live_record(cases[6], "Grading"),
    ]
    summary = summarize(records)
    assert (summary["scored"], summary["unscored"], summary["pending"], summary["passed"]) == (3, 3, 1, 1)
    assert summary["passRate"] == pytest.approx(1 / 3)
    assert summary["meanReward"] == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3: failures are not zeros
    assert summary["unscoredReasons"] == {"GraderFailed": 1, "MissingAnswer": 1, "RunFailed": 1}
    assert summary["grading"]["graded"] == 4 and summary["grading"]["seconds"] == pytest.approx(2.0)


def test_nothing_scored_has_no_rates_and_fails_the_group() -> None:
    cases = plan_cases("g", ["a", "b"], 1)
    summary = summarize([final_record(cases[0], "RunFailed"), final_record(cases[1], "EvaluationTimeout")])
    assert summary["passRate"] is None and summary["meanReward"] is None
    assert final_phase(summary, cancelled=False)[:2] == ("Failed", "NoCasesScored")
    assert final_phase(summary, cancelled=True)[0] == "Cancelled"


def test_one_scored_case_is_enough_for_a_result() -> None:
    cases = plan_cases("g", ["a", "b"], 1)
    summary = summarize(
        [final_record(cases[0], "Scored", verdict="fail", reward=0.0), final_record(cases[1], "GraderFailed")]
    )
    phase, reason, message = final_phase(summary, cancelled=False)
    assert (phase, reason) == ("Succeeded", "Evaluated")
    assert "1 of 2 cases scored" in message and "pass rate 0.00%" in message


def test_only_final_states_make_final_records() -> None:
    case = plan_cases("g", ["a"], 1)[0]
    with pytest.raises(ValueError):
        final_record(case, "Grading")
    assert set(UNSCORED_STATES) < FINAL_STATES


def test_results_parquet_has_one_row_per_case_and_no_task_payload() -> None:
    cases = plan_cases("g", ["a", "b"], 1)
    records = [
        final_record(cases[0], "Scored", verdict="pass", reward=1.0, evidence="ok"),
        live_record(cases[1], "Pending"),
    ]
    table = pq.read_table(
        io.BytesIO(
            results_parquet("g", {"environment": "nodus/x@1.0.0", "split": "test", "seed": 7}, records)
        )
    )
    assert table.num_rows == 2
    assert table.column("state").to_pylist() == ["Scored", "Pending"]
    assert table.column("seed").to_pylist() == [7, 7]
    assert not {"prompt", "answer", "input", "files"} & set(table.column_names)


def test_a_seeded_run_starts_from_its_seed_and_only_once(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "storage"))
    storage.write_bytes(seed_key("runs/r"), pack_files({"calc.py": "x = 1\n", "data/in.txt": "3\n"}))
    workspace = tmp_path / "sandboxes" / "r"
    snapshots = WorkspaceSnapshots(storage, "runs/r", workspace, seeded=True)
    assert snapshots.ensure(()) == "restored"
    assert (workspace / "calc.py").read_text() == "x = 1\n" and (
        workspace / "data/in.txt"
    ).read_text() == "3\n"
    (workspace / "calc.py").write_text("changed\n")  # the agent's work survives a new actor on this node
    assert WorkspaceSnapshots(storage, "runs/r", workspace, seeded=True).ensure(()) == "local"
    assert (workspace / "calc.py").read_text() == "changed\n"
    # an interrupted first command on another node: the state before it is the seed again
    elsewhere = tmp_path / "other" / "r"
    assert WorkspaceSnapshots(storage, "runs/r", elsewhere, seeded=True).ensure((0, NO_COMMAND)) == "restored"
    assert (elsewhere / "calc.py").read_text() == "x = 1\n"


def test_seed_paths_cannot_leave_the_workspace() -> None:
    for path in ("../x", "/etc/passwd", ""):
        with pytest.raises(ValueError):
            pack_files({path: "x"})
    with tarfile.open(fileobj=io.BytesIO(pack_files({"a/b.txt": "hi"})), mode="r:gz") as archive:
        assert archive.getnames() == ["a/b.txt"]
