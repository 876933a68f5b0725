"""``nodus agentrun export`` / ``nodus evaluation export``: what is refused before the server is asked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nodus.cli.commands_export import _check_target
from nodus.cli.root import CliError


class _Terminal:
    def isatty(self) -> bool:
        return True


def test_parquet_is_refused_to_a_terminal_and_text_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", _Terminal())
    with pytest.raises(CliError, match="--format parquet is binary and stdout is a terminal") as refused:
        _check_target(None, "parquet")
    assert refused.value.reason == "Invalid"
    _check_target(None, "inspect")  # text to a terminal is fine


def test_a_file_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="its folder does not exist"):
        _check_target(tmp_path / "missing" / "x.json", "atif")
    with pytest.raises(CliError, match="it is a directory"):
        _check_target(tmp_path, "atif")
    _check_target(tmp_path / "x.parquet", "parquet")
    _check_target(Path("relative.json"), "jsonl")  # the working directory
