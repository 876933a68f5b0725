"""An evaluation's error bars, pass@k, pass^k and the paired difference, against hand-computed
values and properties that must hold for every batch (decision 60)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodus.schema_group import EvaluationStatistics, EvaluationStatus
from nodus_ray.core.eval_statistics import (
    batch_differences,
    compare_records,
    estimate,
    evaluation_statistics,
    k_values,
    pass_at_k,
    pass_hat_k,
    scores_by_task,
)
from nodus_ray.core.evaluation import final_record, live_record, plan_cases, summarize

Verdict = tuple[str, float]
PASS: Verdict = ("pass", 1.0)
FAIL: Verdict = ("fail", 0.0)


def _records(tasks: Sequence[Sequence[Verdict | str]]) -> list[dict[str, Any]]:
    """One record per case, task by task; a string is an unscored state (or Pending)."""
    repetitions = max(len(cases) for cases in tasks)
    planned = plan_cases("g", [f"t-{i}" for i in range(len(tasks))], repetitions)
    records = []
    for case in planned:
        cases = tasks[case.task_index]
        if case.repetition > len(cases):
            continue
        outcome = cases[case.repetition - 1]
        if outcome == "Pending":
            records.append(live_record(case, "Pending"))
        elif isinstance(outcome, str):
            records.append(final_record(case, outcome))
        else:
            records.append(final_record(case, "Scored", verdict=outcome[0], reward=outcome[1]))
    return records


# -- hand-computed values ------------------------------------------------------------------------


def test_without_repetitions_the_standard_error_is_the_sample_one_over_root_n() -> None:
    stats = evaluation_statistics(_records([[PASS], [FAIL], [PASS], [PASS]]))
    assert stats is not None
    rate = stats["passRate"]
    # mean 0.75; s^2 = (3 * 0.25^2 + 0.75^2) / 3 = 0.25; SE = sqrt(0.25 / 4) = 0.25
    assert rate["value"] == 0.75 and rate["standardError"] == pytest.approx(0.25)
    assert rate["ci95"] == [pytest.approx(0.75 - 1.96 * 0.25), 1.0]  # 1.24 clipped to 1
    assert (rate["n"], rate["tasks"], rate["clusteredBy"]) == (4, 4, None)
    assert stats["passAtK"] == {"1": 0.75} and stats["passHatK"] == {"1": 0.75}


def test_with_repetitions_it_is_clustered_by_task_and_equals_the_task_means_standard_error() -> None:
    # Task means 0.5, 1.0, 0.0: mean 0.5, sample sd 0.5, SE = 0.5 / sqrt(3).
    stats = evaluation_statistics(_records([[PASS, FAIL], [PASS, PASS], [("partial", 0.5), FAIL]]))
    assert stats is not None
    rate, reward = stats["passRate"], stats["meanReward"]
    assert rate["value"] == 0.5 and rate["standardError"] == pytest.approx(0.5 / math.sqrt(3), abs=1e-6)
    assert (rate["n"], rate["tasks"], rate["clusteredBy"]) == (6, 3, "task")
    assert rate["ci95"] == [0.0, 1.0]  # 0.5 -+ 0.566, clipped
    # Rewards: task means 0.5, 1.0, 0.25 -> mean 7/12; sd of (0.5, 1, 0.25) / sqrt(3).
    means = [0.5, 1.0, 0.25]
    sd = math.sqrt(sum((m - 7 / 12) ** 2 for m in means) / 2)
    assert reward["value"] == pytest.approx(7 / 12, abs=1e-6)
    assert reward["standardError"] == pytest.approx(sd / math.sqrt(3), abs=1e-6)
    assert reward["ci95"] == [pytest.approx(7 / 12 - 1.96 * sd / math.sqrt(3), abs=1e-6), 1.0]
    # pass@2 per task: 1 - C(1,2)/C(2,2) = 1, 1, 1 - C(2,2)/C(2,2) = 0 -> 2/3; pass^2: 0, 1, 0 -> 1/3.
    assert stats["passAtK"] == {"1": 0.5, "2": pytest.approx(2 / 3, abs=1e-6)}
    assert stats["passHatK"] == {"1": 0.5, "2": pytest.approx(1 / 3, abs=1e-6)}


def test_unequal_clusters_use_the_cluster_robust_formula() -> None:
    # Task a: pass, pass, fail; task b: fail (its other cases unscored). n=4, mean 0.5.
    # Deviations summed per task: a 0.5 + 0.5 - 0.5 = 0.5, b -0.5; G/(G-1) * (0.25 + 0.25) / 16.
    records = _records([[PASS, PASS, FAIL], [FAIL, "RunFailed", "GraderFailed"]])
    stats = evaluation_statistics(records)
    assert stats is not None
    assert stats["passRate"]["value"] == 0.5  # the case-weighted mean: exactly status.passRate
    assert stats["passRate"]["standardError"] == pytest.approx(math.sqrt(2 * 0.5 / 16))
    assert summarize(records)["passRate"] == 0.5
    # pass@k only over tasks with at least k scored cases: k=2 and k=3 are task a's alone.
    assert stats["passAtK"] == {"1": pytest.approx((2 / 3 + 0) / 2, abs=1e-6), "2": 1.0, "3": 1.0}
    assert stats["passHatK"] == {
        "1": pytest.approx(1 / 3, abs=1e-6),
        "2": pytest.approx(1 / 3, abs=1e-6),
        "3": 0.0,
    }


def test_pass_at_k_and_pass_hat_k_are_the_published_estimators() -> None:
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_hat_k(5, 2, 2) == pytest.approx(1 / 10)  # C(2,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_hat_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 3, 2) == 1.0  # only one failure: any two tries hold a pass
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError):
        pass_hat_k(2, 3, 1)


def test_k_runs_over_powers_of_two_and_the_repetitions() -> None:
    assert [k_values(r) for r in (1, 2, 3, 5, 8, 10)] == [
        [1],
        [1, 2],
        [1, 2, 3],
        [1, 2, 4, 5],
        [1, 2, 4, 8],
        [1, 2, 4, 8, 10],
    ]


def test_nothing_scored_has_no_statistics_and_unscored_cases_are_not_zeros() -> None:
    assert evaluation_statistics(_records([["RunFailed"], ["Pending"]])) is None
    assert summarize(_records([["MissingAnswer"]]))["statistics"] is None
    stats = evaluation_statistics(_records([[PASS], ["RunFailed"], ["EvaluationTimeout"]]))
    assert stats is not None and stats["passRate"]["value"] == 1.0 and stats["passRate"]["n"] == 1


def test_one_cluster_gives_no_interval() -> None:
    one = evaluation_statistics(_records([[PASS]]))
    assert one is not None and one["passRate"]["standardError"] is None and one["passRate"]["ci95"] is None
    one_task = evaluation_statistics(_records([[PASS, FAIL, PASS]]))
    assert one_task is not None and one_task["passRate"]["ci95"] is None  # one task, however many tries
    assert one_task["passRate"]["clusteredBy"] == "task"


def test_the_statistics_fit_the_typed_status() -> None:
    records = _records([[PASS, FAIL], [FAIL, FAIL]])
    summary = summarize(records)
    status = EvaluationStatus.model_validate(
        {"environment": "e@1", "version": "1", "split": "test", "seed": 0, "tasks": 2, "repetitions": 2}
        | {"cases": 4}
        | summary
    )
    assert isinstance(status.statistics, EvaluationStatistics)
    assert status.statistics.passRate.clusteredBy == "task" and status.statistics.passAtK["2"] == 0.5
    assert (
        EvaluationStatus.model_validate(
            {
                "environment": "e@1",
                "version": "1",
                "split": "t",
                "seed": 0,
                "tasks": 1,
                "repetitions": 1,
                "cases": 1,
            }
        ).statistics
        is None
    )


# -- the paired difference -----------------------------------------------------------------------


def test_the_paired_difference_by_hand() -> None:
    a = _records([[PASS, PASS], [PASS, FAIL], [FAIL, FAIL]])
    b = _records([[FAIL, FAIL], [FAIL, PASS], [FAIL, FAIL]])
    compared = compare_records(a, b)
    # Task differences 1, 0, 0: mean 1/3, sample variance 1/3, SE sqrt(1/3 / 3) = 1/3.
    rate = compared["passRate"]
    assert compared["tasks"] == 3 and rate["n"] == 3
    assert rate["a"] == pytest.approx(0.5, abs=1e-6) and rate["b"] == pytest.approx(1 / 6, abs=1e-6)
    assert rate["difference"] == pytest.approx(1 / 3, abs=1e-6)
    assert rate["standardError"] == pytest.approx(1 / 3, abs=1e-6)
    assert rate["ci95"] == [
        pytest.approx(1 / 3 - 1.96 / 3, abs=1e-6),
        pytest.approx(1 / 3 + 1.96 / 3, abs=1e-6),
    ]
    assert compared["meanReward"] == rate  # pass/fail only: rewards are the verdicts


def test_only_tasks_scored_in_both_are_paired() -> None:
    a = _records([[PASS], ["RunFailed"], [PASS]])
    b = _records([[FAIL], [PASS], ["MissingAnswer"]])
    compared = compare_records(a, b)
    assert compared["tasks"] == 1
    assert compared["passRate"] == {
        "a": 1.0,
        "b": 0.0,
        "difference": 1.0,
        "standardError": None,
        "ci95": None,
        "n": 1,
    }
    none = compare_records(_records([["RunFailed"]]), _records([[PASS]]))
    assert none["tasks"] == 0 and none["passRate"]["difference"] is None


def test_a_different_batch_names_every_field_that_differs() -> None:
    base = {"environment": "nodus/arithmetic-v2@2.0.0", "version": "2.0.0", "split": "test", "seed": 42}
    a = {**base, "tasks": 10, "repetitions": 2}
    assert batch_differences(a, {**a, "repetitions": 1}) == {}  # repetitions may differ
    assert batch_differences(a, {**a, "seed": 43, "tasks": 12}) == {"seed": (42, 43), "tasks": (10, 12)}
    newer = {**a, "environment": "nodus/arithmetic-v2@2.1.0", "version": "2.1.0"}
    assert batch_differences(a, newer) == {"version": ("2.0.0", "2.1.0")}
    other = {**a, "environment": "nodus/python-fix@2.0.0", "split": "train"}
    assert batch_differences(a, other) == {
        "environment": ("nodus/arithmetic-v2", "nodus/python-fix"),
        "split": ("test", "train"),
    }


# -- properties ----------------------------------------------------------------------------------

_verdicts = st.sampled_from([PASS, FAIL, ("partial", 0.25), ("partial", 0.5), ("invalid", 0.0)])
_tasks = st.lists(st.lists(_verdicts, min_size=1, max_size=6), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(_tasks)
def test_the_interval_holds_the_mean_and_pass_hat_k_never_exceeds_pass_at_k(
    tasks: list[list[Verdict]],
) -> None:
    stats = evaluation_statistics(_records(list(tasks)))
    assert stats is not None
    for name in ("passRate", "meanReward"):
        figure = stats[name]
        if figure["ci95"] is not None:
            low, high = figure["ci95"]
            assert 0.0 <= low <= figure["value"] <= high <= 1.0
            assert figure["standardError"] >= 0
    for k, at in stats["passAtK"].items():
        assert 0.0 <= stats["passHatK"][k] <= at <= 1.0


@settings(max_examples=100, deadline=None)
@given(st.lists(_verdicts, min_size=1, max_size=30))
def test_pass_at_1_is_the_pass_rate_with_one_repetition(cases: list[Verdict]) -> None:
    records = _records([[case] for case in cases])
    stats = evaluation_statistics(records)
    assert stats is not None
    assert stats["passAtK"] == {"1": stats["passRate"]["value"]} == {"1": summarize(records)["passRate"]}


@settings(max_examples=100, deadline=None)
@given(_verdicts, st.integers(1, 8), st.integers(2, 10))
def test_all_equal_has_zero_standard_error(verdict: Verdict, repetitions: int, count: int) -> None:
    stats = evaluation_statistics(_records([[verdict] * repetitions for _ in range(count)]))
    assert stats is not None
    assert stats["passRate"]["standardError"] == 0.0 and stats["meanReward"]["standardError"] == 0.0
    value = stats["meanReward"]["value"]
    assert stats["meanReward"]["ci95"] == [value, value]


@settings(max_examples=100, deadline=None)
@given(_tasks)
def test_an_evaluation_compared_with_itself_differs_by_zero(tasks: list[list[Verdict]]) -> None:
    records = _records(list(tasks))
    compared = compare_records(records, records)
    assert compared["tasks"] == len(scores_by_task(records))
    for name in ("passRate", "meanReward"):
        assert compared[name]["difference"] == 0.0
        assert compared[name]["standardError"] in (None, 0.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=20))
def test_unclustered_estimate_is_the_textbook_one(values: list[float]) -> None:
    found = estimate([[v] for v in values], clustered=False)
    assert found is not None and found.standard_error is not None
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert found.standard_error == pytest.approx(sd / math.sqrt(len(values)), abs=2e-6)
    # Clustering singletons changes nothing.
    assert estimate([[v] for v in values], clustered=True) == replace(found, clustered_by="task")
