"""What an Environment is: a versioned generator of evaluation tasks plus the grader for them.

An evaluation regenerates its batch from ``(split, seed, count)`` wherever it needs it (the
control plane to start runs, the grader to grade them), so nothing ever stores a hidden answer
and every process must get the same tasks. That is why generation is seeded from a *string*
(``random.Random(str)`` hashes it with SHA-512, identical in every Python process) and never
from ``hash()``, which is salted per process.

The agent sees only :attr:`Task.prompt` and :attr:`Task.files`; :attr:`Task.answer` is for
the grader alone. A :class:`Grade` is a scored result (``invalid`` included: the agent
answered, just not in the form asked for); :class:`GraderError` means no score at all, so an
infrastructure failure never turns into a zero reward.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from nodus_ray.environments.workspace import GradingWorkspace

__all__ = [
    "Task",
    "Grade",
    "GraderError",
    "Environment",
    "Verdict",
    "VERDICTS",
    "EVIDENCE_LIMIT",
    "TASK_ID_RE",
    "REF_PART_RE",
    "SEMVER_RE",
]

Verdict = Literal["pass", "partial", "fail", "invalid"]
VERDICTS: tuple[str, ...] = ("pass", "partial", "fail", "invalid")
EVIDENCE_LIMIT = 500
# A DNS label of at most 20 characters: task ids become part of run names.
TASK_ID_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,18}[a-z0-9])?$")
# An owner or a name in a ref ("nodus", "arithmetic-v2").
REF_PART_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$")
SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


class GraderError(Exception):
    """The grader could not grade (a broken workspace, a sandbox that failed, a crash).

    The case is left unscored, never given a zero reward: the agent is not to blame. The
    message may be shown to users, so it must not quote the hidden answer.
    """


def _check_files(files: Mapping[str, str]) -> Mapping[str, str]:
    """``files`` as a read-only copy, refusing paths that could land outside the workspace."""
    checked: dict[str, str] = {}
    for path, text in files.items():
        if not isinstance(path, str) or not isinstance(text, str):
            raise TypeError(f"Task.files maps relative paths to text, got {path!r}: {type(text).__name__}")
        pure = PurePosixPath(path)
        if not path or "\x00" in path or pure.is_absolute() or ".." in pure.parts or "\\" in path:
            raise ValueError(f"Task.files path must be relative and stay inside the workspace: {path!r}")
        checked[path] = text
    return MappingProxyType(checked)


@dataclass(frozen=True)
class Task:
    """One evaluation task: what the agent is given, and (hidden) what the grader checks against."""

    id: str  # a DNS label of at most 20 characters, unique in a batch ("test-007")
    prompt: str  # the run's input: the only text the agent sees
    # relative path -> text, put in the agent's workspace before its first command (visible)
    files: Mapping[str, str] = field(default_factory=dict)
    answer: Any = field(default=None, repr=False)  # HIDDEN: for the grader only

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not TASK_ID_RE.match(self.id):
            raise ValueError(
                f"Task.id must be a DNS label (a-z, 0-9, '-', at most 20 characters), got {self.id!r}"
            )
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError(f"Task {self.id}: the prompt must be non-empty text")
        # Read-only, so a caller cannot change a batch another caller shares.
        object.__setattr__(self, "files", _check_files(self.files))


@dataclass(frozen=True)
class Grade:
    """A scored result. ``invalid``: the answer is not in the form asked for (reward 0).

    ``evidence`` is shown to users and must never contain the hidden answer; it is cut to
    500 characters here rather than refused, so a long explanation never costs the grade.
    """

    verdict: Verdict
    reward: float
    evidence: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Grade.verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")
        reward = self.reward
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"Grade.reward must be a finite number, got {reward!r}")
        reward = float(reward)
        if self.verdict == "pass" and reward != 1.0:
            raise ValueError(f"a pass has reward 1.0, got {reward}")
        if self.verdict == "partial" and not 0.0 < reward < 1.0:
            raise ValueError(f"a partial grade has a reward strictly between 0 and 1, got {reward}")
        if self.verdict in ("fail", "invalid") and reward != 0.0:
            raise ValueError(f"a {self.verdict} grade has reward 0.0, got {reward}")
        object.__setattr__(self, "reward", reward)
        if not isinstance(self.evidence, str):
            raise TypeError(f"Grade.evidence must be text, got {type(self.evidence).__name__}")
        evidence = " ".join(self.evidence.split())
        if len(evidence) > EVIDENCE_LIMIT:
            evidence = evidence[: EVIDENCE_LIMIT - 3] + "..."
        object.__setattr__(self, "evidence", evidence)


class Environment(ABC):
    """A versioned task generator and grader; see the module docstring for the contract.

    Subclasses set the class attributes and implement :meth:`tasks` and :meth:`grade`. The
    helpers :meth:`check_request`, :meth:`task_random`, :meth:`in_split` and :meth:`task_id`
    give the determinism and split rules for free; third-party Environments may use them too.
    """

    owner: ClassVar[str]
    name: ClassVar[str]
    version: ClassVar[str]  # semver
    description: ClassVar[str]
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    max_tasks: ClassVar[int] = 1000  # per split: tasks() refuses more
    image: ClassVar[str | None] = None  # a container image the grader needs, if any

    @property
    def ref(self) -> str:
        """``owner/name@version``: what an evaluation names, pinned to one version."""
        return f"{self.owner}/{self.name}@{self.version}"

    @abstractmethod
    def tasks(self, split: str, seed: int, count: int) -> list[Task]:
        """The first ``count`` tasks of ``split`` for ``seed``: the same in every process.

        ``tasks(split, seed, n)`` is a prefix of ``tasks(split, seed, n + k)``. Raises
        ValueError for an unknown split or a count outside 1..max_tasks.
        """

    @abstractmethod
    def grade(self, task: Task, answer: str, workspace: GradingWorkspace) -> Grade:
        """Grade the run's final answer and the workspace it left; GraderError if it cannot."""

    def describe(self) -> dict[str, Any]:
        """What the API lists for this Environment."""
        return {
            "ref": self.ref,
            "owner": self.owner,
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "splits": list(self.splits),
            "maxTasks": self.max_tasks,
            "image": self.image,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.ref}>"

    # -- helpers for tasks() ------------------------------------------------------------------

    def check_request(self, split: str, seed: int, count: int) -> None:
        """ValueError unless ``split`` is known and ``count`` is 1..max_tasks; TypeError for a bad seed."""
        if split not in self.splits:
            raise ValueError(f"{self.ref} has no split {split!r}; its splits are: {', '.join(self.splits)}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= self.max_tasks:
            raise ValueError(f"{self.ref}: count must be from 1 to {self.max_tasks} per split, got {count!r}")

    def task_random(self, split: str, seed: int, index: int, attempt: int = 0) -> random.Random:
        """The RNG for one task: seeded from a string, so identical in every Python process.

        One RNG per task (not one per batch) keeps task ``i`` independent of how many tasks
        were asked for, which is what makes a smaller batch a prefix of a larger one.
        """
        return random.Random(f"{self.ref}|{split}|{seed}|{index}|{attempt}")

    def in_split(self, split: str, key: str) -> bool:
        """Whether a task whose identity is ``key`` belongs to ``split``.

        Splits partition the task space by a stable hash, so a test task can never also be
        drawn for train (no leakage between splits), whatever the seeds.
        """
        digest = hashlib.sha256(f"{self.owner}/{self.name}|{key}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % len(self.splits) == self.splits.index(split)

    @staticmethod
    def task_id(split: str, index: int) -> str:
        """``test-007``: the split and the task's position in the batch."""
        return f"{split}-{index:03d}"
