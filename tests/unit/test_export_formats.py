"""The export builders (`nodus_ray.export`): ATIF, journal JSONL, Inspect's eval log, case rows.

Journals here are written the way a run writes them (a Claude conversation's records as the
hello example journals them; a Python program's steps), and each export is checked against what
its consumer reads (`tests.support.export_checks`) and for secret values left in it.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from nodus.errors import Invalid
from nodus.export_formats import evaluation_export_format, run_export_format
from nodus_ray.core.redaction import Redactor
from nodus_ray.durable.journal_log import JournalRecord
from nodus_ray.export.atif import ATIF_SCHEMA_VERSION, trajectory
from nodus_ray.export.case_table import case_lines, cases_parquet
from nodus_ray.export.inspect_log import TAIL, eval_header, eval_sample, head
from nodus_ray.export.journal_jsonl import journal_lines
from nodus_ray.export.transcript import Said, transcript
from tests.support.export_checks import check_atif, check_inspect_log, read_with_inspect

SECRET = "sk-live-4f9a2c7e1b"
_T0 = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def _records(entries: list[tuple[str, str, str, Any, str]]) -> list[JournalRecord]:
    return [
        JournalRecord(seq, step, kind, state, 1, payload, cost, _T0 + timedelta(seconds=seq))
        for seq, (step, kind, state, payload, cost) in enumerate(entries)
    ]


def _model(text: str, uses: list[dict[str, Any]], stop: str, tokens: tuple[int, int, int]) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}, *uses]
    usage = {
        "input_tokens": tokens[0],
        "output_tokens": tokens[1],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": tokens[2],
    }
    return {"result": {"model": "claude-haiku-4-5", "content": content, "stop_reason": stop, "usage": usage}}


def conversation() -> list[JournalRecord]:
    """Two commands in one model call, then the answer. The second command printed a secret
    value that was journaled unmasked (written before its secret was known to the run)."""
    uses = [
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "python3 --version"}},
        {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "echo $TOKEN"}},
    ]
    results = [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": "exit code 0\nPython 3.11.2\n",
            "is_error": False,
        },
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "content": f"exit code 0\n{SECRET}\n",
            "is_error": False,
        },
    ]
    command = {"exit_code": 0, "output": "", "duration_seconds": 0.03, "timed_out": False, "truncated": False}
    return _records(
        [
            ("sandbox", "sandbox", "Completed", {"result": {"backend": "bubblewrap"}}, "0"),
            (
                "message-0",
                "message",
                "Completed",
                {"role": "user", "content": "Print the Python version"},
                "0",
            ),
            ("turn-1/route", "route", "Completed", {"result": {"family": "haiku"}}, "0.000011"),
            ("turn-1/model-1", "model", "Started", {"model": "claude-haiku-4-5"}, "0"),
            (
                "turn-1/model-1",
                "model",
                "Completed",
                _model("I will run it.", uses, "tool_use", (150, 20, 100)),
                "0.000030",
            ),
            ("message-1", "message", "Completed", {"role": "assistant", "contentOf": "turn-1/model-1"}, "0"),
            ("turn-1/command-1-1", "command", "Started", {"command": "python3 --version"}, "0"),
            ("turn-1/command-1-1", "command", "Completed", {"result": command}, "0"),
            ("turn-1/command-1-2", "command", "Started", {"command": "echo $TOKEN"}, "0"),
            ("turn-1/command-1-2", "command", "Completed", {"result": {**command, "output": SECRET}}, "0"),
            ("message-2", "message", "Completed", {"role": "user", "content": results}, "0"),
            (
                "turn-1/model-2",
                "model",
                "Completed",
                _model("It is 3.11.2.", [], "end_turn", (200, 9, 150)),
                "0.000027",
            ),
            ("message-3", "message", "Completed", {"role": "assistant", "contentOf": "turn-1/model-2"}, "0"),
        ]
    )


def program() -> list[JournalRecord]:
    """A Python program: reads a message, calls the model, spawns a child, one step failed."""
    return _records(
        [
            ("sandbox", "sandbox", "Completed", {"result": {}}, "0"),
            ("message/user-1", "inbox", "Started", {"message": "user"}, "0"),
            (
                "message/user-1",
                "inbox",
                "Completed",
                {"result": {"seq": 4, "payload": "What is 2 ** 10?"}},
                "0",
            ),
            ("model-1", "model", "Completed", _model("1024.", [], "end_turn", (4, 4, 0)), "0.000004"),
            ("spawn/map-0", "spawn", "Started", {"input": f"use {SECRET}"}, "0"),
            (
                "spawn/map-0",
                "spawn",
                "Completed",
                {"result": {"name": "child-0"}, "summary": "child child-0"},
                "0",
            ),
            ("fetch", "step", "Failed", {"error": {"message": "timed out"}, "summary": "timed out"}, "0"),
            ("charge/process-1-1", "charge", "Completed", {"result": {"sandboxUSD": "0.00001"}}, "0"),
        ]
    )


def _run(phase: str = "Succeeded", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "hello-run",
            "project": "default",
            "uid": "u-1",
            "creationTimestamp": "2026-12-03T10:00:00Z",
        },
        "spec": {"agent": "hello", "input": "Print the Python version"},
        "status": {
            "phase": phase,
            "agentRevision": 2,
            "startedAt": "2026-12-03T10:00:00Z",
            "finishedAt": "2026-12-03T10:00:12Z",
            "cost": {
                "totalUSD": "0.000068",
                "modelUSD": "0.000068",
                "sandboxUSD": "0.000002",
                "billedUSD": "0.000070",
            },
            "turns": [{"index": 1, "model": "claude-haiku-4-5"}],
            **status,
        },
    }


REDACT = Redactor({"tokens/TOKEN": SECRET})


# -- formats --------------------------------------------------------------------------------


def test_formats_not_offered_are_refused_naming_the_field_and_the_choices() -> None:
    assert run_export_format("ATIF").value == "atif"
    assert evaluation_export_format(" parquet ").value == "parquet"
    with pytest.raises(Invalid) as refused:
        run_export_format("parquet")
    assert refused.value.code == "UnsupportedFormat"
    assert refused.value.details == {"field": "format", "allowed": ["atif", "jsonl"]}
    assert "atif, jsonl" in refused.value.message
    with pytest.raises(Invalid, match="parquet, jsonl, inspect"):
        evaluation_export_format("atif")


# -- the transcript ---------------------------------------------------------------------------


def test_a_conversation_reads_as_user_model_tool_results_model_with_each_command_joined() -> None:
    said = transcript(conversation())
    assert [turn.said for turn in said] == [Said.USER, Said.MODEL, Said.TOOL_RESULTS, Said.MODEL]
    first = said[1]
    assert [use.id for use in first.tool_uses] == ["toolu_1", "toolu_2"]
    assert first.usage["input_tokens"] == 150 and first.cost_usd == "0.000030"
    outputs = said[2].outputs
    assert [o.detail["step"] for o in outputs] == ["turn-1/command-1-1", "turn-1/command-1-2"]
    assert outputs[0].detail["exitCode"] == 0 and outputs[0].detail["durationSeconds"] == 0.03


def test_a_program_reads_as_its_inbox_model_calls_and_actions() -> None:
    said = transcript(program())
    assert [turn.said for turn in said] == [Said.USER, Said.MODEL, Said.ACTION, Said.ACTION]
    spawn, failed = said[2], said[3]
    assert spawn.tool_uses[0].name == "spawn" and spawn.outputs[0].content == '{"name":"child-0"}'
    assert failed.outputs[0].is_error and "timed out" in failed.outputs[0].content


# -- ATIF -----------------------------------------------------------------------------------


def test_atif_of_a_conversation_has_its_steps_tool_calls_observations_and_metrics() -> None:
    document = trajectory(_run(), {"system": "You are careful."}, conversation(), REDACT)
    check_atif(document)
    assert document["schema_version"] == ATIF_SCHEMA_VERSION
    assert document["session_id"] == "u-1" and document["agent"]["name"] == "hello"
    steps = document["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent"]
    asking = steps[2]
    assert [c["function_name"] for c in asking["tool_calls"]] == ["bash", "bash"]
    assert asking["tool_calls"][0]["arguments"] == {"command": "python3 --version"}
    results = asking["observation"]["results"]
    assert [r["source_call_id"] for r in results] == ["toolu_1", "toolu_2"]
    assert results[0]["extra"]["exitCode"] == 0
    assert asking["metrics"] == {
        "prompt_tokens": 250,
        "completion_tokens": 20,
        "cached_tokens": 100,
        "cost_usd": 3e-05,
    }
    final = document["final_metrics"]
    assert final["total_prompt_tokens"] == 250 + 350 and final["total_completion_tokens"] == 29
    assert final["total_cached_tokens"] == 250 and final["total_steps"] == 4
    assert final["total_cost_usd"] == 7e-05 and final["extra"]["routing_usd"] == "0.000011"


def test_atif_masks_a_secret_the_journal_kept_in_every_place_it_appears() -> None:
    text = json.dumps(trajectory(_run(), {}, conversation(), REDACT))
    assert SECRET not in text
    assert "[REDACTED:tokens/TOKEN]" in text


def test_atif_of_a_program_and_of_a_failed_run() -> None:
    document = trajectory(_run("Failed", reason="ModelError", message="overloaded"), {}, program(), REDACT)
    check_atif(document)
    steps = document["steps"]
    assert [s["source"] for s in steps] == ["user", "agent", "agent", "agent", "system"]
    assert steps[1]["llm_call_count"] == 1 and steps[2]["llm_call_count"] == 0
    assert "metrics" not in steps[2]
    assert steps[2]["tool_calls"][0]["arguments"] == {"input": "use [REDACTED:tokens/TOKEN]"}
    assert steps[3]["observation"]["results"][0]["extra"]["is_error"] is True
    assert steps[-1]["message"] == "the run ended Failed (ModelError): overloaded"


def test_atif_of_a_run_that_journaled_nothing_is_its_input() -> None:
    document = trajectory(_run("Pending"), {}, [], Redactor({}))
    check_atif(document)
    assert document["steps"] == [{"step_id": 1, "source": "user", "message": "Print the Python version"}]


# -- journal JSONL --------------------------------------------------------------------------


def test_journal_jsonl_is_one_masked_record_a_line() -> None:
    data = b"".join(journal_lines(conversation(), REDACT)).decode()
    lines = data.splitlines()
    assert data.endswith("\n") and len(lines) == len(conversation())
    first = json.loads(lines[1])
    assert first == {
        "seq": 1,
        "step": "message-0",
        "kind": "message",
        "state": "Completed",
        "attempt": 1,
        "costUSD": "0",
        "at": "2026-12-03T10:00:01Z",
        "payload": {"role": "user", "content": "Print the Python version"},
    }
    assert SECRET not in data and data.count("[REDACTED:tokens/TOKEN]") == 2


# -- an evaluation: rows and Inspect's log ----------------------------------------------------

EVALUATION = {"environment": "nodus/arithmetic-v2@2.0.0", "version": "2.0.0", "split": "test", "seed": 42,
              "tasks": 2, "repetitions": 1, "cases": 2, "scored": 1, "unscored": 1, "passRate": 1.0,
              "meanReward": 1.0, "statistics": {
                  "passRate": {"value": 1.0, "standardError": 0.0, "ci95": [1.0, 1.0], "n": 1, "clusteredBy": None},
                  "meanReward": {"value": 1.0, "standardError": None, "ci95": None, "n": 1},
                  "passAtK": {"1": 1.0}, "passHatK": {"1": 1.0}}}  # fmt: skip
CASES = [
    {"taskId": "t-0", "repetition": 1, "run": "ev-t-0", "state": "Scored", "verdict": "pass", "reward": 1.0,
     "evidence": f"answer 42 matches (saw {SECRET})", "reason": None, "gradingSeconds": 0.2,
     "finishedAt": "2026-12-03T10:01:00Z"},
    {"taskId": "t-1", "repetition": 1, "run": "ev-t-1", "state": "RunFailed", "verdict": None, "reward": None,
     "evidence": "the model failed", "reason": "ModelError", "gradingSeconds": None,
     "finishedAt": "2026-12-03T10:01:00Z"},
]  # fmt: skip
GROUP = {
    "metadata": {
        "name": "ev",
        "project": "default",
        "uid": "g-1",
        "creationTimestamp": "2026-12-03T10:00:00Z",
    },
    "spec": {"agent": "hello"},
    "status": {"phase": "Succeeded", "finishedAt": "2026-12-03T10:02:00Z", "evaluation": EVALUATION},
}


def test_case_rows_as_jsonl_and_parquet_one_per_case_masked() -> None:
    lines = b"".join(case_lines("ev", EVALUATION, CASES, REDACT)).decode().splitlines()
    assert len(lines) == 2
    row = json.loads(lines[0])
    assert row["group"] == "ev" and row["environment"] == "nodus/arithmetic-v2@2.0.0" and row["seed"] == 42
    assert row["taskId"] == "t-0" and "[REDACTED:tokens/TOKEN]" in row["evidence"]
    table = pq.read_table(io.BytesIO(cases_parquet("ev", EVALUATION, CASES, REDACT)))
    assert table.num_rows == 2 and table.column("state").to_pylist() == ["Scored", "RunFailed"]
    assert SECRET not in "".join(table.column("evidence").to_pylist())


def _log(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    runs = [_run(), _run("Failed", reason="ModelError")]
    samples = [
        eval_sample(CASES[0], runs[0], "You are careful.", conversation(), REDACT),
        eval_sample(CASES[1], runs[1], None, [], REDACT),
    ]
    data = head(eval_header(GROUP, CASES, "anthropic/claude-haiku-4-5", True))
    data += b",".join(json.dumps(sample).encode() for sample in samples) + TAIL
    path = tmp_path / "ev.json"
    path.write_bytes(data)
    return json.loads(data), path


def test_inspect_log_has_the_eval_its_scores_and_a_sample_per_case(tmp_path: Path) -> None:
    log, path = _log(tmp_path)
    check_inspect_log(log)
    assert log["status"] == "success" and log["eval"]["task"] == "nodus/arithmetic-v2"
    assert log["eval"]["task_version"] == "2.0.0"
    assert log["eval"]["dataset"]["sample_ids"] == ["t-0", "t-1"] and log["eval"]["config"] == {"epochs": 1}
    verdict, reward = log["results"]["scores"]
    assert verdict["metrics"]["accuracy"]["value"] == 1.0 and verdict["metrics"]["stderr"]["value"] == 0.0
    assert verdict["metrics"]["accuracy"]["metadata"] == {"ci95": [1.0, 1.0], "n": 1}
    assert (
        verdict["metrics"]["pass_at_1"]["value"] == 1.0 and verdict["metrics"]["pass_hat_1"]["value"] == 1.0
    )
    assert reward["metrics"]["mean"]["value"] == 1.0 and "stderr" not in reward["metrics"]
    scored, failed = log["samples"]
    assert scored["scores"]["verdict"]["value"] == "C" and scored["scores"]["reward"]["value"] == 1.0
    assert scored["target"] == "" and scored["input"] == "Print the Python version"
    roles = [m["role"] for m in scored["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert scored["messages"][2]["tool_calls"][1]["id"] == "toolu_2"
    assert scored["output"]["choices"][0]["stop_reason"] == "stop"
    assert scored["model_usage"]["claude-haiku-4-5"]["input_tokens"] == 350
    assert "scores" not in failed and failed["error"]["message"] == "RunFailed: the model failed"
    assert SECRET not in path.read_text()
    read = read_with_inspect(path)  # the real reader, when an Inspect virtualenv exists
    if read is not None:
        assert read == {
            "status": "success",
            "samples": 2,
            "task": "nodus/arithmetic-v2",
            "scores": ["verdict", "reward"],
        }
