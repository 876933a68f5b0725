"""A run's model calls, admitted by the cluster-wide rate limiter before they are sent.

`limit_calls` wraps a run's provider when the operator limits its key (``NODUS_RATE_LIMITS``,
`core.rate_limits`); `call_model` is the one line the conversation loop and a Python program's
relay use to make a call, limited or not. For each live call (a replayed one never gets here):

1. the limiter of the key and family (`runtime.rate_limiter`) schedules it: its uncached input
   estimated, its output counted at ``max_tokens``;
2. a run told to wait ``REPORT_AFTER_SECONDS`` or more shows ``Waiting`` / ``RateLimited``
   (it keeps its actor, and holds no request open at the API while it waits), then sleeps that
   long: one ``asyncio.sleep``, which its deadline and a cancel interrupt like any other await;
3. the call is sent; the SDK does not retry 429 and 529 itself (``defer_refusals``): a refusal
   is told to the limiter, which backs every caller of the key off (honouring ``retry-after``),
   and the call queues again, up to ``MAX_REFUSALS`` times;
4. its usage is settled with the limiter (cache reads do not count as input, as for the API).

A limiter that cannot be reached even after being made again never fails the run: the call
goes unlimited, and says so in the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from nodus.lifecycle import RunPhase, RunReason
from nodus_ray.control.run_reports import RunReport
from nodus_ray.core.rate_limits import RateLimitTable, key_fingerprint
from nodus_ray.models.base import ModelError, ModelProvider, ModelRequest, ModelResponse
from nodus_ray.models.catalog import family_of_model
from nodus_ray.runtime.rate_limiter import LimiterClient

__all__ = ["RateLimitedProvider", "call_model", "limit_calls", "REPORT_AFTER_SECONDS", "MAX_REFUSALS"]

logger = logging.getLogger(__name__)

REPORT_AFTER_SECONDS = 1.0  # shorter waits are not worth two status writes
MAX_REFUSALS = 50  # 429/529 answers one call outlasts (its deadline usually comes first)
_REFUSED = (429, 529)

OnWait = Callable[[str | None], Awaitable[None]]
"""Told the wait's description when a run starts waiting for the limiter, None when it stops."""


async def call_model(provider: ModelProvider, request: ModelRequest) -> ModelResponse:
    """One model call: through the rate limiter when the provider is limited, else in a thread."""
    if isinstance(provider, RateLimitedProvider):
        return await provider.acomplete(request)
    return await asyncio.to_thread(provider.complete, request)


def limit_calls(
    provider: ModelProvider,
    access: dict[str, Any],
    rate_limits: str,
    report: Callable[[RunReport], Awaitable[None]],
) -> ModelProvider:
    """The run's provider, limited when its key falls under the operator's limits."""
    table = RateLimitTable.parse(rate_limits)
    if access.get("provider") != "anthropic" or not access.get("apiKey"):
        return provider
    fingerprint = key_fingerprint(str(access["apiKey"]))
    if not table.applies_to(fingerprint):
        return provider  # a key no entry names: the SDK's own retries, as without limits
    if hasattr(provider, "defer_refusals"):
        provider.defer_refusals = True  # 429 and 529 are the limiter's to retry, not the SDK's

    async def on_wait(waiting: str | None) -> None:
        if waiting is None:
            await report(RunReport(phase=RunPhase.RUNNING, reason=None, message=None))
        else:
            await report(RunReport(phase=RunPhase.WAITING, reason=RunReason.RATE_LIMITED, message=waiting))

    return RateLimitedProvider(provider, fingerprint, table, on_wait)


class RateLimitedProvider:
    """A provider whose live calls the limiter admits first (see the module docstring)."""

    def __init__(
        self,
        inner: ModelProvider,
        fingerprint: str,
        table: RateLimitTable,
        on_wait: OnWait,
        limiter: Callable[[str, str, Any], Any] = LimiterClient,
    ):
        self.inner = inner
        self.name = inner.name
        self.fingerprint = fingerprint
        self.table = table
        self._on_wait = on_wait
        self._limiter = limiter
        self._clients: dict[str, Any] = {}
        self._prefix_tokens = 0  # the last call's whole prompt: what the next one reads from the cache

    def __repr__(self) -> str:
        return f"RateLimitedProvider({self.inner!r}, key={self.fingerprint})"

    def model_for_family(self, family: str) -> str:
        return self.inner.model_for_family(family)

    def complete(self, request: ModelRequest) -> ModelResponse:
        """The blocking call, unlimited (a caller in a thread); runs use `acomplete`."""
        return self.inner.complete(request)

    def _family(self, model: str) -> str:
        models = getattr(self.inner, "family_models", None) or {}
        return family_of_model(model, models) or model

    def _estimate(self, request: ModelRequest) -> int:
        """Uncached input tokens: the prompt (4 characters a token) less the last call's prompt,
        which this call resends and reads from the cache."""
        chars = len(json.dumps([request.system, request.messages, request.tools], default=str))
        return max(1, chars // 4 - self._prefix_tokens)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        family = self._family(request.model)
        limit = self.table.for_call(self.fingerprint, family)
        if limit is None:
            return await self._unlimited(request)
        client = self._clients.get(family)
        if client is None:
            client = self._clients[family] = self._limiter(self.fingerprint, family, limit)
        estimate, ceiling = self._estimate(request), request.max_tokens
        refusals = 0
        while True:
            await self._admitted(client, family, estimate, ceiling)
            try:
                response = await asyncio.to_thread(self.inner.complete, request)
            except ModelError as error:
                if error.status in _REFUSED and refusals < MAX_REFUSALS:
                    refusals += 1
                    await self._limiter_call(client.refused(error.status, error.retry_after))
                    continue
                await self._limiter_call(client.settle(estimate, ceiling, 0, 0))
                raise
            usage = response.usage
            self._prefix_tokens = (
                usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
            )
            used = usage.input_tokens + usage.cache_creation_input_tokens  # cache reads do not count
            await self._limiter_call(client.settle(estimate, ceiling, used, usage.output_tokens))
            return replace(response, attempts=response.attempts + refusals) if refusals else response

    async def _unlimited(self, request: ModelRequest) -> ModelResponse:
        """A family of this key without a limit: its refusals retried here, as the SDK would
        (``max_retries`` times, after ``retry-after`` or 0.5, 1, 2 ... s), since the SDK
        leaves 429 and 529 to us on this key."""
        retries = int(getattr(self.inner, "max_retries", 4))
        for attempt in range(retries + 1):
            try:
                response = await asyncio.to_thread(self.inner.complete, request)
            except ModelError as error:
                if error.status not in _REFUSED or attempt == retries:
                    raise
                await asyncio.sleep(error.retry_after or min(8.0, 0.5 * 2**attempt))
                continue
            return replace(response, attempts=response.attempts + attempt) if attempt else response
        raise AssertionError("unreachable")  # pragma: no cover

    async def _admitted(self, client: Any, family: str, estimate: int, ceiling: int) -> None:
        """Wait until the limiter lets this call go, showing Waiting/RateLimited if that is long."""
        delay = await self._limiter_call(client.reserve(estimate, ceiling))
        if not delay or delay <= 0:
            return
        if delay < REPORT_AFTER_SECONDS:
            await asyncio.sleep(delay)
            return
        await self._on_wait(
            f"waiting {delay:.1f}s for the rate limit of {family} on key {self.fingerprint} "
            f"({client.limit.describe()} a minute)"
        )
        await asyncio.sleep(delay)
        await self._on_wait(None)

    async def _limiter_call(self, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a lost limiter must never fail the run
            logger.warning("the rate limiter could not be reached; this call goes unlimited", exc_info=True)
            return None
