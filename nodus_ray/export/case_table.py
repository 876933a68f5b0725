"""An evaluation's cases as rows: JSON Lines, or Parquet (the columns of ``results.parquet``).

Each row is a case's record (`core.evaluation.final_record`, or a live one while it is not
final) with the evaluation's identity on it (group, environment, split, seed), so rows from many
evaluations can be concatenated and still say where they came from. Never the task's hidden
answer: a record does not hold it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from nodus_ray.core.evaluation import results_parquet
from nodus_ray.core.redaction import Redactor

__all__ = ["case_row", "case_lines", "cases_parquet"]


def case_row(group: str, evaluation: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """A case's record with the evaluation's identity first."""
    return {
        "group": group,
        "environment": evaluation.get("environment"),
        "version": evaluation.get("version"),
        "split": evaluation.get("split"),
        "seed": evaluation.get("seed"),
        **record,
    }


def case_lines(
    group: str, evaluation: dict[str, Any], records: Iterable[dict[str, Any]], redact: Redactor
) -> Iterator[bytes]:
    """One case a line, UTF-8 JSON, newline-terminated."""
    for record in records:
        row = redact.tree(case_row(group, evaluation, record))
        yield (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def cases_parquet(
    group: str, evaluation: dict[str, Any], records: Sequence[dict[str, Any]], redact: Redactor
) -> bytes:
    """Every case as one row of a Parquet file, the schema ``results.parquet`` has."""
    return results_parquet(group, evaluation, [redact.tree(record) for record in records])
