"""Error bars for an evaluation, and the paired difference of two: pure functions, no I/O.

A pass rate of 0.62 over 40 cases says little until it says how far it could move by chance.
This module gives each evaluation's pass rate and mean reward a standard error and a 95%
confidence interval, pass@k and pass^k over its repetitions, and the paired difference of two
evaluations on the same task batch, following "Adding Error Bars to Evals" (Miller, 2024) and
what Inspect reports. Only ``Scored`` cases count: an unscored case says nothing about the
agent and is never a zero (document 002). Decision 60 says why each choice is what it is.

* **The estimate** is the mean over scored cases, exactly ``status.evaluation.passRate`` and
  ``meanReward``.
* **Its standard error** is the cluster-robust one, clustered by task when the evaluation has
  repetitions (cases of one task are not independent draws: a hard task fails every time):
  ``SE^2 = G/(G-1) * (1/n^2) * sum_g (sum_i (x_gi - mean))^2`` over the G tasks with a scored
  case and the n scored cases. With one scored case per task this is the plain ``s/sqrt(n)``
  (sample standard deviation); with the same number of scored cases in every task it is the
  standard error of the task means, ``s_tasks/sqrt(G)``, i.e. averaging each task's repetitions
  first. None below two clusters.
* **The 95% interval** is ``mean +- 1.96 SE`` (the normal interval of the central limit
  theorem), clipped to [0, 1], where pass rates and rewards live.
* **pass@k** is Chen et al.'s (2021) unbiased ``1 - C(n-c, k)/C(n, k)`` per task and **pass^k**
  tau-bench's ``C(c, k)/C(n, k)`` (every one of k tries passes), each averaged over the tasks
  with at least k scored cases, for k the powers of two up to the repetitions and the
  repetitions themselves.
* **The paired difference** of evaluations A and B: per task scored in both, A's task mean
  minus B's; their mean, ``s_d/sqrt(n)`` and its 95% interval (clipped to [-1, 1]) over those n
  tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Z95",
    "Metric",
    "BATCH_FIELDS",
    "Estimate",
    "TaskScores",
    "scores_by_task",
    "estimate",
    "pass_at_k",
    "pass_hat_k",
    "k_values",
    "evaluation_statistics",
    "batch_differences",
    "paired_difference",
    "compare_records",
]

Z95 = 1.96  # the two-sided 95% quantile of the normal distribution, as Miller (2024) writes it
_DIGITS = 6  # what status.evaluation's rates are rounded to (`core.evaluation.summarize`)

# What makes two evaluations' cases the same tasks: the environment (owner/name), its version,
# the split, the seed and the number of tasks. Repetitions may differ: the pairing is per task.
BATCH_FIELDS: tuple[str, ...] = ("environment", "version", "split", "seed", "tasks")

# The two figures with error bars: a case's pass (1 or 0) and its reward. Their wire names.
Metric = Literal["passRate", "meanReward"]


@dataclass(frozen=True)
class TaskScores:
    """One task's scored cases: whether each passed, and its reward."""

    passed: tuple[bool, ...]
    rewards: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.passed)

    @property
    def c(self) -> int:
        return sum(self.passed)

    def mean(self, metric: Metric) -> float:
        values = self.values(metric)
        return sum(values) / len(values)

    def values(self, metric: Metric) -> tuple[float, ...]:
        if metric == "passRate":
            return tuple(1.0 if passed else 0.0 for passed in self.passed)
        return self.rewards


@dataclass(frozen=True)
class Estimate:
    """A mean with its standard error and 95% interval (both None below two clusters)."""

    value: float
    standard_error: float | None
    ci95: tuple[float, float] | None
    n: int  # scored cases
    tasks: int  # clusters: tasks with a scored case
    clustered_by: str | None  # "task" when an evaluation has repetitions

    def wire(self) -> dict[str, Any]:
        """``status.evaluation.statistics.passRate`` (and ``meanReward``)."""
        return {
            "value": self.value,
            "standardError": self.standard_error,
            "ci95": None if self.ci95 is None else [self.ci95[0], self.ci95[1]],
            "n": self.n,
            "clusteredBy": self.clustered_by,
            "tasks": self.tasks,
        }


def _round(value: float) -> float:
    return round(value, _DIGITS)


def _interval(mean: float, se: float, low: float, high: float) -> tuple[float, float]:
    return (_round(max(low, mean - Z95 * se)), _round(min(high, mean + Z95 * se)))


def scores_by_task(records: Iterable[Mapping[str, Any]]) -> dict[str, TaskScores]:
    """The scored cases grouped by task id, in first-seen (case) order; others are left out."""
    passed: dict[str, list[bool]] = {}
    rewards: dict[str, list[float]] = {}
    for record in records:
        if record.get("state") != "Scored":
            continue
        task = str(record["taskId"])
        passed.setdefault(task, []).append(record.get("verdict") == "pass")
        rewards.setdefault(task, []).append(float(record["reward"]))
    return {task: TaskScores(tuple(passed[task]), tuple(rewards[task])) for task in passed}


def estimate(clusters: Sequence[Sequence[float]], *, clustered: bool) -> Estimate | None:
    """The mean of every value with its cluster-robust standard error (see the module's text).

    ``clusters`` are the values of each task; with ``clustered`` False every value is its own
    cluster. None when there is no value at all.
    """
    groups = [list(group) for group in clusters if group] if clustered else [[v] for g in clusters for v in g]
    n = sum(len(group) for group in groups)
    if n == 0:
        return None
    mean = sum(sum(group) for group in groups) / n
    count = len(groups)
    se: float | None = None
    ci: tuple[float, float] | None = None
    if count >= 2:
        spread = sum(sum(value - mean for value in group) ** 2 for group in groups)
        se = math.sqrt(count / (count - 1) * spread / n**2)
        ci = _interval(mean, se, 0.0, 1.0)
        se = _round(se)
    tasks = len([group for group in clusters if group])
    return Estimate(_round(mean), se, ci, n, tasks, "task" if clustered else None)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): the chance that at least one of k of the n tries passes (c passed)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """tau-bench's pass^k: the chance that all of k of the n tries pass (c passed)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass^k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    return math.comb(c, k) / math.comb(n, k)


def k_values(repetitions: int) -> list[int]:
    """1, 2, 4, ... up to ``repetitions``, and ``repetitions`` itself."""
    ks = []
    k = 1
    while k <= repetitions:
        ks.append(k)
        k *= 2
    if repetitions >= 1 and ks[-1] != repetitions:
        ks.append(repetitions)
    return ks


def _over_tasks(
    tasks: Iterable[TaskScores], k: int, per_task: Callable[[int, int, int], float]
) -> float | None:
    values = [per_task(task.n, task.c, k) for task in tasks if task.n >= k]
    return _round(sum(values) / len(values)) if values else None


def evaluation_statistics(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``status.evaluation.statistics`` from every case record; None before a case is scored.

    Clustered by task when the evaluation has repetitions (some case has ``repetition`` > 1;
    the records list every planned case, pending ones too).
    """
    tasks = scores_by_task(records)
    if not tasks:
        return None
    repetitions = max((int(record.get("repetition") or 1) for record in records), default=1)
    clustered = repetitions > 1
    rates = estimate([task.values("passRate") for task in tasks.values()], clustered=clustered)
    rewards = estimate([task.values("meanReward") for task in tasks.values()], clustered=clustered)
    assert rates is not None and rewards is not None  # some task has a scored case
    at_k: dict[str, float] = {}
    hat_k: dict[str, float] = {}
    for k in k_values(repetitions):
        at, hat = _over_tasks(tasks.values(), k, pass_at_k), _over_tasks(tasks.values(), k, pass_hat_k)
        if at is not None and hat is not None:
            at_k[str(k)], hat_k[str(k)] = at, hat
    return {"passRate": rates.wire(), "meanReward": rewards.wire(), "passAtK": at_k, "passHatK": hat_k}


def batch_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What differs between two ``status.evaluation``s' batches, field by field (empty: same).

    The environment is compared by owner/name (its reference without ``@version``), so a new
    version is reported as the version that differs.
    """

    def identity(evaluation: Mapping[str, Any]) -> dict[str, Any]:
        out = {field: evaluation.get(field) for field in BATCH_FIELDS}
        out["environment"] = str(out["environment"] or "").split("@", 1)[0]
        return out

    left, right = identity(a), identity(b)
    return {field: (left[field], right[field]) for field in BATCH_FIELDS if left[field] != right[field]}


def paired_difference(
    a: Mapping[str, TaskScores], b: Mapping[str, TaskScores], metric: Metric
) -> dict[str, Any]:
    """A's task means minus B's over the tasks scored in both: mean, SE, 95% interval, n.

    ``a`` and ``b`` are the paired tasks' average task means of each evaluation, so
    ``difference`` is exactly ``a - b``. Every figure is None without a paired task, and the
    standard error and interval below two.
    """
    paired = [task for task in a if task in b]
    n = len(paired)
    if n == 0:
        return {"a": None, "b": None, "difference": None, "standardError": None, "ci95": None, "n": 0}
    left = [a[task].mean(metric) for task in paired]
    right = [b[task].mean(metric) for task in paired]
    differences = [x - y for x, y in zip(left, right, strict=True)]
    mean = sum(differences) / n
    se: float | None = None
    ci: list[float] | None = None
    if n >= 2:
        variance = sum((d - mean) ** 2 for d in differences) / (n - 1)
        error = math.sqrt(variance / n)
        low, high = _interval(mean, error, -1.0, 1.0)
        se, ci = _round(error), [low, high]
    return {
        "a": _round(sum(left) / n),
        "b": _round(sum(right) / n),
        "difference": _round(mean),
        "standardError": se,
        "ci95": ci,
        "n": n,
    }


def compare_records(
    a_records: Sequence[Mapping[str, Any]], b_records: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The paired difference of two evaluations' pass rates and mean rewards (same batch:
    `batch_differences` is checked by the caller, who names the evaluations in its refusal)."""
    a, b = scores_by_task(a_records), scores_by_task(b_records)
    return {
        "tasks": len([task for task in a if task in b]),
        "passRate": paired_difference(a, b, "passRate"),
        "meanReward": paired_difference(a, b, "meanReward"),
    }
