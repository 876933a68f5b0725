"""What the benchmark scripts share: a service of their own, waiting on a condition, filler text.

The scripts run as ``python benchmarks/<name>.py``, so this module is imported by its name
(the script's directory is on ``sys.path``).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

__all__ = ["NODUS", "auth_headers", "temporary_service", "wait_until", "words"]

NODUS = str(Path(sys.executable).parent / "nodus")

T = TypeVar("T")


def auth_headers(env: dict[str, str]) -> dict[str, str]:
    """The operator token `nodus up` stored in the service's home, as a request header."""
    import json

    stored = json.loads((Path(env["HOME"]) / ".nodus" / "credentials.json").read_text())
    (entry,) = stored["servers"].values()  # one service per temporary home
    return {"Authorization": f"Bearer {entry['token']}"}


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``condition`` until it returns something truthy; exit the script after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            sys.exit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def words(rng: random.Random, chars: int, vocabulary: Sequence[str]) -> str:
    """About ``chars`` characters of words drawn from ``vocabulary``."""
    parts: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(vocabulary)
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:chars].strip()


@contextmanager
def temporary_service(prefix: str, **settings: str) -> Iterator[dict[str, str]]:
    """The environment of a nodus with its own home, storage and sandbox root (plus
    ``settings``, e.g. ``NODUS_OFFLINE_LATENCY``); `nodus down` and the files removed after.
    The caller runs ``nodus up`` with it (some benchmarks restart it on purpose)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o711)  # sandboxed commands run as another uid and must traverse to their workspace
    for part in ("home", "storage", "sandboxes"):
        (base / part).mkdir(mode=0o711)
    env = {
        **os.environ,
        "HOME": str(base / "home"),
        "NODUS_STORAGE": str(base / "storage"),
        "NODUS_SANDBOX_ROOT": str(base / "sandboxes"),
        "RAY_USAGE_STATS_ENABLED": "0",
        **settings,
    }
    env.pop("ANTHROPIC_API_KEY", None)
    try:
        yield env
    finally:
        subprocess.run([NODUS, "down"], env=env, capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)
