"""Fencing: of two actors of one run, only the newest may write.

Ray gives no guarantee that an actor it declared dead is dead: a node cut off from the GCS (a
partition, a frozen VM, a process stopped with SIGSTOP) keeps running its actors while the
control plane, told the actor died, starts a replacement that replays the journal. When the old
one (the *zombie*) wakes, it must not write a journal record, run a command, bill a model call
or overwrite the answer: the replacement owns the run now.

So every actor that serves a run holds an *epoch*, its attempt number (``status.attempts``,
which the control plane raises before each new actor), and:

1. claims it before it loads the journal, by creating ``<run>/epochs/<attempt>`` create-only
   (`Storage.create_bytes`): two actors can never hold one epoch;
2. before every journal write, every workspace snapshot and the answer, checks that no newer
   epoch exists (`Epoch.check`), and again after writing a step's ``Started`` and before its
   effect (`durable.steps`);
3. writes journal segments create-only, so a write that races the check (the zombie checked,
   then the replacement claimed, loaded and wrote segment N) fails with `JournalConflict`
   rather than replacing what the replacement wrote.

This is the fencing-token argument over linearizable storage (local disk, S3 since 2020): the
replacement's claim happens before its load; a zombie's ``Started`` either is in that load
(the replacement sees a started, unfinished step and treats it as interrupted) or was written
after it, and then the zombie's check after ``Started`` sees the newer epoch and stops before
the effect. A zombie that had already passed that check when it froze finishes that one effect
(nothing can call back a process that is already running a command), and then stops at its
next write, which is the ``Completed`` the replacement is waiting for in vain: the replacement
resolves that step as interrupted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from nodus_ray.store import layout
from nodus_ray.store.storage import AlreadyExists, Storage
from nodus_ray.store.timestamps import utc_now

__all__ = ["Epoch", "Fenced", "JournalConflict"]


class Fenced(Exception):  # noqa: N818 - what happened to the actor, as the docs say it
    """A newer actor serves this run: this one must stop writing and doing."""

    def __init__(self, prefix: str, attempt: int, newest: int, where: str = "") -> None:
        if newest == attempt:
            why = f"another actor already claimed attempt {attempt}"
        else:
            why = f"attempt {newest} has taken over from attempt {attempt}"
        super().__init__(f"{prefix}: fenced, {why}" + (f" ({where})" if where else ""))
        self.prefix = prefix
        self.attempt = attempt
        self.newest = newest
        self.where = where

    def __reduce__(self) -> tuple[type[Fenced], tuple[str, int, int, str]]:
        return (Fenced, (self.prefix, self.attempt, self.newest, self.where))  # it crosses Ray's processes


class JournalConflict(Exception):
    """Another actor wrote the journal record this one was about to write (same seq)."""

    def __init__(self, prefix: str, seq: int) -> None:
        super().__init__(f"{prefix}: journal record {seq} was written by another actor of the run")
        self.prefix = prefix
        self.seq = seq

    def __reduce__(self) -> tuple[type[JournalConflict], tuple[str, int]]:
        return (JournalConflict, (self.prefix, self.seq))


@dataclass(frozen=True)
class Epoch:
    """The epoch one actor holds on one run (``prefix`` is the run's storage prefix)."""

    storage: Storage
    prefix: str
    attempt: int

    def claim(self) -> None:
        """Create this attempt's claim; `Fenced` if it is held already or a newer one exists."""
        claim = {"attempt": self.attempt, "claimedAt": utc_now()}
        try:
            self.storage.create_bytes(layout.run_epoch(self.prefix, self.attempt), json.dumps(claim).encode())
        except AlreadyExists:
            raise Fenced(self.prefix, self.attempt, self.attempt) from None
        self.check()

    def newest(self) -> int:
        """The highest epoch claimed so far (-1 when none is)."""
        claims = [
            int(name) for name in self.storage.list_dir(layout.epochs_folder(self.prefix)) if name.isdigit()
        ]
        return max(claims, default=-1)

    def check(self, where: str = "") -> None:
        """Raise `Fenced` when a newer actor has claimed the run (``where``: what it was about to do)."""
        newest = self.newest()
        if newest > self.attempt:
            raise Fenced(self.prefix, self.attempt, newest, where)
