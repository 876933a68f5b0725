"""A fake control-plane handle for tests of Serve's app and the client, without Ray.

Tests' fakes answer ``call(method, *args)``; :class:`CallHandle` makes one look like a Ray
actor handle (``handle.get_run.remote(project, name)`` awaits ``call("get_run", project,
name)``), so the real :class:`ControlPlaneClient` with its real policy sits in between.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nodus_ray.control.client import CallPolicy, ControlPlaneClient, FailFast

__all__ = ["Call", "CallHandle", "client_over"]

Call = Callable[..., Awaitable[Any]]


class _Method:
    def __init__(self, call: Call, name: str) -> None:
        self._call = call
        self._name = name

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self._call(self._name, *args)


class CallHandle:
    """``handle.<method>.remote(*args)`` is ``call("<method>", *args)``."""

    def __init__(self, call: Call) -> None:
        self._call = call

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self._call, name)


def client_over(call: Call, policy: CallPolicy | None = None) -> ControlPlaneClient:
    """The real client (Serve's policy unless told) over a fake's ``call``."""
    handle = CallHandle(call)
    return ControlPlaneClient(policy or FailFast(), locate=lambda: handle)
