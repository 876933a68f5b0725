"""How long a finished run's payloads and workspace are kept: the retention settings, parsed.

``NODUS_PAYLOAD_RETENTION`` (default ``30d``) and ``NODUS_WORKSPACE_RETENTION`` (default
``24h``) are a duration, optionally followed by per-project overrides, comma-separated:
``30d,audit=365d,scratch=1h``. A duration is the documents' (``2h``, ``30m``, ``1h30m``,
`nodus.durations.parse_duration`) with days in front (``30d``, ``1d12h``). An override lets an
operator keep one project's records longer (or shorter) than the rest, and lets a test session
give its retention test's project a retention of seconds without touching any other test's runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from nodus.durations import parse_duration
from nodus.errors import PayloadExpired
from nodus.resources import validate_dns_label

__all__ = ["RetentionPolicy", "parse_retention", "payloads_expired", "check_payloads"]

_DAYS = re.compile(r"(\d+)d(.*)")
_MAX = timedelta(days=36500)


def parse_retention(text: str) -> timedelta:
    """``"30d"``, ``"24h"``, ``"1d12h"``, ``"2s"``: more than zero; raises `ValueError` naming it."""
    value = text.strip()
    match = _DAYS.fullmatch(value)
    try:
        if match is not None:
            days = timedelta(days=int(match.group(1)))
            rest = match.group(2)
            duration = days + (parse_duration(rest) if rest else timedelta(0))
        else:
            duration = parse_duration(value)
    except (ValueError, OverflowError):
        raise ValueError(f'{text!r} is not a retention such as "30d", "24h" or "90s"') from None
    if duration <= timedelta(0) or duration > _MAX:
        raise ValueError(f"{text!r} must be more than 0s and at most 36500d")
    return duration


@dataclass(frozen=True)
class RetentionPolicy:
    """One retention setting: the default, and the projects that have their own."""

    default: timedelta
    projects: dict[str, timedelta] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, setting: str) -> RetentionPolicy:
        """Read ``"30d,audit=365d"``; a bad part is refused naming ``setting`` and the part."""
        default: timedelta | None = None
        projects: dict[str, timedelta] = {}
        for part in (piece.strip() for piece in text.split(",")):
            if not part:
                continue
            project, equals, duration = part.partition("=")
            try:
                if not equals:
                    if default is not None:
                        raise ValueError("has two defaults (one bare duration, then project=duration)")
                    default = parse_retention(part)
                    continue
                validate_dns_label(project.strip())
                projects[project.strip()] = parse_retention(duration)
            except ValueError as error:
                raise ValueError(f"{setting}={text!r}: {error}") from None
        if default is None:
            raise ValueError(f'{setting}={text!r} needs a duration such as "30d" (then project=duration)')
        return cls(default, projects)

    def for_project(self, project: str) -> timedelta:
        """How long ``project``'s runs keep what this policy covers."""
        return self.projects.get(project, self.default)


def payloads_expired(run: dict[str, Any]) -> str | None:
    """When the run's payloads expired (``status.payloadsExpiredAt``), or None while kept."""
    expired = (run.get("status") or {}).get("payloadsExpiredAt")
    return str(expired) if expired else None


def check_payloads(run: dict[str, Any], what: str, kind: str = "AgentRun") -> None:
    """Raise `PayloadExpired` (410) when ``what`` of the run (or group) went with its payloads."""
    expired = payloads_expired(run)
    if expired is None:
        return
    name = run["metadata"]["name"]
    raise PayloadExpired(
        f"{kind.lower()} {name!r}: its {what} expired at {expired} (recorded payloads are kept "
        "NODUS_PAYLOAD_RETENTION after it finished; its status, steps and totals remain)",
        details={"kind": kind, "name": name, "field": "status.payloadsExpiredAt", "expiredAt": expired},
    )
