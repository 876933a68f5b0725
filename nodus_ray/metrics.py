"""The engine's metrics, through Ray's own API (`ray.util.metrics`), for Ray's Prometheus export.

Ray's metrics agent on each node collects what the processes of that node record and serves
it beside Ray's system metrics, so the engine opens no port; `dashboards/nodus-grafana.json`
charts them and `docs/metrics.md` says what each one means and how Ray names it on export.

Labels are bounded: phases, states, models, families, outcomes, and project and group names,
never a run's name (a label per run would make a series per run). Gauges have one writer per
tag set (the control plane for runs by phase, a group's supervisor for its group), and a state
that empties is set to 0, not left at its last value.

Outside a Ray worker (unit tests, the journal benchmark) every recording is a no-op.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from nodus.lifecycle import RunPhase

__all__ = [
    "RUN_PHASES",
    "GROUP_STATES",
    "set_runs_by_phase",
    "set_group_runs",
    "model_call",
    "command_ran",
    "journal_write",
    "admission_decisions",
]

RUN_PHASES: tuple[str, ...] = tuple(str(phase) for phase in RunPhase)  # plain strings: Ray's tag values
GROUP_STATES = ("queued", "active", "waiting")

_MODEL_SECONDS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]
_COMMAND_SECONDS = [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300]
_JOURNAL_SECONDS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5]

_lock = threading.Lock()
_metrics: dict[str, Any] | None = None


def _registry() -> dict[str, Any] | None:
    """The metric objects, made once per process; None outside a Ray worker."""
    global _metrics
    if _metrics is not None:
        return _metrics or None
    with _lock:
        if _metrics is None:
            import ray

            if not ray.is_initialized():
                return None
            from ray.util.metrics import Counter, Gauge, Histogram

            _metrics = {
                "runs": Gauge("nodus_runs", "AgentRuns in each phase", tag_keys=("phase", "project")),
                "group_runs": Gauge(
                    "nodus_group_runs",
                    "Members of each AgentGroup by admission state",
                    tag_keys=("project", "group", "state"),
                ),
                "calls": Counter(
                    "nodus_model_calls", "Model calls made", tag_keys=("model", "family", "access")
                ),
                "tokens": Counter(
                    "nodus_model_tokens", "Tokens of model calls", tag_keys=("model", "family", "kind")
                ),
                "cost": Counter(
                    "nodus_model_cost_usd", "Dollars billed for model calls", tag_keys=("model", "family")
                ),
                "call_seconds": Histogram(
                    "nodus_model_call_seconds",
                    "Wall time of one model call",
                    boundaries=_MODEL_SECONDS,
                    tag_keys=("model",),
                ),
                "command_seconds": Histogram(
                    "nodus_command_seconds",
                    "Wall time of one sandboxed command",
                    boundaries=_COMMAND_SECONDS,
                    tag_keys=("outcome",),
                ),
                "journal_seconds": Histogram(
                    "nodus_journal_write_seconds", "Writing one journal segment", boundaries=_JOURNAL_SECONDS
                ),
                "admissions": Counter(
                    "nodus_admission_decisions",
                    "Group supervisors' admission decisions",
                    tag_keys=("project", "group", "decision"),
                ),
            }
    return _metrics or None


def set_runs_by_phase(counts: Mapping[tuple[str, str], int], projects: Iterable[str]) -> None:
    """``counts[(project, phase)]``; every phase of every project is set, empty ones to 0."""
    registry = _registry()
    if registry is None:
        return
    for project in projects:
        for phase in RUN_PHASES:
            registry["runs"].set(counts.get((project, phase), 0), tags={"phase": phase, "project": project})


def set_group_runs(project: str, group: str, counts: Mapping[str, int]) -> None:
    registry = _registry()
    if registry is None:
        return
    for state in GROUP_STATES:
        registry["group_runs"].set(
            int(counts.get(state) or 0), tags={"project": project, "group": group, "state": state}
        )


def model_call(
    model: str, family: str, access: str, seconds: float, usage: Mapping[str, int], cost_usd: float
) -> None:
    """One model call that was made (a replayed one is not made again, and not counted)."""
    registry = _registry()
    if registry is None:
        return
    registry["calls"].inc(1, tags={"model": model, "family": family, "access": access})
    for kind, tokens in usage.items():
        if tokens:
            registry["tokens"].inc(tokens, tags={"model": model, "family": family, "kind": kind})
    if cost_usd:
        registry["cost"].inc(cost_usd, tags={"model": model, "family": family})
    registry["call_seconds"].observe(seconds, tags={"model": model})


def command_ran(seconds: float, exit_code: int | None) -> None:
    registry = _registry()
    if registry is None:
        return
    outcome = "killed" if exit_code is None else "ok" if exit_code == 0 else "failed"
    registry["command_seconds"].observe(seconds, tags={"outcome": outcome})


def journal_write(seconds: float) -> None:
    registry = _registry()
    if registry is not None:
        registry["journal_seconds"].observe(seconds)


def admission_decisions(project: str, group: str, started: int, cancelled: int) -> None:
    registry = _registry()
    if registry is None:
        return
    if started:
        registry["admissions"].inc(started, tags={"project": project, "group": group, "decision": "start"})
    if cancelled:
        registry["admissions"].inc(cancelled, tags={"project": project, "group": group, "decision": "cancel"})
