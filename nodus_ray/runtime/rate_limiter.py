"""The cluster-wide rate limiter: one named, detached actor per Anthropic key and model family.

Every run actor whose model calls fall under a limit (`core.rate_limits`) asks the limiter of
its key and family before each call. One actor per key and family, because that is the unit
the API limits, and so a busy family never queues behind another one's budget. The actor holds
only soft state (`core.rate_buckets`): it is started lazily by the first run that needs it
(``get_if_exists``), named ``nodus-rate-limiter.<key fingerprint>.<family>`` in namespace
``nodus`` (a fingerprint, never the key), and restarted by Ray if it dies. A caller that finds
it gone (killed, or its node lost) makes it again and goes on: a run never fails because the
limiter was lost; a new limiter starts with full buckets, and the API's 429s correct it.

Each call carries the limit, so the limiter always uses the operator's current settings
(a ``nodus up`` with other settings reconfigures a limiter that outlived it) and never needs
to read them itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from nodus_ray.core.rate_buckets import AdaptiveBuckets
from nodus_ray.core.rate_limits import RateLimit
from nodus_ray.settings import NAMESPACE

__all__ = ["RateLimiter", "LimiterClient", "limiter_name", "LIMITER_PREFIX"]

logger = logging.getLogger(__name__)

LIMITER_PREFIX = "nodus-rate-limiter"
_FIND_ATTEMPTS = 5


def limiter_name(fingerprint: str, family: str) -> str:
    """The actor's name: the key's fingerprint and the family (Ray names allow ``*``)."""
    return f"{LIMITER_PREFIX}.{fingerprint}.{family}"


class RateLimiter:
    """The actor: schedules calls of one key and family, and learns from refusals."""

    def __init__(self, fingerprint: str, family: str, limit: dict[str, float]):
        self.fingerprint = fingerprint
        self.family = family
        self._buckets = AdaptiveBuckets(RateLimit.from_dict(limit), time.monotonic())

    def __repr__(self) -> str:
        return (
            f"RateLimiter(key={self.fingerprint}, family={self.family}, "
            f"limit={self._buckets.limit.describe()})"
        )

    async def reserve(self, limit: dict[str, float], input_tokens: int, output_tokens: int) -> float:
        """Seconds the caller waits before sending its call (0: now); its budget is held."""
        now = time.monotonic()
        self._buckets.configure(RateLimit.from_dict(limit), now)
        return self._buckets.reserve(now, input_tokens, output_tokens)

    async def settle(
        self, reserved_input: int, reserved_output: int, used_input: int, used_output: int
    ) -> None:
        """The call's usage (uncached input, output): what it held and did not use comes back."""
        self._buckets.settle(reserved_input, reserved_output, used_input, used_output)

    async def refused(self, status: int, retry_after: float | None) -> float:
        """The API answered 429 or 529: back off; the seconds until calls may go again."""
        return self._buckets.refused(time.monotonic(), status, retry_after)

    async def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            **self._buckets.stats.to_dict(),
            "factor": round(self._buckets.factor(now), 3),
            "limit": self._buckets.limit.to_dict(),
        }


class LimiterClient:
    """A run actor's way to its limiter: finds (or starts) it, and finds it again if it is lost."""

    def __init__(self, fingerprint: str, family: str, limit: RateLimit):
        self.fingerprint = fingerprint
        self.family = family
        self.limit = limit
        self._handle: Any = None

    def _actor(self) -> Any:
        if self._handle is None:
            remote: Any = ray.remote(num_cpus=0, max_restarts=-1)(RateLimiter)
            self._handle = remote.options(
                name=limiter_name(self.fingerprint, self.family),
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
            ).remote(self.fingerprint, self.family, self.limit.to_dict())
        return self._handle

    async def _call(self, call: Callable[[Any], Any]) -> Any:
        """``call(actor)`` on the limiter; made again if it was lost, up to a few times."""
        failure: BaseException | None = None
        for attempt in range(_FIND_ATTEMPTS):
            if attempt:
                await asyncio.sleep(0.2 * attempt)  # a killed actor's name is freed shortly after
            try:
                return await call(self._actor())
            except (ray.exceptions.RayActorError, ValueError) as lost:
                # Killed or its node lost: make it again (another run may have already).
                logger.warning(
                    "rate limiter %s lost (%s); finding it again", self.family, type(lost).__name__
                )
                self._handle, failure = None, lost
        assert failure is not None
        raise failure

    async def reserve(self, input_tokens: int, output_tokens: int) -> float:
        limit = self.limit.to_dict()
        return float(await self._call(lambda actor: actor.reserve.remote(limit, input_tokens, output_tokens)))

    async def settle(
        self, reserved_input: int, reserved_output: int, used_input: int, used_output: int
    ) -> None:
        await self._call(
            lambda actor: actor.settle.remote(reserved_input, reserved_output, used_input, used_output)
        )

    async def refused(self, status: int, retry_after: float | None) -> float:
        return float(await self._call(lambda actor: actor.refused.remote(status, retry_after)))

    async def stats(self) -> dict[str, Any]:
        return dict(await self._call(lambda actor: actor.stats.remote()))
