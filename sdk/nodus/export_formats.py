"""The formats a run's trajectory and an evaluation's cases export to, shared by the API,
the SDK and the CLI.

Declared once so the server, ``AgentRun.export`` and ``nodus ... export --format`` offer the
same list and refuse anything else with the same error (``Invalid`` naming ``format``).
"""

from __future__ import annotations

from enum import StrEnum

from .errors import Invalid

__all__ = [
    "RunExportFormat",
    "EvaluationExportFormat",
    "BINARY_FORMATS",
    "MEDIA_TYPES",
    "FILE_SUFFIXES",
    "run_export_format",
    "evaluation_export_format",
]


class RunExportFormat(StrEnum):
    """``atif``: the Agent Trajectory Interchange Format (one JSON document); ``jsonl``: the
    run's journal records, one JSON object a line."""

    ATIF = "atif"
    JSONL = "jsonl"


class EvaluationExportFormat(StrEnum):
    """``parquet``: one row per case; ``jsonl``: one case a line; ``inspect``: Inspect's eval
    log (JSON, what ``inspect view`` reads)."""

    PARQUET = "parquet"
    JSONL = "jsonl"
    INSPECT = "inspect"


BINARY_FORMATS: frozenset[str] = frozenset({EvaluationExportFormat.PARQUET.value})

MEDIA_TYPES: dict[str, str] = {
    "atif": "application/json",
    "jsonl": "application/x-ndjson",
    "inspect": "application/json",
    "parquet": "application/vnd.apache.parquet",
}

FILE_SUFFIXES: dict[str, str] = {
    "atif": ".atif.json",
    "jsonl": ".jsonl",
    "inspect": ".json",
    "parquet": ".parquet",
}


def _refuse(value: object, what: str, offered: list[str]) -> Invalid:
    return Invalid(
        f"format {str(value)[:40]!r} is not offered for {what}; use one of {', '.join(offered)}",
        code="UnsupportedFormat",
        details={"field": "format", "allowed": offered},
    )


def run_export_format(value: object) -> RunExportFormat:
    """The run export format ``value`` names, or `Invalid` listing the ones offered."""
    try:
        return RunExportFormat(str(value).strip().lower())
    except ValueError:
        raise _refuse(value, "an agentrun", [f.value for f in RunExportFormat]) from None


def evaluation_export_format(value: object) -> EvaluationExportFormat:
    """The evaluation export format ``value`` names, or `Invalid` listing the ones offered."""
    try:
        return EvaluationExportFormat(str(value).strip().lower())
    except ValueError:
        raise _refuse(value, "an evaluation", [f.value for f in EvaluationExportFormat]) from None
