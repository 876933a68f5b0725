"""A command gets exactly its sandbox's rlimits, wherever they are set.

Under bubblewrap as root the host-side launcher sets them before bubblewrap starts
(`limits._launcher_argv`, in dash or bash, whose ``ulimit`` flags and units differ); elsewhere
the prologue sets them after the uid drop (`limits._shell_argv`). Both must give the command the
same soft and hard limits.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nodus_ray.sandbox import SandboxLimits, create_sandbox
from nodus_ray.sandbox import limits as limits_module

LIMITS = SandboxLimits(
    cpu_seconds=7, memory_bytes=512 << 20, file_size_bytes=3 << 20, processes=50, timeout_seconds=30
)
# bash reports -v and -f in KiB; the CPU limit's hard value is 2 s above its soft one.
SHOW = "ulimit -St; ulimit -Ht; ulimit -Sv; ulimit -Hv; ulimit -Sf; ulimit -Hf; ulimit -Su; ulimit -Hu"
EXPECTED = ["7", "9", "524288", "524288", "3072", "3072", "50", "50"]


def _shells() -> list[str]:
    return [shell for shell in (limits_module._DASH, limits_module._BASH) if os.path.exists(shell)]


@pytest.mark.parametrize("shell", _shells())
def test_the_launcher_sets_the_same_limits_as_the_prologue(
    shell: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if shell == limits_module._BASH:
        monkeypatch.setattr(limits_module, "_DASH", str(tmp_path / "no-dash"))  # as on a host without dash
    launched = limits_module._launcher_argv(LIMITS, None, ["/bin/bash", "-c", SHOW])
    assert launched[0] == shell
    prologue = limits_module._shell_argv(SHOW, LIMITS)
    outputs = [
        subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
        for argv in (launched, prologue)
    ]
    assert outputs[0] == outputs[1] == EXPECTED


def test_the_launcher_joins_the_cgroup_file_it_is_given_then_runs_the_command(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    argv = limits_module._launcher_argv(LIMITS, procs, ["/bin/sh", "-c", 'echo "$$"'])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    # The launcher execs the command: the pid it wrote is the command's own.
    assert procs.read_text().strip() == out.strip()


def test_a_sandboxed_command_sees_exactly_its_limits(tmp_path: Path) -> None:
    box = create_sandbox(tmp_path / "ws", LIMITS)
    try:
        result = box.run(SHOW)
    finally:
        box.delete()
    assert result.exit_code == 0, result.output
    assert result.output.split() == EXPECTED
