"""When a failed delivery is tried again: a schedule of delays with jitter, bounded in all.

The default (``5s,30s,2m,10m,1h,3h,6h``: eight attempts over about ten hours) is the shape
Svix and Stripe use, growing roughly exponentially so a receiver that is down for a deploy gets
its events within seconds and one down for an afternoon still gets them. Each delay is spread by
+/-20% so the retries of many events that failed together do not arrive together.
``NODUS_WEBHOOK_RETRY_SCHEDULE`` sets another (tests use fractions of a second).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nodus.durations import parse_timeout

__all__ = ["RETRY_SCHEDULE_ENV", "DEFAULT_RETRY_SCHEDULE", "RetrySchedule"]

RETRY_SCHEDULE_ENV = "NODUS_WEBHOOK_RETRY_SCHEDULE"
DEFAULT_RETRY_SCHEDULE = "5s,30s,2m,10m,1h,3h,6h"
_MAX_RETRIES = 20
_MAX_DELAY_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class RetrySchedule:
    """``delays[i]``: seconds between attempt ``i + 1`` and attempt ``i + 2``."""

    delays: tuple[float, ...]
    jitter: float = 0.2

    @classmethod
    def parse(cls, text: str | None) -> RetrySchedule:
        """Comma-separated durations (``5s,30s,2m``); ValueError names a bad entry."""
        value = (text or "").strip() or DEFAULT_RETRY_SCHEDULE
        delays: list[float] = []
        for part in value.split(","):
            part = part.strip()
            try:
                seconds = parse_timeout(part)
            except ValueError:
                seconds = -1.0
            if not 0 < seconds <= _MAX_DELAY_SECONDS:
                raise ValueError(
                    f"{RETRY_SCHEDULE_ENV}: {part!r} is not a duration from 1ms to 24h "
                    "(write delays such as 5s,30s,2m,10m,1h separated by commas)"
                )
            delays.append(seconds)
        if len(delays) > _MAX_RETRIES:
            raise ValueError(f"{RETRY_SCHEDULE_ENV}: at most {_MAX_RETRIES} retries, not {len(delays)}")
        return cls(tuple(delays))

    @property
    def attempts(self) -> int:
        """Attempts in all: the first and one per delay."""
        return 1 + len(self.delays)

    def delay_after(self, attempt: int, rng: random.Random | None = None) -> float | None:
        """Seconds to wait after failed attempt ``attempt`` (from 1), jittered; None: give up."""
        if not 1 <= attempt <= len(self.delays):
            return None
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return self.delays[attempt - 1] * (1.0 + spread)

    def text(self) -> str:
        return ",".join(f"{delay:g}s" for delay in self.delays)
