"""The Messages API request a `ModelRequest` becomes, with prompt-cache breakpoints.

Split from `anthropic_provider` (which sends it and reads the answer): which blocks carry
``cache_control`` is a rule of its own. The provider marks the last tool, the system prompt and
the last user block, so the next call of a conversation reads the cached prefix; the caller's
own breakpoints are kept up to the API's limit, oldest dropped first.
"""

from __future__ import annotations

import copy
from typing import Any

from nodus_ray.models.base import ModelRequest

__all__ = ["request_params"]

_MAX_CACHE_BREAKPOINTS = 4  # the API refuses a request with more blocks carrying cache_control
_EPHEMERAL: dict[str, str] = {"type": "ephemeral"}


def request_params(request: ModelRequest) -> dict[str, Any]:
    """The ``messages.create`` arguments, with cache breakpoints, on copies of the caller's data."""
    tools = copy.deepcopy(list(request.tools or []))
    messages = copy.deepcopy(list(request.messages or []))
    params: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens, "messages": messages}
    ours = 0
    if tools:
        tools[-1]["cache_control"] = dict(_EPHEMERAL)
        params["tools"] = tools
        ours += 1
    if request.system:
        params["system"] = [{"type": "text", "text": request.system, "cache_control": dict(_EPHEMERAL)}]
        ours += 1
    marked = _mark_last_user_message(messages) if len(messages) > 1 else None
    if marked is not None:
        ours += 1
    _drop_old_breakpoints(tools[:-1], messages, budget=_MAX_CACHE_BREAKPOINTS - ours, keep=marked)
    return params


def _mark_last_user_message(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Put a breakpoint on the last block of the last user message; that block, or None."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            if not content:
                return None  # an empty text block would be refused; leave the message as it is
            block: dict[str, Any] = {"type": "text", "text": content}
            messages[index] = {**message, "content": [block]}
        elif isinstance(content, list) and content and isinstance(content[-1], dict):
            block = content[-1]
        else:
            return None
        block["cache_control"] = dict(_EPHEMERAL)
        return block
    return None


def _drop_old_breakpoints(
    tools: list[Any], messages: list[dict[str, Any]], *, budget: int, keep: dict[str, Any] | None
) -> None:
    """Keep at most ``budget`` breakpoints of the caller's own, dropping the oldest first.

    Only the caller's breakpoints are candidates (the last tool's, the system prompt's and the
    last user block's are the provider's and are kept). Messages go before tools, oldest first,
    because the newest breakpoints are the ones the next call can read from.
    """
    marked = [tool for tool in tools if isinstance(tool, dict) and "cache_control" in tool]
    blocks: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            blocks.extend(b for b in content if isinstance(b, dict) and "cache_control" in b)
    blocks = [block for block in blocks if block is not keep]
    excess = len(marked) + len(blocks) - max(0, budget)
    for candidate in [*blocks, *marked]:
        if excess <= 0:
            break
        del candidate["cache_control"]
        excess -= 1
