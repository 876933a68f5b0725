"""Errors shared by the SDK, the CLI and the server.

One class per kind of refusal, each with the HTTP status it travels as and a `code` that is
the reason name of the product documents (``AgentStopped``, ``AgentRunFinished``, ...). The
server raises these inside Ray actors, so they must survive pickling; the client rebuilds them
from the API's JSON body ``{code, message, details}``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "NodusError",
    "Invalid",
    "BadRequest",
    "Unsupported",
    "NotFound",
    "Unauthorized",
    "Forbidden",
    "Conflict",
    "PayloadTooLarge",
    "PayloadExpired",
    "Unavailable",
    "TooManyRequests",
    "WaitTimeout",
    "AgentRunFailed",
    "StepError",
    "error_from_response",
]


class NodusError(Exception):
    """Base of every error nodus raises on purpose."""

    status: int = 500
    default_code: str = "InternalError"

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.details = dict(details or {})

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle through their args by default, which would drop code and details
        # when a refusal crosses from an actor to the ingress.
        return (_rebuild, (type(self), self.message, self.code, self.details))

    def to_dict(self) -> dict[str, Any]:
        """The API's error body."""
        return {"code": self.code, "message": self.message, "details": self.details}

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[NodusError], message: str, code: str, details: dict[str, Any]) -> NodusError:
    error = cls.__new__(cls)
    NodusError.__init__(error, message, code=code, details=details)
    return error


class Invalid(NodusError):
    """The request or resource is malformed; ``details.field`` names the offending field."""

    status = 422
    default_code = "Invalid"


class BadRequest(Invalid):
    """The request could not be read at all (not JSON, not an object)."""

    status = 400


class Unsupported(Invalid):
    """A definition names something this server does not do yet; raised before sending."""

    default_code = "Unsupported"


class NotFound(NodusError):
    status = 404
    default_code = "NotFound"


class Unauthorized(NodusError):
    """No bearer token, or one the server does not accept (unknown, revoked or expired)."""

    status = 401
    default_code = "Unauthorized"


class Forbidden(NodusError):
    """The token is valid for this project but its role does not allow the request."""

    status = 403
    default_code = "Forbidden"


class Conflict(NodusError):
    """The request is well-formed but the resource's state refuses it (AgentStopped, ...)."""

    status = 409
    default_code = "Conflict"


class PayloadTooLarge(Invalid):
    status = 413
    default_code = "PayloadTooLarge"


class PayloadExpired(NodusError):
    """A recorded payload (an input, a message, a model reply, command output, an answer, an
    output, a per-case record) was deleted after its retention; the run and its totals remain."""

    status = 410
    default_code = "PayloadExpired"


class Unavailable(NodusError):
    """The server cannot be reached or is not ready."""

    status = 503
    default_code = "Unavailable"


class TooManyRequests(NodusError):
    """The API sheds load: it has as many requests in flight as it takes. Nothing was done;
    retry after ``details["retryAfter"]`` seconds (the SDK does, by itself)."""

    status = 429
    default_code = "TooManyRequests"


class WaitTimeout(NodusError):
    """A client-side wait reached its timeout before the condition held."""

    status = 408
    default_code = "WaitTimeout"


class AgentRunFailed(NodusError):
    """A run ended without succeeding; ``details`` has its name, phase and reason."""

    status = 409
    default_code = "AgentRunFailed"


class StepError(NodusError):
    """A durable program's step raised, and on replay its exception's class could not be built
    again (not importable, or not constructible from one message); ``type`` names the class."""

    default_code = "StepError"

    def __init__(self, type: str, message: str) -> None:
        super().__init__(f"{type}: {message}", details={"type": type, "message": message})

    @property
    def type(self) -> str:
        return str(self.details.get("type", ""))


_BY_STATUS: dict[int, type[NodusError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: PayloadExpired,
    413: PayloadTooLarge,
    422: Invalid,
    429: TooManyRequests,
    400: BadRequest,
    503: Unavailable,
}


def error_from_response(status: int, body: Any) -> NodusError:
    """Rebuild the error the server raised from an HTTP status and JSON body."""
    if isinstance(body, dict) and "code" in body:
        code = str(body.get("code"))
        message = str(body.get("message") or code)
        details = body.get("details") if isinstance(body.get("details"), dict) else {}
    else:
        code, message, details = f"HTTP{status}", f"server answered HTTP {status}", {}
    cls: type[NodusError] = Unsupported if code == "Unsupported" else _BY_STATUS.get(status, NodusError)
    return cls(message, code=code, details=details)
