"""`benchmarks/control_plane_sim.py` keeps running against the current control plane.

The simulation gives the control plane in-process launchers instead of Ray's (the facade's
constructor arguments) and each real `GroupSupervisor` its client after construction; if
either seam moves, the benchmark would stop running (or, worse, start a Ray of its own) and
nothing would notice. A few runs through every phase here fail the suite instead. The figures
are the benchmark's business (benchmarks/RESULTS.md), not this test's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_control_plane_simulation_runs_every_phase_without_ray() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "control_plane_sim.py"),
            "--runs",
            "30",
            "--max-active",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Ray instance" not in done.stderr  # no Ray started: the simulation is in process
    assert "| plain runs, 16 clients creating | 30 (30 succeeded) |" in done.stdout
    assert "| one group, maxActive 4, batches of 100 | 30 (30 succeeded) |" in done.stdout
    assert "| finish: outcome merged, actor released | 30 |" in done.stdout
    assert "1 started (it never ends), 29 queued throughout" in done.stdout
