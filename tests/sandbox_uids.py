"""Host uids for sandbox tests: which processes run as one, and one that nothing runs as."""

from __future__ import annotations

import os
import random

__all__ = ["processes_of", "unused_uid"]


def processes_of(uid: int) -> list[int]:
    """Host pids whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                for line in status:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pids


def unused_uid() -> int:
    """A uid nothing runs as, random so concurrent test runs do not share (and reap) one."""
    while True:
        uid = random.randrange(300_000, 2_000_000)
        if uid != 65534 and not processes_of(uid):
            return uid
