"""Which Environments are installed: discovered through Python entry points, by ref.

Third parties add Environments as their own Python packages, declaring for example::

    [project.entry-points."nodus.environments"]
    acme-count = "acme_envs:AcmeCount"

so nobody edits this package to add one. An entry point may name an :class:`Environment`
subclass (instantiated with no arguments) or an instance.

Discovery imports third-party code, so it is done once and cached; :func:`refresh` forgets
it (after installing a package, or in tests). One broken package must not take every
evaluation down with it: an entry point that fails to import, names something that is not an
Environment, or declares a malformed owner/name/version is skipped with a logged warning.
When two entry points give the same ref the first wins, and this distribution's own entry
points always come first, so a third-party package cannot replace a built-in by shadowing it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from importlib.metadata import EntryPoint, entry_points

from nodus_ray.environments.base import REF_PART_RE, SEMVER_RE, Environment

__all__ = ["ENTRY_POINT_GROUP", "EnvironmentNotFound", "resolve", "available", "refresh"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nodus.environments"
_OWN_DISTRIBUTION = "nodus-ray"
_REF_RE = re.compile(r"^(?P<owner>[^/@\s]+)/(?P<name>[^/@\s]+)@(?P<version>[^/@\s]+)$")


class EnvironmentNotFound(LookupError):
    """No installed Environment has this ref; ``known`` lists what is installed instead.

    ``known`` holds the refs of the same owner/name when there are any (the usual mistake is a
    version), else every installed ref.
    """

    def __init__(self, ref: str, known: list[str]) -> None:
        self.ref = ref
        self.known = list(known)
        super().__init__(ref, self.known)

    def __str__(self) -> str:
        if not self.known:
            return f"environment {self.ref} is not installed; no environments are installed"
        base = self.ref.split("@", 1)[0]
        if all(known.split("@", 1)[0] == base for known in self.known):
            versions = ", ".join(known.split("@", 1)[1] for known in self.known)
            return f"environment {self.ref} is not installed; installed versions of {base}: {versions}"
        return f"environment {self.ref} is not installed; installed environments: {', '.join(self.known)}"


def _ordered(points: list[EntryPoint]) -> list[EntryPoint]:
    """This distribution's entry points first, then the rest in discovery order."""

    def is_own(point: EntryPoint) -> bool:
        dist = getattr(point, "dist", None)
        name = getattr(dist, "name", None) or ""
        return name.lower().replace("_", "-") == _OWN_DISTRIBUTION

    return sorted(points, key=lambda point: not is_own(point))  # stable: keeps discovery order


def _check(environment: Environment) -> str | None:
    """Why this Environment cannot be registered, or None."""
    for attribute in ("owner", "name", "version", "description"):
        if not isinstance(getattr(environment, attribute, None), str):
            return f"its {attribute} is not a string"
    if not REF_PART_RE.match(environment.owner) or not REF_PART_RE.match(environment.name):
        return f"owner/name {environment.owner}/{environment.name} is not lower-case letters, digits, '.', '_', '-'"
    if not SEMVER_RE.match(environment.version):
        return f"version {environment.version!r} is not a semantic version such as 1.0.0"
    splits = environment.splits
    if not isinstance(splits, tuple) or not splits or not all(isinstance(s, str) and s for s in splits):
        return "its splits are not a non-empty tuple of names"
    if len(set(splits)) != len(splits):
        return "its splits repeat a name"
    max_tasks = environment.max_tasks
    if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1:
        return f"its max_tasks {max_tasks!r} is not a positive int"
    return None


def _load(point: EntryPoint) -> Environment | None:
    """The Environment an entry point names, or None (and a warning) when it is broken."""
    try:
        loaded = point.load()
        if isinstance(loaded, type) and issubclass(loaded, Environment):
            environment = loaded()
        elif isinstance(loaded, Environment):
            environment = loaded
        else:
            logger.warning(
                "skipping environment entry point %s = %s: it is not an Environment subclass or instance",
                point.name,
                point.value,
            )
            return None
    except Exception as error:  # noqa: BLE001 - third-party code: anything can go wrong
        logger.warning(
            "skipping environment entry point %s = %s: %s: %s",
            point.name,
            point.value,
            type(error).__name__,
            error,
        )
        return None
    why = _check(environment)
    if why is not None:
        logger.warning("skipping environment entry point %s = %s: %s", point.name, point.value, why)
        return None
    return environment


@functools.cache
def _installed() -> dict[str, Environment]:
    found: dict[str, Environment] = {}
    for point in _ordered(list(entry_points(group=ENTRY_POINT_GROUP))):
        environment = _load(point)
        if environment is None:
            continue
        if environment.ref in found:
            logger.warning(
                "environment entry point %s = %s gives %s, which an earlier entry point already "
                "gave; keeping the first",
                point.name,
                point.value,
                environment.ref,
            )
            continue
        found[environment.ref] = environment
    return found


def refresh() -> None:
    """Forget what was discovered, so the next lookup scans the installed entry points again."""
    _installed.cache_clear()
    importlib.invalidate_caches()  # a package installed since may live in a directory already cached


def available() -> list[Environment]:
    """Every installed Environment, sorted by ref."""
    installed = _installed()
    return [installed[ref] for ref in sorted(installed)]


def resolve(ref: str) -> Environment:
    """The installed Environment with exactly this ``owner/name@version``.

    ValueError when ``ref`` is not of that form (a missing version included: evaluations pin
    one, so a new release never changes what an old evaluation measured); EnvironmentNotFound
    when it is well-formed but not installed.
    """
    match = _REF_RE.match(ref) if isinstance(ref, str) else None
    if match is None:
        raise ValueError(
            f"environment ref must be owner/name@version (e.g. nodus/arithmetic-v2@2.0.0), got {ref!r}"
        )
    installed = _installed()
    environment = installed.get(ref)
    if environment is not None:
        return environment
    base = f"{match['owner']}/{match['name']}"
    same = sorted(known for known in installed if known.split("@", 1)[0] == base)
    raise EnvironmentNotFound(ref, same or sorted(installed))
