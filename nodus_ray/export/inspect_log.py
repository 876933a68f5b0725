"""An evaluation as Inspect's eval log (``EvalLog``, version 2, JSON): what ``inspect view`` reads.

The log's fields, from ours:

* ``eval``: the task is the Environment (``nodus/arithmetic-v2``, its version the task's), the
  dataset its split with one sample id per task, ``config.epochs`` the repetitions, the model
  the one the runs used, ``eval_id``/``run_id`` the group's uid;
* ``results.scores``: ``verdict`` (``accuracy``: the pass rate over scored cases, with its
  ``stderr`` when the evaluation's statistics carry one) and ``reward`` (``mean``, ``stderr``);
* each case is a sample: ``id`` the task id, ``epoch`` the repetition, ``input`` the prompt the
  run was given, ``target`` empty (the hidden answer is never exported), ``messages`` the run's
  conversation (`export.transcript`), ``output`` its last model turn, ``scores`` the grader's
  verdict (``C`` pass, ``P`` partial, ``I`` fail or invalid) and reward, ``model_usage`` its
  tokens and cost. An unscored case (its run failed, the grader failed, ...) carries ``error``,
  as Inspect marks a sample it could not score; a case not final yet has no scores.

A log of thousands of cases is written as a stream: `head` (every field but the samples,
opening the ``samples`` array), the samples, and `TAIL`; the service serves it in pages.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from nodus.resources import UNSCORED_STATES
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.journal_log import JournalRecord
from nodus_ray.export.transcript import Said, Utterance, transcript
from nodus_ray.store.timestamps import parse_timestamp

__all__ = ["eval_header", "eval_sample", "head", "model_of", "TAIL", "VERDICT_VALUES"]

TAIL = b"]}"
VERDICT_VALUES = {"pass": "C", "partial": "P", "fail": "I", "invalid": "I"}
_LOG_STATUS = {"Succeeded": "success", "Cancelled": "cancelled"}
_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "max_tokens",
    "refusal": "content_filter",
    "model_context_window_exceeded": "model_length",
}


def _usd(value: Any) -> float:
    try:
        return float(Decimal(str(value or "0")))
    except (InvalidOperation, ValueError):
        return 0.0


def _seconds(start: Any, end: Any) -> float | None:
    try:
        return round((parse_timestamp(str(end)) - parse_timestamp(str(start))).total_seconds(), 3)
    except (TypeError, ValueError):
        return None


def _statistic(statistics: Any, *path: str) -> float | None:
    """A number inside ``status.evaluation.statistics`` (decision 60), or None when absent."""
    node = statistics
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, int | float) and not isinstance(node, bool) and math.isfinite(node):
        return float(node)
    return None


def _metric(name: str, value: Any, metadata: dict[str, Any] | None = None) -> dict[str, Any] | None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None
    metric: dict[str, Any] = {"name": name, "value": float(value), "params": {}}
    if metadata:
        metric["metadata"] = metadata
    return metric


def _estimate(statistics: Any, of: str, name: str, value: Any) -> dict[str, dict[str, Any] | None]:
    """The metric and its ``stderr`` from ``statistics[of]`` (decision 60: value, standardError,
    ci95, n, clusteredBy); the value alone when there are no statistics."""
    estimate = statistics.get(of) if isinstance(statistics, dict) else None
    estimate = estimate if isinstance(estimate, dict) else {}
    interval = {k: estimate[k] for k in ("ci95", "n", "clusteredBy") if estimate.get(k) is not None}
    return {
        name: _metric(name, value, interval),
        "stderr": _metric("stderr", _statistic(statistics, of, "standardError")),
    }


def _at_k(statistics: Any) -> dict[str, dict[str, Any] | None]:
    """pass@k and pass^k over repetitions, as metrics ``pass_at_k`` and ``pass_hat_k``."""
    metrics: dict[str, dict[str, Any] | None] = {}
    for key, prefix in (("passAtK", "pass_at_"), ("passHatK", "pass_hat_")):
        values = statistics.get(key) if isinstance(statistics, dict) else None
        for k, value in (values or {}).items():
            metrics[f"{prefix}{k}"] = _metric(f"{prefix}{k}", value)
    return metrics


def _score(
    name: str, metrics: dict[str, dict[str, Any] | None], scored: int, unscored: int
) -> dict[str, Any]:
    return {
        "name": name,
        "scorer": name,
        "scored_samples": scored,
        "unscored_samples": unscored,
        "params": {},
        "metrics": {key: value for key, value in metrics.items() if value is not None},
    }


def eval_header(
    group: dict[str, Any], records: Sequence[dict[str, Any]], model: str, finished: bool
) -> dict[str, Any]:
    """Every field of the log but ``samples``: the eval's spec, plan, results and stats."""
    metadata, status = group.get("metadata") or {}, group.get("status") or {}
    evaluation = status.get("evaluation") or {}
    statistics = evaluation.get("statistics")
    environment = str(evaluation.get("environment") or "").split("@")[0]  # its version: task_version
    scored = int(evaluation.get("scored") or 0)
    unscored = int(evaluation.get("unscored") or 0)
    task_ids = list(dict.fromkeys(str(record.get("taskId")) for record in records))
    created = str(metadata.get("creationTimestamp") or "")
    verdict = _score(
        "verdict",
        {**_estimate(statistics, "passRate", "accuracy", evaluation.get("passRate")), **_at_k(statistics)},
        scored,
        unscored,
    )
    reward = _score(
        "reward",
        _estimate(statistics, "meanReward", "mean", evaluation.get("meanReward")),
        scored,
        unscored,
    )
    return {
        "version": 2,
        "status": _LOG_STATUS.get(str(status.get("phase")), "error") if finished else "started",
        "eval": {
            "eval_id": str(metadata.get("uid") or ""),
            "run_id": str(metadata.get("uid") or ""),
            "created": created,
            "task": environment,
            "task_id": str(metadata.get("name") or ""),
            "task_version": str(evaluation.get("version") or 0),
            "task_attribs": {},
            "task_args": {"split": evaluation.get("split"), "seed": evaluation.get("seed")},
            "solver": f"nodus/{(group.get('spec') or {}).get('agent', '')}",
            "dataset": {
                "name": f"{environment}:{evaluation.get('split', '')}",
                "samples": len(task_ids),
                "sample_ids": task_ids,
                "shuffled": False,
            },
            "model": model,
            "config": {"epochs": int(evaluation.get("repetitions") or 1)},
            "packages": {"nodus-ray": "0.1.0"},
            "metadata": {
                "project": metadata.get("project"),
                "group": metadata.get("name"),
                "phase": status.get("phase"),
                "reason": status.get("reason"),
                "unscoredReasons": evaluation.get("unscoredReasons") or {},
                "statistics": statistics,
                "costUSD": (status.get("cost") or {}).get("totalUSD"),
            },
        },
        "plan": {
            "name": "plan",
            "steps": [{"solver": "nodus.agent", "params": {"agent": (group.get("spec") or {}).get("agent")}}],
            "config": {},
        },
        "results": {
            "total_samples": len(records),
            "completed_samples": scored,
            "scores": [verdict, reward],
        },
        "stats": {"started_at": created, "completed_at": str(status.get("finishedAt") or "")},
    }


def head(header: dict[str, Any]) -> bytes:
    """The log's opening: the header's fields, then ``"samples": [``."""
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":"))
    return (text[:-1] + ',"samples":[').encode("utf-8")


def _messages(system: str | None, said: Sequence[Utterance]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    functions: dict[str, str] = {}
    for turn in said:
        if turn.said is Said.USER:
            messages.append({"role": "user", "content": turn.text, "source": "input"})
            continue
        if turn.said in (Said.MODEL, Said.ACTION):
            calls = [
                {"id": use.id, "function": use.name, "arguments": use.arguments, "type": "function"}
                for use in turn.tool_uses
            ]
            functions.update({use.id: use.name for use in turn.tool_uses})
            messages.append(
                {
                    "role": "assistant",
                    "content": turn.text,
                    "tool_calls": calls or None,
                    "model": turn.model,
                    "source": "generate",
                }
            )
        for output in turn.outputs:
            messages.append(
                {
                    "role": "tool",
                    "content": output.content,
                    "tool_call_id": output.call_id,
                    "function": functions.get(output.call_id),
                }
            )
    return messages


def _usage(turns: Sequence[Utterance]) -> dict[str, dict[str, Any]]:
    by_model: dict[str, dict[str, Any]] = {}
    for turn in turns:
        usage = by_model.setdefault(
            turn.model or "unknown",
            {
                "input_tokens": 0,
                "output_tokens": 0,
                "total_tokens": 0,
                "input_tokens_cache_read": 0,
                "input_tokens_cache_write": 0,
                "total_cost": 0.0,
            },
        )
        tokens = turn.usage
        usage["input_tokens"] += tokens.get("input_tokens", 0)
        usage["output_tokens"] += tokens.get("output_tokens", 0)
        usage["input_tokens_cache_read"] += tokens.get("cache_read_input_tokens", 0)
        usage["input_tokens_cache_write"] += tokens.get("cache_creation_input_tokens", 0)
        usage["total_tokens"] = (
            usage["input_tokens"]
            + usage["output_tokens"]
            + usage["input_tokens_cache_read"]
            + usage["input_tokens_cache_write"]
        )
        usage["total_cost"] = round(usage["total_cost"] + _usd(turn.cost_usd), 9)
    return by_model


def _scores(record: dict[str, Any]) -> dict[str, Any] | None:
    if record.get("state") != "Scored":
        return None
    verdict = str(record.get("verdict") or "")
    return {
        "verdict": {
            "value": VERDICT_VALUES.get(verdict, "I"),
            "answer": verdict,
            "explanation": record.get("evidence") or "",
        },
        "reward": {"value": float(record.get("reward") or 0.0), "explanation": record.get("evidence") or ""},
    }


def eval_sample(
    record: dict[str, Any],
    run: dict[str, Any] | None,
    system: str | None,
    journal: Sequence[JournalRecord],
    redact: Redactor,
) -> dict[str, Any]:
    """One case as a sample; ``run`` is None when the case's run is gone (deleted)."""
    status = (run or {}).get("status") or {}
    said = transcript(journal)
    turns = [turn for turn in said if turn.said is Said.MODEL]
    last = turns[-1] if turns else None
    output: dict[str, Any] = {"model": last.model if last else "", "choices": [], "completion": ""}
    if last is not None:
        message = _messages(None, [last])[0]
        output["choices"] = [
            {"message": message, "stop_reason": _STOP_REASONS.get(str(last.stop_reason), "unknown")}
        ]
        output["completion"] = last.text
    state = str(record.get("state"))
    sample: dict[str, Any] = {
        "id": str(record.get("taskId")),
        "epoch": int(record.get("repetition") or 1),
        "input": str(((run or {}).get("spec") or {}).get("input") or ""),
        "target": "",
        "messages": _messages(system, said),
        "output": output,
        "scores": _scores(record),
        "metadata": {
            "run": record.get("run"),
            "state": state,
            "reason": record.get("reason"),
            "phase": status.get("phase"),
            "costUSD": (status.get("cost") or {}).get("billedUSD"),
        },
        "model_usage": _usage(turns),
        "started_at": status.get("startedAt"),
        "completed_at": status.get("finishedAt") or record.get("finishedAt"),
        "total_time": _seconds(status.get("startedAt"), status.get("finishedAt")),
        "uuid": str(((run or {}).get("metadata") or {}).get("uid") or record.get("run")),
    }
    if state in UNSCORED_STATES:
        sample["error"] = {
            "message": f"{state}: {record.get('evidence') or record.get('reason') or ''}".rstrip(": "),
            "traceback": "",
            "traceback_ansi": "",
        }
    masked: dict[str, Any] = redact.tree({k: v for k, v in sample.items() if v is not None})
    return masked


def model_of(runs: Sequence[dict[str, Any] | None]) -> str:
    """The model the evaluation's runs used (their first turn's), for the log's ``eval.model``."""
    for run in runs:
        for turn in ((run or {}).get("status") or {}).get("turns") or []:
            if turn.get("model"):
                return f"anthropic/{turn['model']}"
    return "nodus/unknown"
