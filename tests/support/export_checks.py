"""Checks that an export is what its consumers read, for the unit and integration tests.

ATIF: Harbor's validator (``harbor.models.trajectories``, pydantic models with
``extra="forbid"``) needs Python 3.12, and this project runs on 3.11, so its rules are checked
here as Harbor states them for ATIF-v1.7: the fields each object may have, the required ones,
``step_id`` sequential from 1, ``source`` one of system/user/agent, the agent-only fields
(model_name, reasoning, tool_calls, metrics) on agent steps only, each observation's
``source_call_id`` naming a tool call of its own step, ISO 8601 timestamps, and no metrics or
reasoning on an ``llm_call_count: 0`` step.

Inspect: ``inspect_ai`` is too heavy for the test extra (boto3, s3fs, textual, tiktoken ...), so
the key fields of its ``EvalLog`` (version 2) are checked here; `read_with_inspect` reads the
log with the real ``inspect_ai.log.read_eval_log`` when an Inspect virtualenv exists (the one
``benchmarks/vs_inspect.py`` builds), and says when it does not.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["check_atif", "check_inspect_log", "inspect_python", "read_with_inspect"]

_TRAJECTORY = {
    "schema_version", "session_id", "trajectory_id", "agent", "steps", "notes", "final_metrics",
    "continued_trajectory_ref", "extra", "subagent_trajectories",
}  # fmt: skip
_AGENT = {"name", "version", "model_name", "tool_definitions", "extra"}
_STEP = {
    "step_id", "timestamp", "source", "model_name", "reasoning_effort", "message", "reasoning_content",
    "tool_calls", "observation", "metrics", "is_copied_context", "llm_call_count", "extra",
}  # fmt: skip
_AGENT_ONLY = {"model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"}
_TOOL_CALL = {"tool_call_id", "function_name", "arguments", "extra"}
_RESULT = {"source_call_id", "content", "subagent_trajectory_ref", "extra"}
_METRICS = {
    "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "prompt_token_ids",
    "completion_token_ids", "logprobs", "extra",
}  # fmt: skip
_FINAL = {
    "total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_cost_usd",
    "total_steps", "extra",
}  # fmt: skip
_VERSIONS = {f"ATIF-v1.{minor}" for minor in range(9)}


def _only(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(obj) - allowed
    assert not unknown, f"{where}: fields ATIF forbids: {sorted(unknown)}"


def check_atif(document: dict[str, Any]) -> None:
    """Fail with the broken rule when ``document`` is not a valid ATIF-v1.7 trajectory."""
    _only(document, _TRAJECTORY, "trajectory")
    assert document["schema_version"] in _VERSIONS
    _only(document["agent"], _AGENT, "agent")
    assert isinstance(document["agent"]["name"], str) and isinstance(document["agent"]["version"], str)
    steps = document["steps"]
    assert isinstance(steps, list) and steps, "a trajectory has at least one step"
    for index, step in enumerate(steps):
        where = f"steps[{index}]"
        _only(step, _STEP, where)
        assert step["step_id"] == index + 1, f"{where}: step_id not sequential from 1"
        assert step["source"] in ("system", "user", "agent"), where
        assert isinstance(step["message"], str), where
        if "timestamp" in step:
            datetime.fromisoformat(step["timestamp"].replace("Z", "+00:00"))
        if step["source"] != "agent":
            assert not (_AGENT_ONLY & set(step)), f"{where}: agent-only fields on a {step['source']} step"
        if step.get("llm_call_count") == 0 and step["source"] == "agent":
            assert "metrics" not in step and "reasoning_content" not in step, where
        calls = set()
        for call in step.get("tool_calls") or []:
            _only(call, _TOOL_CALL, f"{where}.tool_calls")
            assert isinstance(call["tool_call_id"], str) and isinstance(call["function_name"], str)
            assert isinstance(call["arguments"], dict)
            calls.add(call["tool_call_id"])
        if "observation" in step:
            assert set(step["observation"]) == {"results"}, where
            for result in step["observation"]["results"]:
                _only(result, _RESULT, f"{where}.observation")
                if result.get("source_call_id") is not None:
                    assert result["source_call_id"] in calls, f"{where}: observation of an unknown tool call"
        if "metrics" in step:
            _only(step["metrics"], _METRICS, f"{where}.metrics")
            for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
                assert isinstance(step["metrics"].get(key, 0), int)
    if "final_metrics" in document:
        _only(document["final_metrics"], _FINAL, "final_metrics")
        assert document["final_metrics"].get("total_steps", 0) >= 0


def check_inspect_log(log: dict[str, Any]) -> None:
    """Fail when ``log`` lacks what Inspect's ``EvalLog`` (version 2) requires or types."""
    assert log["version"] == 2
    assert log["status"] in ("started", "success", "cancelled", "error")
    spec = log["eval"]
    for key in ("created", "task", "dataset", "model", "config"):
        assert key in spec, f"eval.{key} is required"
    datetime.fromisoformat(spec["created"].replace("Z", "+00:00"))
    assert isinstance(spec["dataset"], dict) and isinstance(spec["config"], dict)
    assert isinstance(log["plan"]["steps"], list)
    for score in log["results"]["scores"]:
        assert isinstance(score["name"], str) and isinstance(score["scorer"], str)
        for name, metric in score["metrics"].items():
            assert metric["name"] == name and isinstance(metric["value"], int | float)
    roles = {"system", "user", "assistant", "tool"}
    for sample in log["samples"]:
        assert isinstance(sample["id"], int | str) and isinstance(sample["epoch"], int)
        assert isinstance(sample["input"], str) and isinstance(sample["target"], str)
        for message in sample["messages"]:
            assert message["role"] in roles and isinstance(message["content"], str)
            for call in message.get("tool_calls") or []:
                assert {"id", "function", "arguments"} <= set(call)
        for score in (sample.get("scores") or {}).values():
            assert "value" in score
        if "error" in sample:
            assert {"message", "traceback", "traceback_ansi"} <= set(sample["error"])


def inspect_python() -> Path | None:
    """The Python of an Inspect virtualenv, when one exists (``NODUS_INSPECT_PYTHON``, else the
    one ``benchmarks/vs_inspect.py`` builds)."""
    named = os.environ.get("NODUS_INSPECT_PYTHON")
    candidate = (
        Path(named) if named else Path.home() / ".cache" / "nodus-bench" / "inspect-ai" / "bin" / "python"
    )
    return candidate if candidate.exists() else None


_READ = """
import json, sys
from inspect_ai.log import read_eval_log
log = read_eval_log(sys.argv[1])
print(json.dumps({"status": log.status, "samples": len(log.samples or []), "task": log.eval.task,
                  "scores": [s.name for s in (log.results.scores if log.results else [])]}))
"""


def read_with_inspect(path: Path) -> dict[str, Any] | None:
    """What ``inspect_ai.log.read_eval_log`` reads from ``path``; None when Inspect is absent."""
    python = inspect_python()
    if python is None:
        return None
    done = subprocess.run([str(python), "-c", _READ, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"inspect_ai could not read the log: {done.stderr[-2000:]}"
    read: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return read
