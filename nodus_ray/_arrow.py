"""pyarrow without numpy in the engine's Ray worker processes.

Every run is a Ray actor in a fresh worker process, so what the engine imports is paid once per
run. pyarrow imports numpy when it can (about 90 ms and 25 MB here), yet the engine uses pyarrow
only for storage (``pyarrow.fs``), Arrow IPC journal segments and Parquet written from Python
lists, none of which needs numpy; pyarrow (16 and later) treats numpy as optional and runs
without it. So in a Ray worker, pyarrow is loaded first with numpy hidden for the length of that
import (`load_pyarrow`), and numpy is importable again right after: code that wants it still
gets it, only pyarrow's numpy conversions (``to_numpy``) are off in that process. Drivers (the
CLI, tests, a user's script) are left alone. Decision 54.
"""

from __future__ import annotations

import os
import sys

__all__ = ["load_pyarrow", "in_ray_worker"]


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (an actor's or a task's), not a driver."""
    return os.path.basename(sys.argv[0] if sys.argv else "") == "default_worker.py"


def load_pyarrow() -> None:
    """Import pyarrow; in a Ray worker where numpy is not loaded yet, without numpy."""
    if "pyarrow.lib" in sys.modules or "numpy" in sys.modules or not in_ray_worker():
        return
    sys.modules["numpy"] = None  # type: ignore[assignment]  # pyarrow: "ImportError: no numpy"
    try:
        import pyarrow.lib  # noqa: F401
    finally:
        if sys.modules.get("numpy", 0) is None:
            del sys.modules["numpy"]
