"""``nodus apply``, ``patch`` and ``delete``: writing resources, from files or by name.

``apply`` and ``delete -f`` validate every document of every file before anything is sent
(`manifests.load_manifests`), so a typo in the third document leaves the first two untouched.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..errors import NotFound
from . import root
from .manifests import Manifest, load_manifests
from .root import ProjectOption, TargetsArgument, UsageError, parse_targets, ref

__all__ = ["apply", "patch", "delete"]


def _revision_marks(resource: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What changes when an apply changed something: the revision, generation and labels."""
    if resource is None:
        return None
    metadata = resource.get("metadata") or {}
    status = resource.get("status") or {}
    return (status.get("revision"), metadata.get("generation"), metadata.get("labels") or {})


def _manifest_project(manifest: Manifest, project: str | None) -> str | None:
    """The document's project unless -p names another, which is refused like kubectl does."""
    if project and manifest.project and manifest.project != project:
        raise UsageError(
            f"{manifest.ref} names project {manifest.project!r} but -p is {project!r}; "
            f"pass -p {manifest.project} or remove metadata.project"
        )
    return manifest.project or project


def apply(
    filenames: Annotated[
        list[str], typer.Option("--filename", "-f", help="YAML file to apply (repeatable; - reads stdin).")
    ],
    project: ProjectOption = None,
) -> None:
    """Create or update every resource of the files, in order; all are validated first."""
    manifests = load_manifests(filenames)
    for manifest in manifests:
        if manifest.kind == "Token":  # before anything is sent: all or nothing, like every refusal here
            raise UsageError(
                f"{manifest.ref}: a Token is not applied from a file; create it with "
                "`nodus create token NAME --role ROLE` (its value is shown once)"
            )
    client = root.client(project)
    for manifest in manifests:
        target_project = _manifest_project(manifest, project)
        try:
            before = client.get(manifest.collection, manifest.name, project=target_project)
        except NotFound:
            before = None
        body = manifest.body()
        if manifest.files is not None:  # a Python agent's program, packed from spec.source's path
            source = client.upload_source(manifest.files, project=target_project)
            body["spec"] = {**body["spec"], "source": source}
        applied = client.apply(manifest.collection, body, project=target_project)
        if applied.result in ("created", "configured", "unchanged"):
            verb = applied.result
        elif applied.created:
            verb = "created"
        elif before is not None and _revision_marks(before) == _revision_marks(applied.resource):
            verb = "unchanged"
        else:
            verb = "configured"
        typer.echo(f"{manifest.ref} {verb}")


def patch(
    target: TargetsArgument,
    patch_text: Annotated[
        str, typer.Option("--patch", help='A JSON merge patch, e.g. \'{"spec":{"state":"Stopped"}}\'.')
    ],
    project: ProjectOption = None,
) -> None:
    """Change a resource with a JSON merge patch."""
    try:
        body = json.loads(patch_text)
    except RecursionError:
        raise UsageError("--patch is nested too deep") from None
    except ValueError as exc:
        raise UsageError(f"--patch is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise UsageError("--patch must be a JSON object")
    client = root.client(project)
    for kind, collection, name in parse_targets(target, need_name=True):
        assert name is not None
        client.patch(collection, name, body)
        typer.echo(f"{ref(kind, name)} patched")


def delete(
    target: Annotated[
        list[str] | None,
        typer.Argument(help="KIND/NAME, or KIND NAME.", metavar="KIND/NAME", show_default=False),
    ] = None,
    filenames: Annotated[
        list[str] | None, typer.Option("--filename", "-f", help="Delete the resources of these files.")
    ] = None,
    ignore_not_found: Annotated[
        bool, typer.Option("--ignore-not-found", help="Treat a missing resource as deleted.")
    ] = False,
    project: ProjectOption = None,
) -> None:
    """Delete resources; a run is cancelled first, a group goes with all its runs, an agent only
    once no unfinished run uses it."""
    if target and filenames:
        raise UsageError("name resources as KIND/NAME or pass -f FILE, not both")
    if not target and not filenames:
        raise UsageError("name resources as KIND/NAME or KIND NAME, or pass -f FILE")
    if filenames:
        items = [
            (m.kind, m.collection, m.name, _manifest_project(m, project)) for m in load_manifests(filenames)
        ]
    else:
        items = [
            (k, c, n, project) for k, c, n in parse_targets(target or [], need_name=True) if n is not None
        ]
    client = root.client(project)
    for kind, collection, name, target_project in items:
        try:
            client.delete(collection, name, project=target_project)
        except NotFound:
            if not ignore_not_found:
                raise
            continue
        typer.echo(f"{ref(kind, name)} {'revoked' if kind == 'Token' else 'deleted'}")
