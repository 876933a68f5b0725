"""Environments: versioned generators of evaluation tasks, each with its grader.

An evaluation names one by ref (``nodus/arithmetic-v2@2.0.0``), generates a fixed batch from
``(split, seed, count)``, runs each task's prompt as an ordinary agent run and grades the
answer and the workspace the agent left. Environments are found through the
``nodus.environments`` entry-point group (:mod:`.registry`), so third parties ship their own
as Python packages. The built-ins are :class:`~.arithmetic.ArithmeticV2` and
:class:`~.python_fix.PythonFix`; they are loaded through their entry points like any other,
so importing this package does not import them.

May import: ``sandbox`` (a grader runs checks in one), ``models.base``, ``store``. Not Ray,
``control`` or ``runtime``: the grader actor (``runtime.grader``) calls an Environment.
"""

from __future__ import annotations

from nodus_ray.environments.base import Environment, Grade, GraderError, Task
from nodus_ray.environments.registry import (
    ENTRY_POINT_GROUP,
    EnvironmentNotFound,
    available,
    refresh,
    resolve,
)
from nodus_ray.environments.workspace import GradingWorkspace

__all__ = [
    "Environment",
    "Task",
    "Grade",
    "GraderError",
    "GradingWorkspace",
    "EnvironmentNotFound",
    "resolve",
    "available",
    "refresh",
    "ENTRY_POINT_GROUP",
]
