"""Reading a Messages conversation, and what its content costs in (estimated) tokens.

The offline model decides only from ``request.messages``; these helpers find the latest prompt,
the tool results that answer it, and keep an answer within ``max_tokens`` (4 characters each).
"""

from __future__ import annotations

import json
import math
from typing import Any

from nodus_ray.models.base import ModelRequest

__all__ = [
    "_content_chars",
    "_fit_to_budget",
    "_is_prompt",
    "_latest_tool_results",
    "_prompt_text",
    "_request_chars",
    "_text_block",
    "_tokens",
    "_tool_result_text",
    "_tool_uses",
]

_CHARS_PER_TOKEN = 4


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Content as a list of blocks; a plain string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def _is_prompt(message: dict[str, Any]) -> bool:
    """A user message a person wrote, as opposed to one carrying tool results."""
    if message.get("role") != "user":
        return False
    return not any(block.get("type") == "tool_result" for block in _blocks(message.get("content")))


def _prompt_text(message: dict[str, Any]) -> str:
    blocks = _blocks(message.get("content"))
    return "\n".join(str(block.get("text", "")) for block in blocks if block.get("type") == "text")


def _tool_result_text(block: dict[str, Any]) -> str:
    """The text of a ``tool_result``: a string, or a list of text blocks joined by newlines."""
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in _blocks(content) if part.get("type") == "text")


def _latest_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks of the most recent user message that has any."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        results = [b for b in _blocks(message.get("content")) if b.get("type") == "tool_result"]
        if results:
            return results
    return []


def _tool_uses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        block
        for message in messages
        if message.get("role") == "assistant"
        for block in _blocks(message.get("content"))
        if block.get("type") == "tool_use"
    ]


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _tokens(chars: int) -> int:
    return math.ceil(chars / _CHARS_PER_TOKEN)


def _json_chars(value: Any) -> int:
    return len(json.dumps(value, sort_keys=True, default=str))


def _content_chars(content: Any) -> int:
    """Characters a model would read or write for this content (tool inputs as JSON)."""
    total = 0
    for block in _blocks(content):
        kind = block.get("type")
        if kind == "text":
            total += len(str(block.get("text", "")))
        elif kind == "tool_use":
            total += _json_chars(block.get("input", {}))
        elif kind == "tool_result":
            total += len(_tool_result_text(block))
        else:
            total += _json_chars(block)
    return total


def _request_chars(request: ModelRequest) -> int:
    messages = sum(_content_chars(message.get("content")) for message in request.messages or [])
    tools = _json_chars(request.tools) if request.tools else 0
    return len(request.system or "") + messages + tools


def _fit_to_budget(content: list[dict[str, Any]], max_tokens: int) -> tuple[list[dict[str, Any]], bool]:
    """Keep what fits in ``max_tokens`` (4 chars each): cut text, drop tool calls that do not fit."""
    budget = max(0, int(max_tokens)) * _CHARS_PER_TOKEN
    kept: list[dict[str, Any]] = []
    for block in content:
        cost = _content_chars([block])
        if cost <= budget:
            kept.append(block)
            budget -= cost
            continue
        if block.get("type") == "text" and budget > 0:
            kept.append(_text_block(block["text"][:budget]))
        return kept, True
    return kept, False
