"""The offline model behind a Messages API request body, for a program run by `Agent.local`.

`Agent.local` runs a durable Python program in the caller's process with no server, and its
Claude calls go through the official SDK. With an Anthropic key in the environment they reach
Claude; without one (the embedded default: no keys) the SDK would refuse to send anything, so
the local runtime points it at a relay on loopback whose answers come from here: the same
offline model a server without a key runs, so a program behaves alike in both places.
"""

from __future__ import annotations

import uuid
from typing import Any

from nodus_ray.models.base import ModelRequest
from nodus_ray.models.offline.provider import OfflineProvider

__all__ = ["respond"]

_DEFAULT_MAX_TOKENS = 1024


def _system_text(system: Any) -> str:
    if isinstance(system, list):
        return "\n".join(str(block.get("text", "")) for block in system if isinstance(block, dict))
    return system if isinstance(system, str) else ""


def respond(body: dict[str, Any]) -> dict[str, Any]:
    """The Messages API response the offline model gives to ``body`` (a ``messages.create``)."""
    provider = OfflineProvider()
    asked = body.get("model") if isinstance(body.get("model"), str) else ""
    family = next((f for f in ("haiku", "sonnet", "opus", "fable") if f in str(asked)), "sonnet")
    model = provider.model_for_family(family)
    request = ModelRequest(
        model=model,
        system=_system_text(body.get("system")),
        messages=list(body.get("messages") or []),
        max_tokens=int(body.get("max_tokens") or _DEFAULT_MAX_TOKENS),
        tools=list(body.get("tools") or []),
    )
    response = provider.complete(request)
    return {
        "id": f"msg_local_{uuid.uuid4().hex[:16]}",
        "type": "message",
        "role": "assistant",
        "model": response.model,
        "content": response.content,
        "stop_reason": response.stop_reason,
        "stop_sequence": None,
        "usage": response.usage.to_dict(),
    }
