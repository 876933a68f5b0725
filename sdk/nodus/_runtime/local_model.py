"""Claude for `Agent.local` when this machine has no Anthropic key: the offline model.

A program's Claude calls are the official SDK's. With ``ANTHROPIC_API_KEY`` (or a base URL, or
an auth token) in the environment they go where the user pointed them, untouched. Without any,
the SDK would refuse to send at all, so a program that runs on a fresh server (which answers on
the offline model) would fail locally. When the server package is installed, `offline_claude`
points the SDK at a relay on loopback for the duration of the local run, answered by the same
offline model (`nodus_ray.models.offline.messages_api`); without it, nothing changes.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from .protocol import ErrorInfo, ModelCall, Outcome, Reply, Request
from .relay import ModelRelay

__all__ = ["offline_claude"]

_CONFIGURED = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL")


def _answer(respond: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Request], Reply]:
    def call(request: Request) -> Reply:
        if not isinstance(request, ModelCall):
            return Reply(Outcome.OK)
        try:
            return Reply(Outcome.RECORDED, respond(request.body))
        except Exception as error:  # noqa: BLE001 - the SDK gets it as the API's error
            return Reply(Outcome.RECORDED, error=ErrorInfo("invalid_request_error", str(error)))

    return call


@contextlib.contextmanager
def offline_claude() -> Iterator[bool]:
    """Within it, the SDK reaches the offline model unless Claude access is configured; yields
    whether it does."""
    if any(os.environ.get(name) for name in _CONFIGURED):
        yield False
        return
    try:
        module = importlib.import_module("nodus_ray.models.offline.messages_api")
    except ImportError:  # only the SDK is installed: the user's environment as it is
        yield False
        return
    key = f"nodus-local-{secrets.token_hex(12)}"
    relay = ModelRelay(_answer(module.respond), key).start()
    os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"] = relay.base_url, key
    try:
        yield True
    finally:
        os.environ.pop("ANTHROPIC_BASE_URL", None)
        os.environ.pop("ANTHROPIC_API_KEY", None)
        relay.close()
