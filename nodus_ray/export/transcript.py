"""A run's journal read as a transcript: what was said and done, in order.

Both trajectory formats (`atif`, `inspect_log`) are this sequence shaped differently, so it is
read once, here. Two kinds of run journal it:

* A Claude conversation journals its messages (records of kind ``message``; an assistant's
  refers to its model step's result, ``contentOf``): the transcript follows the messages, and
  each tool result is joined to its command step (exit code, duration) by the tool call's id.
* A Python program journals steps only: a model call (kind ``model``) is the model's turn, a
  message it read (``inbox``) a user's, and every other step an action of the program with its
  result as the observation.

Routing, the sandbox and charges are bookkeeping, not conversation: they are left out here and
counted in the run's totals by the builders.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from nodus_ray.durable.journal_log import JournalRecord
from nodus_ray.durable.steps import message_content
from nodus_ray.store.timestamps import format_timestamp

__all__ = ["Said", "ToolUse", "ToolOutput", "Utterance", "transcript", "BOOKKEEPING_KINDS"]

# Steps that are the machinery of a run, not what it said or did.
BOOKKEEPING_KINDS = frozenset({"sandbox", "route", "charge", "message"})


class Said(StrEnum):
    """Who an utterance is from: a user's message, the model's turn, the tools' results for the
    model's last turn, or an action a program took (a step with its result)."""

    USER = "user"
    MODEL = "model"
    TOOL_RESULTS = "tool_results"
    ACTION = "action"


@dataclass(frozen=True)
class ToolUse:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolOutput:
    call_id: str
    content: str
    is_error: bool = False
    detail: dict[str, Any] = field(default_factory=dict)  # the command step: exit code, duration


@dataclass(frozen=True)
class Utterance:
    said: Said
    text: str = ""
    at: str | None = None
    step: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: str = "0"
    tool_uses: tuple[ToolUse, ...] = ()
    outputs: tuple[ToolOutput, ...] = ()


def _at(moment: datetime | None) -> str | None:
    return format_timestamp(moment) if moment else None


def _text(content: Any) -> str:
    """The text of a message's content: a string, or its ``text`` blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"]
        return "\n".join(part for part in parts if part)
    return ""


def _tool_uses(content: Any) -> tuple[ToolUse, ...]:
    if not isinstance(content, list):
        return ()
    uses = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            arguments = block.get("input")
            uses.append(
                ToolUse(
                    id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    arguments=arguments if isinstance(arguments, dict) else {"input": arguments},
                )
            )
    return tuple(uses)


def _usage(result: dict[str, Any]) -> dict[str, int]:
    usage = result.get("usage")
    return {k: int(v or 0) for k, v in usage.items()} if isinstance(usage, dict) else {}


def _command_detail(record: JournalRecord) -> dict[str, Any]:
    payload = record.payload if isinstance(record.payload, dict) else {}
    result = payload.get("result") if isinstance(payload.get("result"), dict) else {}
    assert isinstance(result, dict)
    detail: dict[str, Any] = {"step": record.step_id, "state": record.state, "finishedAt": _at(record.at)}
    for source, name in (
        ("exit_code", "exitCode"),
        ("duration_seconds", "durationSeconds"),
        ("timed_out", "timedOut"),
        ("truncated", "truncated"),
        ("limit", "limit"),
        ("cpuSeconds", "cpuSeconds"),
        ("sandboxUSD", "sandboxUSD"),
    ):
        if source in result:
            detail[name] = result[source]
    return detail


def _commands_by_call(last: dict[str, JournalRecord]) -> dict[str, dict[str, Any]]:
    """Each tool call id of a conversation -> its command step's detail. A model step
    ``turn-N/model-C`` asks for its tool calls in order; the P-th is step ``turn-N/command-C-P``."""
    found: dict[str, dict[str, Any]] = {}
    for step_id, record in last.items():
        turn, _, model = step_id.rpartition("/")
        if record.kind != "model" or not model.startswith("model-"):
            continue
        payload = record.payload if isinstance(record.payload, dict) else {}
        result = payload.get("result") if isinstance(payload.get("result"), dict) else None
        if result is None:
            continue
        call = model.removeprefix("model-")
        for position, use in enumerate(_tool_uses(result.get("content")), start=1):
            command = last.get(f"{turn}/command-{call}-{position}" if turn else f"command-{call}-{position}")
            if command is not None:
                found[use.id] = _command_detail(command)
    return found


def _outputs(content: Any, commands: dict[str, dict[str, Any]]) -> tuple[ToolOutput, ...]:
    outputs = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            call_id = str(block.get("tool_use_id", ""))
            text = block.get("content")
            outputs.append(
                ToolOutput(
                    call_id=call_id,
                    content=text if isinstance(text, str) else _text(text),
                    is_error=bool(block.get("is_error")),
                    detail=commands.get(call_id, {}),
                )
            )
    return tuple(outputs)


def _model_turn(record: JournalRecord) -> Utterance | None:
    payload = record.payload if isinstance(record.payload, dict) else {}
    result = payload.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("content"), list):
        return None
    return Utterance(
        said=Said.MODEL,
        text=_text(result["content"]),
        at=_at(record.at),
        step=record.step_id,
        model=str(result.get("model") or "") or None,
        stop_reason=result.get("stop_reason"),
        usage=_usage(result),
        cost_usd=record.cost_usd or "0",
        tool_uses=_tool_uses(result["content"]),
    )


def _conversation(records: Sequence[JournalRecord], last: dict[str, JournalRecord]) -> list[Utterance]:
    commands = _commands_by_call(last)
    said: list[Utterance] = []
    for record in records:
        if record.kind != "message":
            continue
        message = message_content(record.payload, last)
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if message.get("role") == "assistant":
            source = (
                last.get(str(record.payload.get("contentOf", "")))
                if isinstance(record.payload, dict)
                else None
            )
            turn = _model_turn(source) if source is not None else None
            said.append(turn or Utterance(said=Said.MODEL, text=_text(content), at=_at(record.at)))
        elif isinstance(content, list):
            said.append(
                Utterance(said=Said.TOOL_RESULTS, at=_at(record.at), outputs=_outputs(content, commands))
            )
        else:
            said.append(Utterance(said=Said.USER, text=_text(content), at=_at(record.at)))
    return said


def _program(records: Sequence[JournalRecord], last: dict[str, JournalRecord]) -> list[Utterance]:
    said: list[Utterance] = []
    first: dict[str, JournalRecord] = {}
    for record in records:
        first.setdefault(record.step_id, record)
    for step_id, opened in first.items():
        record = last[step_id]
        if record.kind in BOOKKEEPING_KINDS or record.state == "Started":
            continue
        payload = record.payload if isinstance(record.payload, dict) else {}
        result = payload.get("result")
        if record.kind == "model" and (turn := _model_turn(record)) is not None:
            said.append(turn)
            continue
        if record.kind == "inbox" and isinstance(result, dict) and isinstance(result.get("payload"), str):
            said.append(Utterance(said=Said.USER, text=result["payload"], at=_at(record.at), step=step_id))
            continue
        started = opened.payload if opened.state == "Started" and isinstance(opened.payload, dict) else {}
        failed = record.state == "Failed"
        shown = payload.get("error") if failed else result
        use = ToolUse(id=step_id, name=record.kind, arguments=dict(started))
        output = ToolOutput(
            call_id=step_id,
            content=shown if isinstance(shown, str) else json.dumps(shown, separators=(",", ":")),
            is_error=failed,
            detail={"step": step_id, "state": record.state, "attempt": record.attempt},
        )
        said.append(
            Utterance(
                said=Said.ACTION,
                text=str(payload.get("summary") or f"{record.kind} {step_id}"),
                at=_at(record.at),
                step=step_id,
                cost_usd=record.cost_usd or "0",
                tool_uses=(use,),
                outputs=(output,),
            )
        )
    return said


def transcript(records: Sequence[JournalRecord]) -> list[Utterance]:
    """The run's utterances in journal order (a conversation's by its messages, a program's by
    its steps); a step's last record is its outcome."""
    last: dict[str, JournalRecord] = {}
    for record in records:
        last[record.step_id] = record
    if any(record.kind == "message" for record in records):
        return _conversation(records, last)
    return _program(records, last)
