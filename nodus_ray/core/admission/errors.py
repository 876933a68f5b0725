"""How admission refuses: `AdmissionError` (Invalid or Conflict, with a reason), and the checks
of money and whole numbers that raise it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

__all__ = ["AdmissionError", "_invalid", "_conflict", "_usd", "_check_money", "_check_int"]


class AdmissionError(Exception):
    """A refused request. Nothing was changed.

    ``code`` is the API error class (``"Invalid"``: the request itself is wrong, 422;
    ``"Conflict"``: the group's state refuses it, 409). ``reason`` is the product's word for the
    problem (``GroupSealed``, ``MaxPendingReached``, ``CapLowered``, ``DuplicateTaskKey``,
    ``UnknownDependency``, ``DependencyCycle``, ...), ``field`` the offending field and ``index``
    the position of the offending run in a batch passed to `Admission.add`.
    """

    def __init__(
        self, code: str, reason: str, message: str, *, field: str | None = None, index: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.field = field
        self.index = index

    @property
    def details(self) -> dict[str, Any]:
        """The API error's ``details``: the reason, and the field and batch index when known."""
        details: dict[str, Any] = {"reason": self.reason}
        if self.field is not None:
            details["field"] = self.field
        if self.index is not None:
            details["index"] = self.index
        return details

    def __reduce__(self) -> tuple[Any, ...]:
        # The default pickling passes only args (the message) back to __init__; the refusal has to
        # cross from the group supervisor actor to the API intact.
        return (_rebuild_error, (self.code, self.reason, self.message, self.field, self.index))

    def __str__(self) -> str:
        return self.message


def _rebuild_error(
    code: str, reason: str, message: str, field: str | None, index: int | None
) -> AdmissionError:
    return AdmissionError(code, reason, message, field=field, index=index)


def _invalid(reason: str, message: str, field: str | None = None, index: int | None = None) -> AdmissionError:
    return AdmissionError("Invalid", reason, message, field=field, index=index)


def _conflict(
    reason: str, message: str, field: str | None = None, index: int | None = None
) -> AdmissionError:
    return AdmissionError("Conflict", reason, message, field=field, index=index)


def _usd(amount: Decimal) -> str:
    """Money as the API writes it: a plain decimal string, never exponent notation."""
    return format(amount, "f")


def _check_money(value: object, field: str, what: str, index: int | None = None) -> Decimal:
    # Money is Decimal end to end: a float here would already have lost cents.
    if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
        raise _invalid("InvalidAmount", f"{what} must be a non-negative Decimal, not {value!r}", field, index)
    return value


def _check_int(value: object, low: int, high: int | None, field: str, what: str) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"{low} to {high}" if high is not None else f"at least {low}"
        raise _invalid("OutOfRange", f"{what} must be a whole number {bounds}, not {value!r}", field)
    return value
