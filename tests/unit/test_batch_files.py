"""Batch files: tasks read from JSONL, CSV and Parquet alike; rows written and read back in
each format; bad files refused naming the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nodus.batch import ROW_FIELDS, _write_rows, batch_group_name, read_rows, read_tasks
from nodus.errors import Invalid

TASKS = [
    {"key": "a", "input": "What is 1 + 1?"},
    {"key": "b", "input": "What is 2 + 2?", "depends_on": ["a"]},
    {"key": "c", "input": "Both, please", "depends_on": ["a", "b"]},
]


def test_the_same_tasks_read_alike_from_jsonl_csv_and_parquet(tmp_path: Path) -> None:
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join(json.dumps(task) for task in TASKS) + "\n\n")
    csv_file = tmp_path / "tasks.csv"
    csv_file.write_text(
        'key,input,depends_on\na,What is 1 + 1?,\nb,What is 2 + 2?,a\nc,"Both, please","a, b"\n'
    )
    parquet = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist([{"depends_on": None, **task} for task in TASKS]), parquet)
    assert read_tasks(jsonl) == read_tasks(csv_file) == read_tasks(parquet) == TASKS


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("t.jsonl", '{"key": "a", "input": "x"}\nnot json\n', "t.jsonl line 2 is not JSON"),
        ("t.jsonl", '{"key": "a", "inptu": "x"}\n', "unknown column 'inptu'"),
        ("t.jsonl", '{"input": "x"}\n', "t.jsonl line 1 has no key"),
        ("t.jsonl", '{"key": "a"}\n', "t.jsonl line 1 has no input"),
        ("t.jsonl", '["a", "x"]\n', "must be a JSON object"),
        ("t.csv", "key,input\na,x\n,y\n", "t.csv line 3 has no key"),
        ("t.txt", "a", "must end in .jsonl, .csv or .parquet"),
    ],
)
def test_a_bad_tasks_file_is_refused_naming_where(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(Invalid, match=message):
        read_tasks(path)


def test_a_missing_tasks_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Invalid, match="does not exist"):
        read_tasks(tmp_path / "nope.jsonl")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_rows_are_written_and_read_back_in_each_format(tmp_path: Path, suffix: str) -> None:
    rows = [
        {
            "key": "a",
            "run": "g-a",
            "phase": "Succeeded",
            "reason": "Completed",
            "answer": "1 + 1 = 2.",
            "cost_usd": "0.000123",
            "model": "offline-haiku",
            "turns": 1,
            "queued_seconds": 0.5,
            "run_seconds": 1.25,
            "created_at": "2026-11-29T00:00:00Z",
            "finished_at": "2026-11-29T00:00:02Z",
        },
        {
            "key": "b",
            "run": "g-b",
            "phase": "Failed",
            "reason": "DeadlineExceeded",
            "answer": None,
            "cost_usd": "0",
            "model": None,
            "turns": 0,
            "queued_seconds": None,
            "run_seconds": None,
            "created_at": "2026-11-29T00:00:00Z",
            "finished_at": "2026-11-29T00:00:03Z",
        },
    ]
    out = tmp_path / f"answers{suffix}"
    _write_rows(out, rows)
    back = read_rows(out)
    assert list(back) == ["a", "b"]
    assert set(back["a"]) == set(ROW_FIELDS)
    assert back["a"]["answer"] == "1 + 1 = 2." and str(back["a"]["cost_usd"]) == "0.000123"
    assert back["b"]["phase"] == "Failed" and back["b"]["answer"] in (None, "")
    assert not list(tmp_path.glob(".*.tmp")), "the write went through a temporary file"
    if suffix == ".parquet":
        assert pq.read_schema(out).field("cost_usd").type == pa.decimal128(20, 6)


def test_the_group_of_an_output_is_stable_and_differs_per_output(tmp_path: Path) -> None:
    assert batch_group_name(tmp_path / "a.parquet") == batch_group_name(str(tmp_path / "a.parquet"))
    assert batch_group_name(tmp_path / "a.parquet") != batch_group_name(tmp_path / "b.parquet")
    assert batch_group_name(tmp_path / "a.parquet").startswith("batch-")


def test_progress_says_why_nothing_runs_when_the_group_is_blocked() -> None:
    from nodus.batch import _progress

    blocked = _progress(
        2,
        [{"key": "a", "phase": "Pending"}, {"key": "b", "phase": "Pending"}],
        {
            "counts": {"queued": 2, "active": 0},
            "message": "no queued run fits under maxCostUSD",
            "cost": {"limitUSD": "0.01"},
        },
    )
    assert blocked.line("g").endswith("waiting: no queued run fits under maxCostUSD")
    running = _progress(
        2,
        [{"key": "a", "phase": "Succeeded"}, {"key": "b", "phase": "Running"}],
        {"counts": {"queued": 0, "active": 1}, "cost": {"totalUSD": "0.01"}},
    )
    assert running.line("g") == "g: 1/2 done (0 failed), 1 active, 0 queued, $0.01 spent"
