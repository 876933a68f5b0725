"""The one timestamp format of resources and journals: ISO 8601 in UTC with a ``Z``."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utc_now", "format_timestamp", "parse_timestamp"]


def format_timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def utc_now() -> str:
    return format_timestamp(datetime.now(UTC))


def parse_timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
