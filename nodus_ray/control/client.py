"""Calling the control plane from inside the cluster, riding out its restarts.

Run actors and group supervisors report to the control plane on every step. The control plane
is a restartable actor that reloads storage when Ray restarts it, so a caller that finds it
gone waits for it to come back instead of failing the run; only a control plane that stays
away longer than ``patience`` fails the call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.exceptions import RayActorError

from nodus_ray.settings import CONTROL_PLANE_NAME, NAMESPACE

__all__ = ["ControlPlaneCaller"]

_DEFAULT_PATIENCE_SECONDS = 120.0


class ControlPlaneCaller:
    """``await caller.ask("report", ...)``: one method call on the control plane, retried.

    The handle is looked up once, not per call: every step reports, and a lookup is a round trip
    to Ray's GCS. Only methods that are safe to repeat may be asked (every control-plane method
    actors call is: reports merge, starts and cancels are idempotent by run name).
    """

    def __init__(self, patience_seconds: float = _DEFAULT_PATIENCE_SECONDS) -> None:
        self._patience = patience_seconds
        self._handle: Any = None

    async def ask(self, method: str, *args: Any) -> Any:
        delay = 0.2
        deadline = asyncio.get_running_loop().time() + self._patience
        while True:
            try:
                if self._handle is None:
                    self._handle = ray.get_actor(CONTROL_PLANE_NAME, namespace=NAMESPACE)
                return await getattr(self._handle, method).remote(*args)
            except (RayActorError, ValueError):
                self._handle = None
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
