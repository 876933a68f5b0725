"""Batches from a file: one AgentGroup per output file, one row per task, resumable.

``nodus batch run tasks.jsonl --agent worker --out answers.parquet`` (and `run_batch`, which a
``ray job submit`` driver calls) reads tasks from JSONL, CSV or Parquet (one task per row:
``key``, ``input``, optional ``depends_on``), runs them as one AgentGroup with a live progress
display, and writes one row per task (`ROW_FIELDS`) to Parquet, JSONL or CSV, chosen by the
output's extension.

Resuming is the point of naming the group after the output file: the same command run again
(after a Ctrl-C, a lost laptop, a killed job) finds the same group, submits only the tasks the
group does not have, and waits. Finished tasks are not run again: their runs are finished in
the group, or their rows are in the output already. The output is rewritten (atomically, so
an interrupted write leaves the previous file) every few seconds while the batch runs.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from .client import Client
from .errors import Conflict, Invalid, NotFound
from .group import AgentGroup
from .resources import GROUP_TERMINAL_PHASES, TERMINAL_PHASES

__all__ = [
    "ROW_FIELDS",
    "BatchProgress",
    "BatchResult",
    "batch_group_name",
    "log_progress",
    "read_rows",
    "read_tasks",
    "run_batch",
]

ROW_FIELDS = (
    "key",
    "run",
    "phase",
    "reason",
    "answer",
    "cost_usd",
    "model",
    "turns",
    "queued_seconds",
    "run_seconds",
    "created_at",
    "finished_at",
)
_TASK_COLUMNS = ("key", "input", "depends_on")
_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
_WRITE_EVERY_SECONDS = 5.0
_POLL_SECONDS = 0.5


def _format(path: Path, what: str) -> str:
    found = _FORMATS.get(path.suffix.lower())
    if found is None:
        raise Invalid(f"{what} {str(path)!r} must end in .jsonl, .csv or .parquet", details={"field": what})
    return found


# -- reading tasks ------------------------------------------------------------------------------


def _dependencies(value: Any, where: str) -> list[str]:
    """A list as it is; in CSV a string of keys separated by commas or spaces (or a JSON list)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                raise Invalid(
                    f"{where}.depends_on is not a JSON list: {text[:60]!r}",
                    details={"field": f"{where}.depends_on"},
                ) from None
        else:
            return [part for part in text.replace(",", " ").split() if part]
    if not isinstance(value, (list, tuple)):
        raise Invalid(
            f"{where}.depends_on must be a list of task keys", details={"field": f"{where}.depends_on"}
        )
    return [str(item) for item in value]


def _task(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = [column for column in row if column not in _TASK_COLUMNS]
    if unknown:
        raise Invalid(
            f"{where}: unknown column {unknown[0]!r}; a task has key, input and depends_on",
            details={"field": f"{where}.{unknown[0]}"},
        )
    key = row.get("key")
    if key is None or key == "":
        raise Invalid(f"{where} has no key", details={"field": f"{where}.key"})
    if "input" not in row or row["input"] is None:
        raise Invalid(f"{where} has no input", details={"field": f"{where}.input"})
    task: dict[str, Any] = {"key": str(key), "input": row["input"]}
    depends = _dependencies(row.get("depends_on"), where)
    if depends:
        task["depends_on"] = depends
    return task


def read_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The tasks of a JSONL, CSV or Parquet file, as ``{key, input, depends_on?}`` dicts.

    Refuses, naming the line or row: a row that is not an object, a missing key or input, an
    unknown column. Keys and dependencies are checked further when the tasks are submitted.
    """
    path = Path(path)
    kind = _format(path, "tasks file")
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
            return [_task(row, f"{path.name} row {index + 1}") for index, row in enumerate(rows)]
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Invalid(f"tasks file {str(path)!r} does not exist", details={"field": "tasks file"}) from None
    except (OSError, ValueError) as exc:
        raise Invalid(
            f"cannot read tasks file {str(path)!r}: {exc}", details={"field": "tasks file"}
        ) from None
    if kind == "csv":
        reader = csv.DictReader(io.StringIO(text))
        return [_task(row, f"{path.name} line {index + 2}") for index, row in enumerate(reader)]
    tasks = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            row = json.loads(line)
        except RecursionError:
            raise Invalid(f"{where} is nested too deep", details={"field": where}) from None
        except ValueError as exc:
            raise Invalid(f"{where} is not JSON: {exc}", details={"field": where}) from None
        if not isinstance(row, dict):
            raise Invalid(f"{where} must be a JSON object with key and input", details={"field": where})
        tasks.append(_task(row, where))
    return tasks


# -- rows ---------------------------------------------------------------------------------------


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    parsed = [datetime.fromisoformat(value.replace("Z", "+00:00")) for value in (start, end)]
    return round((parsed[1] - parsed[0]).total_seconds(), 3)


def _row(run: Mapping[str, Any], answer: str | None) -> dict[str, Any]:
    status = run.get("status") or {}
    turns = status.get("turns") or []
    started = status.get("admittedAt") or status.get("createdAt")
    return {
        "key": (run.get("spec") or {}).get("taskKey"),
        "run": (run.get("metadata") or {}).get("name"),
        "phase": status.get("phase"),
        "reason": status.get("reason"),
        "answer": answer,
        "cost_usd": str((status.get("cost") or {}).get("totalUSD") or "0"),
        "model": turns[-1].get("model") if turns else None,
        "turns": len(turns),
        "queued_seconds": _seconds(
            status.get("createdAt"), status.get("admittedAt") or status.get("startedAt")
        ),
        "run_seconds": _seconds(started, status.get("finishedAt")),
        "created_at": status.get("createdAt"),
        "finished_at": status.get("finishedAt"),
    }


def read_rows(path: str | Path) -> dict[str, dict[str, Any]]:
    """The rows of an earlier output, by task key ({} when there is none yet)."""
    path = Path(path)
    kind = _format(path, "output")
    if not path.exists():
        return {}
    if kind == "parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif kind == "csv":
        rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    else:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {str(row["key"]): row for row in rows if row.get("key") is not None}


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace the output atomically: a reader (or an interrupted write) sees old or new, whole."""
    import pyarrow as pa

    kind = _format(path, "output")
    schema = pa.schema(
        [
            ("key", pa.string()),
            ("run", pa.string()),
            ("phase", pa.string()),
            ("reason", pa.string()),
            ("answer", pa.large_string()),
            ("cost_usd", pa.decimal128(20, 6)),
            ("model", pa.string()),
            ("turns", pa.int32()),
            ("queued_seconds", pa.float64()),
            ("run_seconds", pa.float64()),
            ("created_at", pa.string()),
            ("finished_at", pa.string()),
        ]
    )
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        temporary.write_text(
            "".join(
                json.dumps({k: row.get(k) for k in ROW_FIELDS}, ensure_ascii=False) + "\n" for row in rows
            ),
            encoding="utf-8",
        )
    else:
        typed = [
            {
                **{k: row.get(k) for k in ROW_FIELDS},
                "cost_usd": Decimal(str(row.get("cost_usd") or "0")),
                "turns": int(row.get("turns") or 0),
                "queued_seconds": _float(row.get("queued_seconds")),
                "run_seconds": _float(row.get("run_seconds")),
            }
            for row in rows
        ]
        table = pa.Table.from_pylist(typed, schema=schema)
        if kind == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, temporary)
        else:
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, temporary)
    os.replace(temporary, path)


def _float(value: Any) -> float | None:
    return None if value is None or value == "" else float(value)


# -- running ------------------------------------------------------------------------------------


def batch_group_name(out: str | Path) -> str:
    """The group a batch writing to ``out`` runs in: the same output, the same group."""
    digest = hashlib.sha256(str(Path(out).resolve()).encode("utf-8")).hexdigest()[:12]
    return f"batch-{digest}"


@dataclass
class BatchProgress:
    """What the progress display shows, from the group's status."""

    total: int
    done: int = 0
    failed: int = 0
    active: int = 0
    queued: int = 0
    spent: str = "0"
    cap: str | None = None
    blocked: str | None = None  # why nothing can start, when that is the case (the group says)

    def line(self, group: str) -> str:
        cap = f" of ${self.cap}" if self.cap else ""
        blocked = f"; waiting: {self.blocked}" if self.blocked else ""
        return (
            f"{group}: {self.done}/{self.total} done ({self.failed} failed), {self.active} active, "
            f"{self.queued} queued, ${self.spent}{cap} spent{blocked}"
        )


@dataclass
class BatchResult:
    group: str
    out: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    submitted: int = 0  # tasks this call submitted (the rest were in the group or the output)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row.get("phase") != "Succeeded"]


def run_batch(
    tasks: str | Path | list[dict[str, Any]],
    *,
    agent: str,
    out: str | Path,
    max_active: int | None = None,
    max_cost: str | None = None,
    group: str | None = None,
    client: Client | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
) -> BatchResult:
    """Run ``tasks`` (a file, or task dicts) as one AgentGroup of ``agent`` and write ``out``.

    Blocks until every task has finished, calling ``on_progress`` after each look at the group.
    Raises `errors.Invalid` for bad tasks or an unknown format before anything is sent, and
    `errors.Conflict` when the group of this output runs another agent or is sealed while
    tasks are missing from it.
    """
    out = Path(out)
    _format(out, "output")
    items = read_tasks(tasks) if isinstance(tasks, (str, Path)) else list(tasks)
    keys = [str(task.get("key")) for task in items]
    client = client or Client()
    name = group or batch_group_name(out)
    previous = read_rows(out)
    try:
        resource = client.get("agentgroups", name)
        handle = AgentGroup(resource, client=client)
        spec = resource.get("spec") or {}
        if spec.get("agent") != agent:
            raise Conflict(
                f"agentgroup/{name} (the group of {out}) runs agent {spec.get('agent')!r}, not "
                f"{agent!r}; write to another output or pass another --group",
                details={"field": "agent"},
            )
        _update_limits(client, name, spec, max_active, max_cost)
    except NotFound:
        handle = AgentGroup.create(name, agent, max_active=max_active, max_cost=max_cost, client=client)
        spec = {}
    members = {
        str((resource.get("spec") or {}).get("taskKey")): resource for resource in client.group_runs(name)
    }
    missing = [task for task in items if task["key"] not in members and task["key"] not in previous]
    if missing:
        if spec.get("sealed"):
            raise Conflict(
                f"agentgroup/{name} is sealed and lacks {len(missing)} of these tasks; "
                "write to another output to run them",
                code="GroupSealed",
            )
        handle.submit_many(missing)
    if not spec.get("sealed"):
        handle.seal()
    result = BatchResult(group=name, out=out, submitted=len(missing))
    answers: dict[str, str | None] = {}
    last_write = 0.0
    rows: list[dict[str, Any]] = []
    listed_counts: Any = None
    while True:
        group_status = client.get("agentgroups", name).get("status") or {}
        finished = group_status.get("phase") in GROUP_TERMINAL_PHASES
        write_due = finished or time.monotonic() - last_write > _WRITE_EVERY_SECONDS
        # The members are listed (every run of the group) only when the group's counts moved or
        # a write is due: while they stand still the rows are what they were.
        if write_due or group_status.get("counts") != listed_counts:
            listed_counts = group_status.get("counts")
            runs = {str((r.get("spec") or {}).get("taskKey")): r for r in client.group_runs(name)}
            rows = _rows(client, keys, runs, previous, answers)
        progress = _progress(len(keys), rows, group_status)
        if on_progress is not None:
            on_progress(progress)
        if write_due:
            _write_rows(out, [row for row in rows if row.get("phase") in TERMINAL_PHASES])
            last_write = time.monotonic()
        if finished:
            result.rows = rows
            return result
        time.sleep(_POLL_SECONDS)


def _update_limits(
    client: Client, name: str, spec: Mapping[str, Any], max_active: int | None, max_cost: str | None
) -> None:
    """A resumed batch with other limits: move the group's limits (a lower cap is refused)."""
    patch: dict[str, Any] = {}
    if max_active is not None and (spec.get("limits") or {}).get("maxActive") != max_active:
        patch["limits"] = {"maxActive": max_active}
    if (
        max_cost is not None
        and spec.get("maxCostUSD") is not None
        and Decimal(str(spec["maxCostUSD"])) != Decimal(str(max_cost))
    ):
        patch["maxCostUSD"] = str(max_cost)
    if patch:
        client.patch("agentgroups", name, {"spec": patch})


def _rows(
    client: Client,
    keys: list[str],
    runs: Mapping[str, Mapping[str, Any]],
    previous: Mapping[str, dict[str, Any]],
    answers: dict[str, str | None],
) -> list[dict[str, Any]]:
    """One row per task in the file's order: from its run (answer fetched once, when finished),
    else from the earlier output."""
    rows = []
    for key in keys:
        run = runs.get(key)
        if run is None:
            rows.append(previous.get(key) or {"key": key, "phase": "Pending"})
            continue
        status = run.get("status") or {}
        if status.get("phase") in TERMINAL_PHASES and key not in answers:
            answers[key] = _answer(client, str((run.get("metadata") or {}).get("name")))
        rows.append(_row(run, answers.get(key)))
    return rows


def _answer(client: Client, run: str) -> str | None:
    try:
        return str(client.run_answer(run).get("answer") or "")
    except Conflict:  # AnswerNotReady: the run ended without one
        return None


def _progress(total: int, rows: list[dict[str, Any]], status: Mapping[str, Any]) -> BatchProgress:
    counts = status.get("counts") or {}
    cost = status.get("cost") or {}
    finished = [row for row in rows if row.get("phase") in TERMINAL_PHASES]
    return BatchProgress(
        total=total,
        done=len(finished),
        failed=sum(1 for row in finished if row.get("phase") != "Succeeded"),
        active=int(counts.get("active") or 0) + int(counts.get("waiting") or 0),
        queued=int(counts.get("queued") or 0),
        spent=str(cost.get("totalUSD") or "0"),
        cap=cost.get("limitUSD"),
        # Nothing works and runs are left (queued, or waiting for a person): the group says why.
        blocked=(
            status.get("message")
            if not counts.get("active") and (counts.get("queued") or counts.get("waiting"))
            else None
        ),
    )


def log_progress(group: str, every: float = 5.0, stream: Any = None) -> Callable[[BatchProgress], None]:
    """A progress callback for logs (``ray job logs``): one line when something changed, at most
    every ``every`` seconds, and always the last."""
    stream = stream or sys.stderr
    state: dict[str, Any] = {"at": 0.0, "line": None}

    def show(progress: BatchProgress) -> None:
        line = progress.line(group)
        now = time.monotonic()
        if line != state["line"] and (now - state["at"] >= every or progress.done == progress.total):
            print(line, file=stream, flush=True)
            state.update(at=now, line=line)

    return show
