"""``spec.source`` as a path in a YAML file: the Agent's program, packed before anything is sent.

In a file, a Python agent may name its program by path (``source: ./triage`` or ``source:
main.py``), relative to the YAML file (to the working directory for stdin). `pack_source`
reads it with the SDK's own `source_files`, checks it as the server will (`check_source`: every
``.py`` file compiles, the entrypoint is defined), and puts its ``{digest, files, bytes}`` in the
document in place of the path, so the document validates like any other; ``nodus apply``
uploads the files before it applies the Agent.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .._runtime.sources import check_source, source_files
from ..errors import Invalid, NodusError
from ..schema_agent import source_ref

__all__ = ["pack_source"]


def pack_source(document: Any, source: str) -> tuple[Any, dict[str, str] | None]:
    """``(document, files)``: an Agent whose ``spec.source`` is a path gets the packed source's
    reference instead, and its files; any other document comes back as it is, with None.

    Refusals (`errors.Invalid`) name the YAML file and the source: a path that is not there,
    a file that is not UTF-8, a size limit, "main.py line 3: invalid syntax", a missing entrypoint.
    """
    if not isinstance(document, dict) or document.get("kind") != "Agent":
        return document, None
    spec = document.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("source"), str):
        return document, None
    base = Path.cwd() if source == "<stdin>" else Path(source).resolve().parent
    path = base / spec["source"]
    entrypoint = spec.get("entrypoint")
    try:
        files = source_files(path)
        if not files:
            raise Invalid(f"{spec['source']} holds no files", details={"field": "spec.source"})
        if isinstance(entrypoint, str):
            check_source(files, entrypoint)
    except NodusError as exc:
        raise type(exc)(
            f"{source}: spec.source {spec['source']}: {exc.message}",
            code=exc.code,
            details={**exc.details, "file": source},
        ) from None
    packed = copy.deepcopy(document)
    packed["spec"]["source"] = source_ref(files)
    return packed, files
