"""Load shedding: past a set number of requests in flight, answer 429 at once.

A replica that takes every request queues them behind the control plane, one actor, and under a
burst every client waits longer and longer until all of them time out. Refusing the excess at
once with ``429`` and ``Retry-After`` keeps the requests it did take fast, and tells clients
exactly what to do; a refused request did nothing, so repeating it is always safe (the SDK
does). Long-lived streams (``/events``), health checks and the console page are not counted:
a watcher must not take the place of a write.

The limit is ``NODUS_API_MAX_INFLIGHT`` (default 128) per API replica, read where the app is
built (`nodus up`).
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["LoadShedder", "DEFAULT_MAX_INFLIGHT", "max_inflight_from_env"]

DEFAULT_MAX_INFLIGHT = 128
_RETRY_AFTER_SECONDS = 1
_UNCOUNTED_SUFFIXES = ("/events", "/healthz", "/readyz", "/console")

Scope = dict[str, Any]


def max_inflight_from_env() -> int:
    raw = os.environ.get("NODUS_API_MAX_INFLIGHT", "")
    if not raw:
        return DEFAULT_MAX_INFLIGHT
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"NODUS_API_MAX_INFLIGHT={raw!r} must be a whole number of requests") from None
    if value < 1:
        raise ValueError(f"NODUS_API_MAX_INFLIGHT={raw!r} must be at least 1")
    return value


class LoadShedder:
    """ASGI middleware: at most ``limit`` counted requests at once; the rest get 429."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].endswith(_UNCOUNTED_SUFFIXES):
            await self.app(scope, receive, send)
            return
        if self.inflight >= self.limit:
            await self._refuse(send)
            return
        self.inflight += 1  # one event loop per replica: no lock needed between check and count
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(
            {
                "code": "TooManyRequests",
                "message": f"the API has {self.limit} requests in flight, its limit; nothing was done: retry after "
                f"{_RETRY_AFTER_SECONDS} s",
                "details": {"limit": self.limit, "retryAfter": _RETRY_AFTER_SECONDS},
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"retry-after", str(_RETRY_AFTER_SECONDS).encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
