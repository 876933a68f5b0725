"""How an evaluation's error bars and a comparison read on a terminal (decision 60).

``pass rate 0.62 ± 0.08 (95% CI 0.54-0.70, clustered by task, n=40)``: the ± is the 95%
interval's half-width (1.96 standard errors) before clipping to [0, 1], the interval is the
clipped one. Pure formatting of ``status.evaluation.statistics`` and of an
``EvaluationComparison``; used by ``nodus evaluation results``, ``nodus evaluation compare`` and
``nodus describe agentgroup``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["estimate_line", "statistics_lines", "comparison_lines", "Z95"]

Z95 = 1.96  # as `nodus_ray.core.eval_statistics.Z95`: the SDK never imports the engine


def estimate_line(label: str, estimate: Mapping[str, Any] | None) -> str:
    """One estimate: value ± half-width (interval, clustering, n), or why there is no interval."""
    if not isinstance(estimate, Mapping) or estimate.get("value") is None:
        return f"{label} - (no case scored yet)"
    value = float(estimate["value"])
    n = estimate.get("n", 0)
    clustered = estimate.get("clusteredBy")
    se, ci = estimate.get("standardError"), estimate.get("ci95")
    if se is None or not ci:
        few = "2 tasks" if clustered else "2 scored cases"
        return f"{label} {value:.2f} (n={n}; no interval from fewer than {few})"
    where = f", clustered by {clustered} ({estimate.get('tasks')} tasks)" if clustered else ""
    return f"{label} {value:.2f} ± {Z95 * float(se):.2f} (95% CI {ci[0]:.2f}-{ci[1]:.2f}{where}, n={n})"


def _by_k(values: Any) -> str:
    if not isinstance(values, Mapping) or not values:
        return "-"
    return ", ".join(f"k={k} {float(v):.2f}" for k, v in sorted(values.items(), key=lambda kv: int(kv[0])))


def statistics_lines(statistics: Mapping[str, Any] | None) -> list[str]:
    """Every line of ``status.evaluation.statistics``; one line when nothing is scored yet."""
    if not isinstance(statistics, Mapping):
        return ["pass rate - (no case scored yet)"]
    return [
        estimate_line("pass rate", statistics.get("passRate")),
        estimate_line("mean reward", statistics.get("meanReward")),
        f"pass@k {_by_k(statistics.get('passAtK'))}",
        f"pass^k {_by_k(statistics.get('passHatK'))}",
    ]


def _signed(value: float) -> str:
    return f"{value:+.2f}"


def _difference_line(label: str, paired: Mapping[str, Any] | None) -> str:
    if not isinstance(paired, Mapping) or paired.get("difference") is None:
        return f"{label} - (no task scored in both)"
    a, b, d = float(paired["a"]), float(paired["b"]), float(paired["difference"])
    head = f"{label} {a:.2f} - {b:.2f} = {_signed(d)}"
    se, ci, n = paired.get("standardError"), paired.get("ci95"), paired.get("n")
    if se is None or not ci:
        return f"{head} (n={n} task; no interval from fewer than 2 tasks)"
    return (
        f"{head} ± {Z95 * float(se):.2f} (95% CI {_signed(ci[0])} to {_signed(ci[1])}, paired by task, n={n})"
    )


def comparison_lines(comparison: Mapping[str, Any]) -> list[str]:
    """An ``EvaluationComparison``: what was compared, then A - B for each figure."""
    a, b = comparison.get("a") or {}, comparison.get("b") or {}
    batch = comparison.get("batch") or {}
    lines = [
        f"A {a.get('name')} minus B {b.get('name')}: {batch.get('environment')}, split {batch.get('split')}, "
        f"seed {batch.get('seed')}, {batch.get('tasks')} tasks; {comparison.get('tasks', 0)} scored in both",
    ]
    for side, label in ((a, "A"), (b, "B")):
        if side.get("pending"):
            lines.append(f"{label} {side.get('name')} still has {side['pending']} cases pending")
    lines.append(_difference_line("pass rate", comparison.get("passRate")))
    lines.append(_difference_line("mean reward", comparison.get("meanReward")))
    return lines
