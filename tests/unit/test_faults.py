"""Crash points fire once, only where armed, only for a matching context, and never unarmed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodus_ray import faults


def _reach(point: str, context: str, directory: Path | None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "NODUS_FAULTS"}
    if directory is not None:
        environment["NODUS_FAULTS"] = str(directory)
    code = f"from nodus_ray import faults; faults.crash_point({point!r}, {context!r}); print('went on')"
    return subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60, check=False
    )


def test_an_armed_point_kills_the_first_process_with_a_matching_context_only(tmp_path: Path) -> None:
    faults.arm(tmp_path, "step-effect-done", "agentruns/r1/")
    assert (
        _reach("step-effect-done", "projects/p/agentruns/r2/journal/turn-1/model-1", tmp_path).stdout
        == "went on\n"
    )
    assert _reach("api-answering", "projects/p/agentruns/r1/journal/x", tmp_path).stdout == "went on\n"
    died = _reach("step-effect-done", "projects/p/agentruns/r1/journal/turn-1/model-1", tmp_path)
    assert died.returncode == -signal.SIGKILL and died.stdout == ""
    fired = list(tmp_path.glob(".step-effect-done.fired.*"))
    assert len(fired) == 1 and not (tmp_path / "step-effect-done").exists()
    # Fired once: the next process to get there goes on.
    assert (
        _reach("step-effect-done", "projects/p/agentruns/r1/journal/turn-1/model-1", tmp_path).stdout
        == "went on\n"
    )


def test_without_nodus_faults_nothing_fires_and_unknown_points_are_refused(tmp_path: Path) -> None:
    faults.arm(tmp_path, "api-answering")
    assert _reach("api-answering", "POST /v1", None).stdout == "went on\n"
    with pytest.raises(ValueError, match="unknown crash point"):
        faults.arm(tmp_path, "no-such-point")


def test_a_held_point_keeps_the_process_there_until_released_and_names_its_context(tmp_path: Path) -> None:
    faults.arm(tmp_path, "step-started", "agentruns/r1/", action="hold")
    environment = {**os.environ, "NODUS_FAULTS": str(tmp_path)}
    code = (
        "from nodus_ray import faults; "
        "faults.crash_point('step-started', 'projects/p/agentruns/r1/journal/c1'); print('went on')"
    )
    held = subprocess.Popen([sys.executable, "-c", code], env=environment, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while (
            context := faults.fired_context(tmp_path, "step-started")
        ) is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the held state, with a deadline
        assert context is not None and context.startswith("projects/p/agentruns/r1/journal/c1 node=")
        assert held.poll() is None, "held at the point, not past it"
        faults.release(tmp_path, "step-started")
        out, _ = held.communicate(timeout=30)
        assert (held.returncode, out) == (0, "went on\n")
    finally:
        if held.poll() is None:
            held.kill()
