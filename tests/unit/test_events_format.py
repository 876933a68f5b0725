"""The events stream's cursor and the log lines the CLI and SDK print from it."""

from __future__ import annotations

from nodus.events import RunEvent, log_line
from nodus_serve.events import parse_cursor


def test_a_cursor_is_the_next_seq_and_the_version_sent_and_a_foreign_id_starts_over() -> None:
    assert parse_cursor("12.7") == (12, 7)
    assert parse_cursor(None) == (0, -1)
    assert parse_cursor("garbage") == (0, -1)
    assert parse_cursor("-3.2") == (0, 2)


def test_log_lines() -> None:
    step = RunEvent(
        "3.1",
        "step",
        {
            "seq": 2,
            "step": "turn-1/command-1-1",
            "state": "Started",
            "attempt": 2,
            "summary": "$ ls",
            "at": "2026-11-29T21:43:38.455578Z",
        },
    )
    assert log_line(step) == "21:43:38 turn-1/command-1-1 Started (attempt 2)  $ ls"
    assert (
        log_line(
            RunEvent(
                "",
                "phase",
                {"phase": "Waiting", "reason": "NeedsResolution", "message": "resolve turn-1/command-1-1"},
            )
        )
        == "phase Waiting (NeedsResolution): resolve turn-1/command-1-1"
    )
    assert log_line(RunEvent("", "answer", {"offset": 0, "text": "42"})) == "answer:\n42"
    assert log_line(RunEvent("", "answer", {"offset": 8192, "text": "more"})) == "more"
    assert log_line(RunEvent("", "end", {"phase": "Succeeded"})) is None
