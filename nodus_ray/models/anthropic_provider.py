"""Claude through the Anthropic Messages API, with the official ``anthropic`` SDK.

Why it is built this way:

* **Streaming.** An answer of ``max_tokens`` can take minutes. A non-streaming call keeps an idle
  connection open that long, which proxies and load balancers cut (and the SDK refuses large
  non-streaming requests for that reason); a stream keeps bytes flowing. The final message is
  assembled by the SDK's own accumulator, so every block type (text, tool_use, thinking, ...)
  comes out as the non-streaming API would have returned it.
* **Retries.** The SDK retries 408/409/429/5xx/529 and connection failures with exponential
  back-off that honours ``retry-after``; this provider does not retry those again (a second
  retry loop around the SDK's would multiply the attempts, and a refused key must cost exactly
  one request: the SDK never retries 401/403 and neither does this). What the SDK cannot retry is
  a stream that breaks *after* its response started (its retry loop ended when the headers
  arrived): a stream that ends without ``message_stop``, drops its connection, or carries a
  transient ``error`` event (``overloaded_error``, ``api_error``, ...) is requested again, up to
  ``stream_retries`` more times; then the call fails with ``ModelUnavailable``.
* **Attempts.** ``ModelResponse.attempts`` counts every HTTP request the call made: for each
  stream the provider opened, 1 + the SDK's ``retries_taken`` for it (from the raw response,
  ``messages.with_raw_response.create(stream=True)``), summed over the provider's own stream
  retries. The journal records a model call once, with this count.
* **Prompt caching.** Each call of a conversation resends the whole conversation; cache
  breakpoints make the stable prefix cost a tenth on the next call. The order of the prefix is
  tools, then system, then messages, so the breakpoints go on the last tool, on the system
  prompt, and (from the second message on) on the last block of the last user message, so the
  next call, which appends to this one, reads what this one wrote. The API allows at most 4
  breakpoints; breakpoints already present in the caller's messages are dropped oldest first when
  there would be more.
* **Errors.** SDK errors become :class:`ModelError` with the ``reason`` the run reports:
  ``ModelAuthenticationFailed`` (401/403), ``ModelRequestInvalid`` (400/404/413/422),
  ``ModelUnavailable`` (429, 5xx, 529 overloaded, connection failures and timeouts, cut streams;
  ``retryable=True``), ``ModelError`` otherwise. The key never appears in a message, ``repr`` or
  exception chain: messages are scrubbed of it (and of any ``x-api-key``/``authorization``
  value), and SDK exceptions, which hold the request and its headers, are not chained.
* **Rate limits.** With ``defer_refusals`` (a run whose key and family are under an operator's
  rate limit, `runtime.rate_limited`), the SDK does not retry 429 and 529 itself: the error
  carries the status and ``retry-after`` and the cluster-wide limiter decides when to call
  again, so retries queue with every other run's calls instead of racing them blindly.
"""

from __future__ import annotations

import copy
import importlib
import math
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anthropic
from anthropic.lib.streaming import MessageStream

from nodus_ray.models.anthropic_request import request_params
from nodus_ray.models.base import ModelError, ModelRequest, ModelResponse, Usage
from nodus_ray.models.catalog import CLAUDE_FAMILY_MODELS

__all__ = ["AnthropicProvider", "DEFAULT_FAMILY_MODELS"]

# The price table decides which Claude model serves each family; this is its default.
DEFAULT_FAMILY_MODELS: dict[str, str] = dict(CLAUDE_FAMILY_MODELS)

_CONNECT_TIMEOUT_SECONDS = 10.0  # a host that does not answer should not hold a call for minutes
_API_MESSAGE_LIMIT = 500  # characters of the API's error message quoted in ours

# Error types the API sends (as an HTTP status or as an `error` event inside a 200 stream) for
# conditions that pass with time.
_TRANSIENT_ERROR_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
_AUTH_ERROR_TYPES = frozenset({"authentication_error", "permission_error"})
_INVALID_ERROR_TYPES = frozenset({"invalid_request_error", "not_found_error", "request_too_large"})
_INVALID_STATUSES = frozenset({400, 404, 413, 422})
_UNAVAILABLE_STATUSES = frozenset({408, 409, 429, 499})

_SECRET_PATTERNS = (
    # header values in any rendering: `x-api-key: K`, `'authorization': 'Bearer K'`, `x-api-key=K`
    re.compile(r"""(?i)((?:x-api-key|authorization)["']?\s*[:=]\s*["']?)(?:bearer\s+)?[^\s"',;}]+"""),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"()sk-ant-[A-Za-z0-9_-]+"),
)
_REDACTED = "[redacted]"


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's errors (``httpx2`` in SDK 2.x, ``httpx`` before): a broken stream."""
    errors: list[type[BaseException]] = [anthropic.APIConnectionError]
    for name in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


# Raised while reading a stream when the connection breaks (incomplete chunked body, reset,
# read timeout), or when what arrived cannot be parsed (ValueError: a truncated JSON event).
_STREAM_BROKEN: tuple[type[BaseException], ...] = (*_transport_errors(), ValueError)


class _DeferringAnthropic(anthropic.Anthropic):
    """The SDK's client, retrying everything it retries but 429 and 529 (see ``defer_refusals``)."""

    def _should_retry(self, response: Any) -> bool:
        if response.status_code in (429, 529):
            return False
        return bool(super()._should_retry(response))


def _retry_after(error: anthropic.APIStatusError) -> float | None:
    """The seconds the API asked to wait (``retry-after-ms`` or ``retry-after``), if it said."""
    headers = getattr(getattr(error, "response", None), "headers", None) or {}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        try:
            value = float(raw) if raw is not None else math.nan
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            return value * scale
    return None


class _StreamBroken(Exception):
    """A stream that started but did not finish; worth opening again."""


class AnthropicProvider:
    """A ``ModelProvider`` that asks Claude, on the caller's key (see the module docstring).

    ``family_models`` overrides the model id per family (haiku, sonnet, opus, fable); ids not
    overridden come from :data:`DEFAULT_FAMILY_MODELS`. ``base_url`` None uses the SDK's default,
    which honours ``ANTHROPIC_BASE_URL``. ``max_retries`` is the SDK's retry budget per request,
    ``stream_retries`` how many more times a stream that broke mid-way is opened again, and
    ``timeout_seconds`` the SDK's timeout (for a stream: the longest silence between chunks).
    """

    name = "anthropic"

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str | None = None,
        family_models: Mapping[str, str] | None = None,
        max_retries: int = 4,
        timeout_seconds: float = 600.0,
        stream_retries: int = 2,
        defer_refusals: bool = False,
    ):
        # A key read from a secret file often ends with a newline, which is not a valid header.
        key = api_key.strip() if isinstance(api_key, str) else ""
        if not key:
            raise ValueError("api_key must be a non-empty string")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        if isinstance(stream_retries, bool) or not isinstance(stream_retries, int) or stream_retries < 0:
            raise ValueError(f"stream_retries must be an integer >= 0, got {stream_retries!r}")
        if (
            not isinstance(timeout_seconds, int | float)
            or not math.isfinite(timeout_seconds)
            or timeout_seconds <= 0
        ):
            raise ValueError(f"timeout_seconds must be a finite number > 0, got {timeout_seconds!r}")
        self._api_key = key
        self._secrets = tuple({key, api_key} - {""})
        self.base_url = base_url
        models = {k.strip().lower(): v for k, v in DEFAULT_FAMILY_MODELS.items()}
        for family, model in (family_models or {}).items():
            if not isinstance(model, str) or not model.strip():
                raise ValueError(f"the model for family {family!r} must be a non-empty string")
            models[str(family).strip().lower()] = model.strip()
        self.family_models: dict[str, str] = models
        self.max_retries = max_retries
        self.timeout_seconds = float(timeout_seconds)
        self.stream_retries = stream_retries
        self.defer_refusals = defer_refusals
        self._client: anthropic.Anthropic | None = None
        self._client_lock = threading.Lock()

    # -- the interface -------------------------------------------------------------------------

    def model_for_family(self, family: str) -> str:
        """The model id serving ``family``; a model id (``claude-...``) is accepted as itself."""
        name = family.strip()
        key = name.lower()
        if key in self.family_models:
            return self.family_models[key]
        if name in self.family_models.values() or key.startswith("claude-"):
            return name
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(self.family_models)}")

    def complete(self, request: ModelRequest) -> ModelResponse:
        """One Messages call, streamed; raises :class:`ModelError` when it cannot be answered."""
        try:
            return self._complete(request)
        except ModelError as error:
            # SDK exceptions hold the request, headers and key included: keep none attached.
            error.__cause__ = error.__context__ = None
            raise

    def _complete(self, request: ModelRequest) -> ModelResponse:
        params = request_params(request)
        client = self._get_client()
        attempts = 0
        failures: list[str] = []
        for _ in range(self.stream_retries + 1):
            try:
                raw = client.messages.with_raw_response.create(**params, stream=True)
            except anthropic.APIStatusError as error:
                raise self._status_error(error) from None
            except anthropic.APIConnectionError as error:
                raise self._connection_error(error) from None
            except anthropic.AnthropicError as error:
                raise self._error(f"the Anthropic SDK failed: {type(error).__name__}: {error}") from None
            attempts += 1 + _retries_taken(raw)
            try:
                message = self._read_stream(raw)
            except _StreamBroken as broken:
                failures.append(str(broken))
                continue
            return _response(message, request, attempts)
        raise self._error(
            f"the Anthropic API's stream broke off {len(failures)} time(s) in a row "
            f"({'; '.join(dict.fromkeys(failures))}); giving up after {attempts} attempt(s)",
            reason="ModelUnavailable",
            retryable=True,
        )

    def close(self) -> None:
        """Close the HTTP connections (a new client is made if the provider is used again)."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __repr__(self) -> str:
        return (
            f"AnthropicProvider(base_url={_display_url(self.base_url)!r}, "
            f"family_models={self.family_models!r}, max_retries={self.max_retries!r}, "
            f"timeout_seconds={self.timeout_seconds!r}, stream_retries={self.stream_retries!r})"
        )

    # The SDK client holds sockets and a lock; a pickled provider (sent to a Ray actor) makes its own.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        del state["_client_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client_lock = threading.Lock()

    # -- calling -------------------------------------------------------------------------------

    def _get_client(self) -> anthropic.Anthropic:
        with self._client_lock:
            if self._client is None:
                self._client = (_DeferringAnthropic if self.defer_refusals else anthropic.Anthropic)(
                    api_key=self._api_key,
                    base_url=self.base_url,
                    max_retries=self.max_retries,
                    timeout=anthropic.Timeout(
                        self.timeout_seconds, connect=min(self.timeout_seconds, _CONNECT_TIMEOUT_SECONDS)
                    ),
                )
            return self._client

    def _read_stream(self, raw: Any) -> Any:
        """The final message of a stream that reached ``message_stop``; else :class:`_StreamBroken`."""
        stream: MessageStream[Any] = MessageStream(raw.parse(), output_format=anthropic.NOT_GIVEN)
        started = stopped = False
        try:
            for event in stream:
                started = started or event.type == "message_start"
                stopped = stopped or event.type == "message_stop"
        except anthropic.APIStatusError as error:
            # An `error` event inside the stream (HTTP status 200): transient ones are retried.
            if (error.type or "") in _TRANSIENT_ERROR_TYPES:
                raise _StreamBroken(f"{error.type} in the stream") from None
            raise self._status_error(error) from None
        except _STREAM_BROKEN as error:
            raise _StreamBroken(f"{type(error).__name__} while reading the stream") from None
        finally:
            stream.close()
        if not started:
            raise _StreamBroken("the stream had no message_start")
        if not stopped:
            raise _StreamBroken("the stream ended without message_stop")
        return stream.current_message_snapshot

    # -- errors ----------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, _REDACTED)
        for pattern in _SECRET_PATTERNS:
            text = pattern.sub(lambda match: match.group(1) + _REDACTED, text)
        return text

    def _error(self, message: str, *, reason: str = "ModelError", retryable: bool = False) -> ModelError:
        return ModelError(self._scrub(message), reason=reason, retryable=retryable)

    def _status_error(self, error: anthropic.APIStatusError) -> ModelError:
        status = error.status_code
        kind = error.type or _body_error_type(error.body)
        detail = (error.api_message or _body_error_message(error.body) or error.message or "").strip()
        if len(detail) > _API_MESSAGE_LIMIT:
            detail = detail[:_API_MESSAGE_LIMIT] + "..."
        where = f"{status} {kind or 'error'}" if status != 200 else f"{kind or 'error'} in the stream"
        if (
            isinstance(error, anthropic.AuthenticationError | anthropic.PermissionDeniedError)
            or status in (401, 403)
            or kind in _AUTH_ERROR_TYPES
        ):
            default = "authentication_error" if status != 403 else "permission_error"
            return self._error(
                f"the Anthropic API refused the key ({status} {kind or default})",
                reason="ModelAuthenticationFailed",
            )
        if (
            isinstance(
                error,
                anthropic.BadRequestError | anthropic.NotFoundError | anthropic.UnprocessableEntityError,
            )
            or status in _INVALID_STATUSES
            or kind in _INVALID_ERROR_TYPES
        ):
            return self._error(
                f"the Anthropic API refused the request ({where}): {detail}", reason="ModelRequestInvalid"
            )
        if (
            isinstance(error, anthropic.RateLimitError | anthropic.InternalServerError)
            or status in _UNAVAILABLE_STATUSES
            or status >= 500
            or kind in _TRANSIENT_ERROR_TYPES
        ):
            unavailable = self._error(
                f"the Anthropic API is unavailable ({where}): {detail}; "
                f"the SDK retried up to {self.max_retries} time(s)",
                reason="ModelUnavailable",
                retryable=True,
            )
            unavailable.status, unavailable.retry_after = status, _retry_after(error)
            return unavailable
        return self._error(f"the Anthropic API answered {where}: {detail}")

    def _connection_error(self, error: anthropic.APIConnectionError) -> ModelError:
        what = "timed out" if isinstance(error, anthropic.APITimeoutError) else "could not be reached"
        cause = f" ({type(error.__cause__).__name__})" if error.__cause__ is not None else ""
        return self._error(
            f"the Anthropic API at {_display_url(str(self._get_client().base_url))} {what}{cause}; "
            f"the SDK retried up to {self.max_retries} time(s)",
            reason="ModelUnavailable",
            retryable=True,
        )


# ------------------------------------------------------------------------------------------------
# The response


def _retries_taken(raw: Any) -> int:
    """How many times the SDK retried before this response (``retries_taken``, else its header)."""
    taken = getattr(raw, "retries_taken", None)
    if isinstance(taken, int):
        return taken
    try:
        return int(raw.http_request.headers.get("x-stainless-retry-count", 0))
    except (AttributeError, TypeError, ValueError):
        return 0


def _response(message: Any, request: ModelRequest, attempts: int) -> ModelResponse:
    usage = getattr(message, "usage", None)
    return ModelResponse(
        model=getattr(message, "model", None) or request.model,
        content=[_block(block) for block in getattr(message, "content", None) or []],
        stop_reason=getattr(message, "stop_reason", None) or "end_turn",
        usage=Usage(
            input_tokens=_count(usage, "input_tokens"),
            output_tokens=_count(usage, "output_tokens"),
            cache_creation_input_tokens=_count(usage, "cache_creation_input_tokens"),
            cache_read_input_tokens=_count(usage, "cache_read_input_tokens"),
        ),
        attempts=attempts,
    )


def _count(usage: Any, name: str) -> int:
    value = getattr(usage, name, None) if usage is not None else None
    return int(value or 0)


def _block(block: Any) -> dict[str, Any]:
    """A content block as the plain dict the journal records and the next request sends back."""
    kind = getattr(block, "type", None)
    if kind == "text":
        out: dict[str, Any] = {"type": "text", "text": block.text}
        citations = getattr(block, "citations", None)
        if citations:
            out["citations"] = [_plain(citation) for citation in citations]
        return out
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": _plain(block.input)}
    plain: dict[str, Any] = _plain(block)
    return plain


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict(mode="json", exclude_none=True, warnings=False)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    return copy.deepcopy(value)


def _body_error_type(body: object) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


def _body_error_message(body: object) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def _display_url(url: str | None) -> str | None:
    """A URL without user:password, which could be a credential."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
