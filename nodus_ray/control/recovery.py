"""Startup recovery, once, before the control plane serves a call.

Ray restarts the control plane (``max_restarts``) while run actors, group supervisors and the
Serve app keep calling it. Those calls must not see a half-loaded control plane (a
``start_member`` that found no run would hold its admitted place forever), so every call of
the facade passes through one `RecoveryGate`: the first one starts recovery (``nodus up``'s
``ready``, or whichever actor calls first after a restart), and every call waits until it has
finished. A recovery that failed is tried again by the next call.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

__all__ = ["RecoveryGate", "Gated", "after_recovery"]

P = ParamSpec("P")
T = TypeVar("T")


class RecoveryGate:
    """Runs ``recover`` once (again only after a failure) and lets callers wait for it."""

    def __init__(self, recover: Callable[[], Awaitable[None]]) -> None:
        self._recover = recover
        self._task: asyncio.Task[None] | None = None

    @property
    def recovered(self) -> bool:
        task = self._task
        return task is not None and task.done() and not task.cancelled() and task.exception() is None

    def start(self) -> asyncio.Task[None]:
        """Start recovery on the running loop unless it is under way or done."""
        task = self._task
        loop = asyncio.get_running_loop()
        failed = task is not None and task.done() and (task.cancelled() or task.exception() is not None)
        # A task started on another loop (a constructor run on a loop that is not the one that
        # serves calls) would never be awaited here: start it again on this one.
        if task is None or failed or (not task.done() and task.get_loop() is not loop):
            task = self._task = loop.create_task(self._run())
        return task

    async def _run(self) -> None:
        await self._recover()

    async def wait(self) -> None:
        """Return once recovery has finished; raise what it raised (the next call tries again)."""
        if self.recovered:
            return
        # Shielded: a caller that gives up must not cancel the recovery every caller waits for.
        await asyncio.shield(self.start())


class Gated(Protocol):
    """What `after_recovery` needs of the object whose methods it gates."""

    @property
    def recovery(self) -> RecoveryGate: ...


S = TypeVar("S", bound=Gated)


def after_recovery(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """The facade's one gate: the method runs only after startup recovery has finished."""

    async def gated(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        await self.recovery.wait()
        return await method(self, *args, **kwargs)

    # wraps keeps the name, docstring and signature Ray reads to build the actor's methods.
    wrapper = functools.wraps(method)(gated)
    wrapper.after_recovery = True  # type: ignore[attr-defined]  # what a test checks the facade by
    return cast(Callable[Concatenate[S, P], Coroutine[Any, Any, T]], wrapper)
