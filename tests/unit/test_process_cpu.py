"""`benchmarks/process_cpu.py` counts a short-lived descendant's CPU under its service.

Run actors are worker processes that end before a benchmark's window does; a sampler that read
only the processes alive at the end would miss them, and they are the figure it is for.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from process_cpu import ProcessCpu  # noqa: E402

# Fixed work (not a length of time): a child of the service process that ends inside the window.
_WORK = "import hashlib\nh = b''\nfor _ in range(400_000): h = hashlib.sha256(h).digest()\n"
_SERVICE = (
    "import subprocess, sys\n"
    "sys.stdin.readline()\n"
    f"subprocess.run([sys.executable, '-c', {_WORK!r}, 'worker'], check=True)\n"
)


def test_a_descendant_that_ended_inside_the_window_is_counted(tmp_path: Path) -> None:
    marker = str(tmp_path / "service-marker")
    service = subprocess.Popen([sys.executable, "-c", _SERVICE, marker], stdin=subprocess.PIPE, text=True)
    try:
        with ProcessCpu(marker, interval=0.01) as sampler:
            service.communicate("go\n", timeout=120)  # the worker starts, works and ends in here
    finally:
        service.kill()
    assert service.returncode == 0
    counted = sampler.by_role()
    assert sum(count for _role, _cpu, count in counted) == 2, counted  # the service and its worker
    assert sampler.total() > 0.05, counted  # the worker's hashing, read while it ran
