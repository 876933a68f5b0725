"""What the benchmark scripts share: waiting on a condition, and filler text of a given size.

The scripts run as ``python benchmarks/<name>.py``, so this module is imported by its name
(the script's directory is on ``sys.path``).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["wait_until", "words"]

T = TypeVar("T")


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
