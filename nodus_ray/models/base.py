"""The one interface every model provider implements.

Requests and responses use the Anthropic Messages shape (content blocks, ``tool_use`` and
``tool_result``) because Claude is what runs serve; the offline provider speaks the same shape
so the conversation loop, the journal and the tests cannot tell them apart. Responses are
plain data (``to_dict``/``from_dict``) because the journal records them and replay returns
the recorded response instead of calling the model again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "BASH_TOOL",
    "ModelRequest",
    "Usage",
    "ModelResponse",
    "ModelProvider",
    "ModelError",
]

# The single tool a run's model gets: a shell command in the run's sandbox.
BASH_TOOL: dict[str, Any] = {
    "name": "bash",
    "description": (
        "Run a shell command with /bin/bash in your sandbox. The working directory is your "
        "workspace (/tmp/workspace), which persists between commands. There is no network. "
        "You get back the exit code and the combined stdout and stderr (long output is cut)."
    ),
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run."}},
        "required": ["command"],
    },
}


@dataclass(frozen=True)
class ModelRequest:
    """One Messages API call: the whole conversation so far, and what the model may do."""

    model: str
    system: str
    messages: list[dict[str, Any]]
    max_tokens: int
    tools: list[dict[str, Any]] = field(default_factory=lambda: [BASH_TOOL])


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Usage:
        return cls(**{k: int(data.get(k) or 0) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ModelResponse:
    """What the model said: content blocks (``text`` and ``tool_use``), why it stopped, usage."""

    model: str
    content: list[dict[str, Any]]
    stop_reason: str
    usage: Usage = field(default_factory=Usage)
    # How many HTTP attempts the call took (the SDK's retries on 429/5xx included); the journal
    # records the call once, with this count.
    attempts: int = 1

    def text(self) -> str:
        return "".join(block.get("text", "") for block in self.content if block.get("type") == "text")

    def tool_uses(self) -> list[dict[str, Any]]:
        return [block for block in self.content if block.get("type") == "tool_use"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "content": self.content,
            "stop_reason": self.stop_reason,
            "usage": self.usage.to_dict(),
            "attempts": self.attempts,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelResponse:
        return cls(
            model=data["model"],
            content=list(data["content"]),
            stop_reason=data["stop_reason"],
            usage=Usage.from_dict(data.get("usage") or {}),
            attempts=int(data.get("attempts") or 1),
        )


class ModelError(Exception):
    """A model call failed in a way retries did not fix.

    ``reason`` becomes the run's ``status.reason``: ``ModelAuthenticationFailed`` (the key was
    refused), ``ModelRequestInvalid`` (the API refused the request), ``ModelUnavailable``
    (429/5xx/overloaded or a cut stream, after the retries), ``ModelError`` otherwise. The
    message never contains the API key.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str = "ModelError",
        retryable: bool = False,
        status: int | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.reason = reason
        self.retryable = retryable
        # The API's HTTP status and its retry-after (seconds), when it refused: the rate limiter
        # (`runtime.rate_limited`) backs off on 429 and 529 by them.
        self.status = status
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_model_error, (str(self), self.reason, self.retryable, self.status, self.retry_after))


def _rebuild_model_error(
    message: str, reason: str, retryable: bool, status: int | None = None, retry_after: float | None = None
) -> ModelError:
    return ModelError(message, reason=reason, retryable=retryable, status=status, retry_after=retry_after)


@runtime_checkable
class ModelProvider(Protocol):
    """A source of Messages API answers. ``complete`` blocks; callers run it off the event loop."""

    name: str

    def model_for_family(self, family: str) -> str:
        """The model id that serves ``family`` (haiku, sonnet, opus, fable) on this provider."""
        ...

    def complete(self, request: ModelRequest) -> ModelResponse: ...
