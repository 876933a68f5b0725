"""The limiter's arithmetic: token buckets that schedule calls, and adapt to 429 and 529.

One `AdaptiveBuckets` per Anthropic key and model family holds a bucket per configured budget
(requests, uncached input tokens, output tokens per minute). Why it is built this way:

* **Scheduling, not polling.** `reserve` does not answer "yes or try again": it answers *when*
  the call may go (a delay from now) and debits the buckets at that moment. Each caller then
  sleeps exactly that long, once: no caller spins, and grants come out first come, first served,
  spaced at the budget's rate (200 callers do not wake together and collide).
* **Small bursts.** A bucket holds ``BURST_SECONDS`` of its budget (at least one call's
  worth), not a whole minute: the API may enforce a per-minute limit over shorter intervals
  (60 RPM as one a second), so calls are paced evenly rather than sent in a burst.
* **Estimate, then settle.** Before a call its input tokens are estimated and its output is
  counted at ``max_tokens`` (what the API itself does for its output limit); `settle` puts the
  difference back (or takes more) once the usage is known. A bucket may go below zero; the
  calls after it wait until it refills, so the long-run rate is the budget's.
* **Adapting.** A 429 means the budget we believe in is wrong (another client on the key, a
  limit lower than configured): every bucket is emptied, nothing is granted before the
  ``retry-after`` the API sent, and the rate drops to 90% (never below 25%); 429s in a row
  compound (one drop per back-off), so a key another client shares settles below its limit.
  A 429 at the configured limit is most often a burst of our own calls arriving close
  together, and a deeper cut cost more than the refusal: at 75% (the first choice), the 20 s
  back to the full rate after each of the benchmark's few 429s left 0.90x the limit. A 529 (the
  API is overloaded, not our key) backs off exponentially (1, 2, 4 ... 30 s, or its
  ``retry-after``) and drops the rate a little. The rate recovers linearly, to the full budget
  within a minute (from 90% in 8 s) without another refusal.

Pure: no I/O, no clock (callers pass ``now``, in seconds of any monotonic clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodus_ray.core.rate_limits import RateLimit

__all__ = ["AdaptiveBuckets", "LimiterStats", "BURST_SECONDS"]

BURST_SECONDS = 1.0
MIN_FACTOR = 0.25
THROTTLED_FACTOR = 0.9  # the rate after a 429, as a fraction of the rate before it
OVERLOADED_FACTOR = 0.9
RECOVERY_PER_SECOND = 0.0125  # back from 25% to 100% in 60 s, from 90% in 8 s
MAX_BACKOFF_SECONDS = 30.0
_DEFAULT_RETRY_AFTER = 1.0


@dataclass
class _Bucket:
    """One budget: ``level`` units available at time ``at`` (``at`` may be in the future)."""

    per_second: float  # the full rate
    capacity: float
    level: float
    at: float

    def level_at(self, when: float, factor: float) -> float:
        return min(self.capacity, self.level + max(0.0, when - self.at) * self.per_second * factor)


@dataclass
class LimiterStats:
    """What a limiter did: calls granted, how long they waited in all, refusals it was told of."""

    granted: int = 0
    delayed: int = 0
    waited_seconds: float = 0.0
    throttled: int = 0  # 429s reported
    overloaded: int = 0  # 529s reported

    def to_dict(self) -> dict[str, float]:
        return {
            "granted": self.granted,
            "delayed": self.delayed,
            "waitedSeconds": round(self.waited_seconds, 3),
            "throttled": self.throttled,
            "overloaded": self.overloaded,
        }


@dataclass
class AdaptiveBuckets:
    """The budgets of one key and family; see the module docstring."""

    limit: RateLimit
    now: float
    burst_seconds: float = BURST_SECONDS
    blocked_until: float = 0.0
    stats: LimiterStats = field(default_factory=LimiterStats)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _penalty_factor: float = 1.0
    _penalty_at: float = 0.0
    _overloads: int = 0  # 529s in a row (a settled call resets it)

    def __post_init__(self) -> None:
        self._buckets = self._build(self.limit, self.now)

    def _build(self, limit: RateLimit, now: float) -> dict[str, _Bucket]:
        buckets = {}
        for name, per_minute in limit.to_dict().items():
            per_second = per_minute / 60.0
            capacity = max(1.0, per_second * self.burst_seconds)
            buckets[name] = _Bucket(per_second=per_second, capacity=capacity, level=capacity, at=now)
        return buckets

    def configure(self, limit: RateLimit, now: float) -> None:
        """Take a changed limit (the operator's settings changed); buckets start full again."""
        if limit != self.limit:
            self.limit = limit
            self._buckets = self._build(limit, now)

    def factor(self, now: float) -> float:
        """The fraction of the budget granted now: below 1 after refusals, recovering with time."""
        recovered = self._penalty_factor + max(0.0, now - self._penalty_at) * RECOVERY_PER_SECOND
        return min(1.0, recovered)

    def reserve(self, now: float, input_tokens: int, output_tokens: int) -> float:
        """Schedule one call: the seconds from ``now`` until it may be sent (0: at once).

        The buckets are debited at that moment, so the next caller is scheduled after it.
        """
        costs = self._costs(input_tokens, output_tokens)
        factor = self.factor(now)
        start = max(now, self.blocked_until)
        for name, cost in costs.items():
            bucket = self._buckets[name]
            begin = max(start, bucket.at)
            need = min(cost, bucket.capacity)
            level = bucket.level_at(begin, factor)
            ready = begin + max(0.0, need - level) / (bucket.per_second * factor)
            start = max(start, ready)
        for name, cost in costs.items():
            bucket = self._buckets[name]
            bucket.level = bucket.level_at(start, factor) - cost
            bucket.at = max(bucket.at, start)
        delay = start - now
        self.stats.granted += 1
        if delay > 0:
            self.stats.delayed += 1
            self.stats.waited_seconds += delay
        return delay

    def settle(self, reserved_input: int, reserved_output: int, used_input: int, used_output: int) -> None:
        """A call's usage is known: give back what was reserved and not used (or take the rest)."""
        self._overloads = 0
        for name, reserved, used in (
            ("itpm", reserved_input, used_input),
            ("otpm", reserved_output, used_output),
        ):
            bucket = self._buckets.get(name)
            if bucket is not None:
                bucket.level = min(bucket.capacity, bucket.level + reserved - used)

    def refused(self, now: float, status: int, retry_after: float | None) -> float:
        """The API refused a call: 429 (over the key's limit) or 529 (overloaded). Returns when
        (seconds from ``now``) calls may go again."""
        factor = self.factor(now)
        # Refusals of calls already on their way during a back-off are one event, not several:
        # the rate drops once per back-off (calls granted before it still arrive and are refused).
        fresh = now >= self.blocked_until
        if status == 429:
            self.stats.throttled += 1
            pause = retry_after if retry_after is not None and retry_after > 0 else _DEFAULT_RETRY_AFTER
            if fresh:
                self._penalty_factor, self._penalty_at = max(MIN_FACTOR, factor * THROTTLED_FACTOR), now
            for bucket in self._buckets.values():  # what we believed was left is not there
                if bucket.at <= now:
                    bucket.level = min(bucket.level_at(now, factor), 0.0)
                    bucket.at = now
        else:
            self.stats.overloaded += 1
            self._overloads += 1
            backoff = min(MAX_BACKOFF_SECONDS, 2.0 ** (self._overloads - 1))
            pause = retry_after if retry_after is not None and retry_after > 0 else backoff
            if fresh:
                self._penalty_factor, self._penalty_at = max(MIN_FACTOR, factor * OVERLOADED_FACTOR), now
        self.blocked_until = max(self.blocked_until, now + min(pause, 60.0))
        return self.blocked_until - now

    def _costs(self, input_tokens: int, output_tokens: int) -> dict[str, float]:
        wanted = {"rpm": 1.0, "itpm": float(max(0, input_tokens)), "otpm": float(max(0, output_tokens))}
        return {name: wanted[name] for name in self._buckets}
