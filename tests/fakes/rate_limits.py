"""The rate limits the fake Messages API enforces, as the real API does, per key.

The API limits each key's requests (RPM), input tokens (ITPM: uncached input, i.e.
``input_tokens + cache_creation_input_tokens``; cache reads do not count) and output tokens
(OTPM) per minute, with token buckets that refill continuously. It may enforce them over
intervals shorter than a minute (60 RPM as one a second), which ``window_seconds`` models: a
bucket holds that many seconds of its budget (60: the whole minute, as documented; the rate
limit benchmark uses a short window, the strict case). Over a limit it answers 429
``rate_limit_error`` with ``retry-after`` (whole seconds until the call would fit) and the
``anthropic-ratelimit-*`` headers, and counts nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["FakeRateLimit", "RateLimitRefusal"]

_HEADER_NAMES = {"rpm": "requests", "itpm": "input-tokens", "otpm": "output-tokens"}


@dataclass(frozen=True)
class RateLimitRefusal:
    """Why a call was refused: the limit it passed and the headers of the 429."""

    limit: str
    headers: dict[str, str]


@dataclass
class _Bucket:
    per_second: float
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.per_second)
        self.at = now


@dataclass
class FakeRateLimit:
    """Per-key buckets; `admit` debits a call or says why it is refused. Thread-safe."""

    rpm: float | None = None
    itpm: float | None = None
    otpm: float | None = None
    window_seconds: float = 60.0
    _keys: dict[str, dict[str, _Bucket]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _limits(self) -> dict[str, float]:
        return {name: value for name in ("rpm", "itpm", "otpm") if (value := getattr(self, name)) is not None}

    def _buckets(self, key: str, now: float) -> dict[str, _Bucket]:
        if key not in self._keys:
            self._keys[key] = {}
            for name, per_minute in self._limits().items():
                capacity = max(1.0, per_minute * self.window_seconds / 60.0)
                self._keys[key][name] = _Bucket(per_minute / 60.0, capacity, capacity, now)
        return self._keys[key]

    def admit(self, key: str, usage: Mapping[str, int]) -> RateLimitRefusal | None:
        """Count the call against ``key``'s budgets, or refuse it (counting nothing)."""
        costs = {
            "rpm": 1.0,
            "itpm": float(usage.get("input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)),
            "otpm": float(usage.get("output_tokens", 0)),
        }
        with self._lock:
            now = time.monotonic()
            buckets = self._buckets(key, now)
            for bucket in buckets.values():
                bucket.refill(now)
            short = {
                name: (min(costs[name], bucket.capacity) - bucket.level) / bucket.per_second
                for name, bucket in buckets.items()
                if bucket.level < min(costs[name], bucket.capacity)
            }
            if short:
                limit = max(short, key=lambda name: short[name])
                wait = max(1, math.ceil(short[limit]))
                return RateLimitRefusal(limit, self._headers(buckets, now, retry_after=wait))
            for name, bucket in buckets.items():
                bucket.level -= costs[name]
            return None

    def _headers(self, buckets: dict[str, _Bucket], now: float, *, retry_after: int) -> dict[str, str]:
        headers = {"retry-after": str(retry_after)}
        for name, bucket in buckets.items():
            word = _HEADER_NAMES[name]
            headers[f"anthropic-ratelimit-{word}-limit"] = f"{bucket.per_second * 60:g}"
            headers[f"anthropic-ratelimit-{word}-remaining"] = str(max(0, int(bucket.level)))
            refill = max(0.0, bucket.capacity - bucket.level) / bucket.per_second
            headers[f"anthropic-ratelimit-{word}-reset"] = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + refill)
            )
        return headers


# The integration session's server limits this (fake) key's haiku calls, and only it
# (tests/integration/conftest.py sets NODUS_RATE_LIMITS; test_rate_limits uses the key): every
# other test's key is unlimited. 30 a minute is one call every 2 s: a handful of runs wait.
SESSION_RATE_LIMITED_KEY = "sk-ant-session-rate-limited-0000000000000001"
SESSION_RATE_LIMIT_RPM = 30


def session_rate_limits() -> str:
    """``NODUS_RATE_LIMITS`` of the integration session: one key's haiku, by its fingerprint."""
    import hashlib

    fingerprint = hashlib.sha256(SESSION_RATE_LIMITED_KEY.encode()).hexdigest()[:16]
    return f"{fingerprint}/haiku=rpm:{SESSION_RATE_LIMIT_RPM}"
