"""A run as an ATIF trajectory: the Agent Trajectory Interchange Format of Harbor (RFC 0001).

One JSON document: ``schema_version``, ``session_id`` (the run's uid), ``agent`` (name,
version, model), ``steps`` numbered from 1, and ``final_metrics``. What maps to what:

* the agent's system prompt is a ``system`` step; each user message (the input, a keep-alive
  run's next message, a program's inbox) a ``user`` step;
* each model turn an ``agent`` step: its text, its ``tool_calls`` (id, function name,
  arguments), ``metrics`` (prompt tokens counting cached ones, completion tokens, cached tokens,
  the call's billed ``cost_usd``) and ``llm_call_count: 1``; the commands' results the model got
  back are that step's ``observation`` (``source_call_id`` is the tool call's id; ``extra``
  holds the command step, exit code and duration);
* a Python program's other steps (spawn, gather, wait, ...) are ``agent`` steps with
  ``llm_call_count: 0``, the step as the tool call and its result as the observation;
* a run that failed or was cancelled ends with a ``system`` step saying so.

``final_metrics.total_cost_usd`` is what the run was billed (model, routing and sandbox,
``status.cost.billedUSD``); ``extra`` splits it. Fields are only those of ATIF-v1.7, whose
models forbid any other (``extra`` is where ours go).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from nodus.lifecycle import RunPhase
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.journal_log import JournalRecord
from nodus_ray.export.transcript import Said, Utterance, transcript

__all__ = ["ATIF_SCHEMA_VERSION", "trajectory"]

ATIF_SCHEMA_VERSION = "ATIF-v1.7"
_ENDED_BADLY = {RunPhase.FAILED.value, RunPhase.CANCELLED.value}


def _usd(value: Any) -> float:
    try:
        return float(Decimal(str(value or "0")))
    except (InvalidOperation, ValueError):
        return 0.0


def _metrics(turn: Utterance) -> dict[str, Any]:
    usage = turn.usage
    cached = usage.get("cache_read_input_tokens", 0)
    written = usage.get("cache_creation_input_tokens", 0)
    metrics: dict[str, Any] = {
        # ATIF's prompt_tokens include cached ones; Anthropic's input_tokens count neither kind.
        "prompt_tokens": usage.get("input_tokens", 0) + cached + written,
        "completion_tokens": usage.get("output_tokens", 0),
        "cached_tokens": cached,
        "cost_usd": _usd(turn.cost_usd),
    }
    if written:
        metrics["extra"] = {"cache_creation_tokens": written}
    return metrics


def _agent_step(turn: Utterance) -> dict[str, Any]:
    step: dict[str, Any] = {"source": "agent", "message": turn.text}
    if turn.at:
        step["timestamp"] = turn.at
    if turn.said is Said.MODEL:
        if turn.model:
            step["model_name"] = turn.model
        step["metrics"] = _metrics(turn)
        step["llm_call_count"] = 1
        step["extra"] = {"step": turn.step, "stop_reason": turn.stop_reason}
    else:  # a program's own step: no model call
        step["llm_call_count"] = 0
        step["extra"] = {"step": turn.step, "cost_usd": _usd(turn.cost_usd)}
    if turn.tool_uses:
        step["tool_calls"] = [
            {"tool_call_id": use.id, "function_name": use.name, "arguments": use.arguments}
            for use in turn.tool_uses
        ]
    if turn.outputs:
        step["observation"] = {"results": [_result(output) for output in turn.outputs]}
    return step


def _result(output: Any, known: set[str] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"content": output.content}
    if known is None or output.call_id in known:
        result["source_call_id"] = output.call_id
    extra = dict(output.detail)
    if output.is_error:
        extra["is_error"] = True
    if extra:
        result["extra"] = extra
    return result


def _observe(steps: list[dict[str, Any]], turn: Utterance) -> None:
    """Tool results belong to the agent step that asked for them (ATIF checks each
    ``source_call_id`` against that step's ``tool_calls``)."""
    asking = steps[-1] if steps and steps[-1]["source"] == "agent" else None
    if asking is None:
        results = [_result(output, set()) for output in turn.outputs]
        steps.append({"source": "system", "message": "tool results", "observation": {"results": results}})
        return
    known = {call["tool_call_id"] for call in asking.get("tool_calls", [])}
    observation = asking.setdefault("observation", {"results": []})
    observation["results"].extend(_result(output, known) for output in turn.outputs)


def trajectory(
    run: dict[str, Any],
    agent_spec: dict[str, Any],
    records: Sequence[JournalRecord],
    redact: Redactor,
) -> dict[str, Any]:
    """The run's ATIF document, every string masked by ``redact``."""
    status = run.get("status") or {}
    spec = run.get("spec") or {}
    metadata = run.get("metadata") or {}
    steps: list[dict[str, Any]] = []
    if agent_spec.get("system"):
        steps.append({"source": "system", "message": str(agent_spec["system"])})
    said = transcript(records)
    if not any(turn.said is Said.USER for turn in said) and spec.get("input"):
        steps.append({"source": "user", "message": str(spec["input"])})  # a program's input
    for turn in said:
        if turn.said is Said.USER:
            steps.append(
                {"source": "user", "message": turn.text, **({"timestamp": turn.at} if turn.at else {})}
            )
        elif turn.said is Said.TOOL_RESULTS:
            _observe(steps, turn)
        else:
            steps.append(_agent_step(turn))
    phase = status.get("phase")
    if phase in _ENDED_BADLY:
        ended = f"the run ended {phase} ({status.get('reason')}): {status.get('message') or ''}".rstrip(": ")
        steps.append({"source": "system", "message": ended, **_when(status.get("finishedAt"))})
    if not steps:
        steps.append({"source": "user", "message": str(spec.get("input") or "")})
    for number, step in enumerate(steps, start=1):
        step["step_id"] = number
    turns = [turn for turn in said if turn.said is Said.MODEL]
    models = [turn.model for turn in turns if turn.model]
    cost = status.get("cost") or {}
    routing = sum((Decimal(r.cost_usd or "0") for r in records if r.kind == "route"), Decimal(0))
    model_spec = agent_spec.get("model") or {}
    document = {
        "schema_version": ATIF_SCHEMA_VERSION,
        "session_id": str(metadata.get("uid") or metadata.get("name") or ""),
        "trajectory_id": str(metadata.get("name") or ""),
        "agent": {
            "name": str(spec.get("agent") or ""),
            "version": f"revision {status.get('agentRevision') or 0}",
            "model_name": models[0] if models else model_spec.get("name"),
            "extra": {"framework": "nodus-ray", "families": agent_spec.get("families")},
        },
        "steps": [_ordered(step) for step in steps],
        "notes": (
            "Exported by nodus-ray from the run's journal. Secret values are masked as "
            "[REDACTED:<secret>/<key>]; routing and sandbox costs are in final_metrics.extra."
        ),
        "final_metrics": {
            "total_prompt_tokens": sum(_metrics(t)["prompt_tokens"] for t in turns),
            "total_completion_tokens": sum(_metrics(t)["completion_tokens"] for t in turns),
            "total_cached_tokens": sum(_metrics(t)["cached_tokens"] for t in turns),
            "total_cost_usd": _usd(cost.get("billedUSD") or cost.get("totalUSD")),
            "total_steps": len(steps),
            "extra": {
                "model_usd": str(cost.get("modelUSD") or cost.get("totalUSD") or "0"),
                "routing_usd": str(routing),
                "sandbox_usd": str(cost.get("sandboxUSD") or "0"),
                "billed_usd": str(cost.get("billedUSD") or "0"),
            },
        },
        "extra": {
            "project": metadata.get("project"),
            "run": metadata.get("name"),
            "phase": phase,
            "reason": status.get("reason"),
            "group": spec.get("group"),
            "created_at": metadata.get("creationTimestamp"),
            "finished_at": status.get("finishedAt"),
        },
    }
    masked: dict[str, Any] = redact.tree(document)
    return masked


def _when(at: Any) -> dict[str, Any]:
    return {"timestamp": str(at)} if at else {}


def _ordered(step: dict[str, Any]) -> dict[str, Any]:
    """``step_id`` first, as the RFC's examples read."""
    return {"step_id": step["step_id"], **{k: v for k, v in step.items() if k != "step_id"}}
