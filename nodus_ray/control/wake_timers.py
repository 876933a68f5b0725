"""Wake timers: a parked Python run whose program sleeps (or waits with a timeout) starts again
when its ``status.wakeAt`` is due.

One asyncio timer per parked run, armed when the run parks and again at recovery (the timers
live in memory; the time they fire at lives in the run's status), never a poll: 1,000 sleeping
runs are 1,000 timer handles on the control plane's loop and no actor at all. A timer that fires
moves the run Waiting -> Running only if the run still waits for that very time (a message, a
resume or a cancel that came first leaves it as it is) and hands it to `start` (supervision),
whose new actor replays the journal up to the sleep, which is now over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from nodus.lifecycle import RunPhase, run_transition
from nodus_ray.control.registry import Key, Registry, parked, suspended
from nodus_ray.store.timestamps import parse_timestamp

__all__ = ["WakeTimers"]

logger = logging.getLogger(__name__)


class WakeTimers:
    """At most one armed timer per run, keyed by the run and the ``wakeAt`` it waits for."""

    def __init__(self, registry: Registry, start: Callable[[Key], None]) -> None:
        self._registry = registry
        self._start = start
        self._timers: dict[Key, tuple[str, asyncio.TimerHandle]] = {}
        self._waking: set[asyncio.Task[bool]] = set()
        registry.on_run_changed(self._run_changed)

    def __len__(self) -> int:
        """How many timers are armed (what a test of 1,000 sleeping runs counts)."""
        return len(self._timers)

    def arm(self, key: Key) -> None:
        """Arm the run's timer for its ``status.wakeAt`` (a no-op when it has none, or is armed
        for that time already); a timer armed for another time is replaced."""
        run = self._registry.runs.get(key)
        wake_at = run["status"].get("wakeAt") if run is not None and parked(run) else None
        armed = self._timers.get(key)
        if armed is not None and armed[0] == wake_at:
            return
        self.disarm(key)
        if not wake_at:
            return
        try:
            due = parse_timestamp(wake_at)
        except ValueError:
            logger.error("run %s/%s: status.wakeAt %r is not a time; not armed", *key, wake_at)
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, (due - datetime.now(UTC)).total_seconds())
        handle = loop.call_later(delay, self._fire, key, wake_at)
        self._timers[key] = (wake_at, handle)

    def disarm(self, key: Key) -> None:
        armed = self._timers.pop(key, None)
        if armed is not None:
            armed[1].cancel()

    async def _run_changed(self, key: Key) -> None:
        """A run that went on, or ended, before its time came needs its timer no more (a run
        that parks again is armed again after it changed, by its supervision)."""
        run = self._registry.runs.get(key)
        if run is None or not parked(run):
            self.disarm(key)

    def recover(self) -> None:
        """After a (re)start: a timer for every parked run that waits for a time."""
        for key in list(self._registry.runs):
            self.arm(key)

    def _fire(self, key: Key, wake_at: str) -> None:
        armed = self._timers.get(key)
        if armed is not None and armed[0] == wake_at:
            del self._timers[key]
        task = asyncio.get_running_loop().create_task(self.wake(key, wake_at))
        self._waking.add(task)
        task.add_done_callback(self._waking.discard)

    async def wake(self, key: Key, wake_at: str) -> bool:
        """Start the run again if it still waits for ``wake_at``; True when it was started."""
        registry = self._registry
        async with registry.locks[key]:
            run = registry.runs.get(key)
            if run is None or not parked(run) or suspended(run) or run["status"].get("wakeAt") != wake_at:
                return False  # a message, a resume, a cancel (or a new park) came first
            status = run["status"]
            status.update(run_transition(status, RunPhase.RUNNING, None, f"its timer fired ({wake_at})"))
            await registry.persist_run(key)
        await registry.run_changed(key)
        self._start(key)
        return True
