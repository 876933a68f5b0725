"""`benchmarks/cost_accounting.py` keeps running against the current run loop.

The script subclasses `Conversation` to time its model calls; when the loop's internals changed
it stopped running and nothing noticed (issue 16). A few seeded runs here, over-reporting
replies included so the clamp is exercised, fail the suite instead. The figures themselves are
the benchmark's business (benchmarks/RESULTS.md), not this test's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_cost_accounting_benchmark_runs_and_its_accounting_holds(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "cost_accounting.py"),
            "--runs",
            "4",
            "--overreport",
            "0.3",
            "--dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "FAIL" not in done.stderr
    assert "journal re-derivation: 4/4 runs agree; 0 wrong charge(s)" in done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 20")]
    assert len(rows) == 1 and rows[0].split("|")[2].strip() == "4 (1)", done.stdout
