"""Reading ``-f`` files: multi-document YAML, each document validated before anything is sent.

`apply` and `delete -f` are all-or-nothing at the validation stage: a typo in the third document
must not leave the first two applied, so every document of every file is parsed with
`resources.parse_resource` first and errors name the file, the document and its line.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, TextIO

import yaml

from ..errors import Invalid, NodusError
from ..input_limits import MAX_NESTING_DEPTH, check_yaml_node
from ..resources import SHORT_NAMES, Resource, parse_resource
from .agent_sources import pack_source

__all__ = ["Manifest", "load_manifests"]

_COLLECTIONS = {kind: collection for kind, collection in SHORT_NAMES.values()}


@dataclass(frozen=True)
class Manifest:
    """One validated document and where it came from."""

    source: str
    line: int
    document: dict[str, Any]
    resource: Resource
    # A Python agent's program read from the path its spec.source named (`agent_sources`):
    # uploaded before the Agent is applied.
    files: dict[str, str] | None = None

    @property
    def kind(self) -> str:
        return self.resource.kind

    @property
    def collection(self) -> str:
        return _COLLECTIONS[self.kind]

    @property
    def name(self) -> str:
        return self.resource.metadata.name

    @property
    def project(self) -> str | None:
        return self.resource.metadata.project

    @property
    def ref(self) -> str:
        """``agent/hello-agent``, as the CLI prints it."""
        return f"{self.kind.lower()}/{self.name}"

    def body(self) -> dict[str, Any]:
        """What to send: the document as written, without the server-owned status.

        A group member may leave ``metadata.name`` out (it is ``<group>-<taskKey>``); the name
        `parse_resource` filled in is sent, since an apply is a PUT to that name.
        """
        body = {key: value for key, value in self.document.items() if key != "status"}
        metadata = body.get("metadata")
        if not isinstance(metadata, dict) or metadata.get("name") is None:
            body["metadata"] = {**(metadata if isinstance(metadata, dict) else {}), "name": self.name}
        return body


def _read(path: str, stdin: TextIO) -> tuple[str, str]:
    if path == "-":
        return "<stdin>", stdin.read()
    try:
        with open(path, encoding="utf-8") as handle:
            return path, handle.read()
    except UnicodeDecodeError:
        raise Invalid(f"{path} is not UTF-8 text", details={"file": path}) from None
    except OSError as exc:
        raise Invalid(f"cannot read {path}: {exc.strerror or exc}", details={"file": path}) from None


def _documents(source: str, text: str) -> list[tuple[int, Any]]:
    """``(line, document)`` pairs; empty documents (a stray ``---``) are skipped."""
    found: list[tuple[int, Any]] = []
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # refuses control characters already (a ReaderError)
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            check_yaml_node(node, source)  # before constructing: no alias bomb, no deep nesting
            document = loader.construct_document(node)
            if document is not None:
                found.append((node.start_mark.line + 1, document))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source} line {mark.line + 1}" if mark is not None else source
        problem = " ".join(str(exc.problem or exc.context or "malformed YAML").split())
        raise Invalid(f"{where}: {problem}", details={"file": source}) from None
    except yaml.YAMLError as exc:
        raise Invalid(f"{source}: {' '.join(str(exc).split())}", details={"file": source}) from None
    except RecursionError:  # YAML's composer recurses once per level: deeper than Python's stack
        raise Invalid(
            f"{source}: nested more than {MAX_NESTING_DEPTH} levels deep", details={"file": source}
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return found


def _expand(document: Any) -> list[Any]:
    """A ``kind: AgentList`` (or any ``...List``) stands for its items, as ``get -o yaml`` prints them."""
    if isinstance(document, dict) and str(document.get("kind", "")).endswith("List") and "items" in document:
        items = document.get("items")
        if isinstance(items, list):
            return items
    return [document]


def load_manifests(paths: list[str], stdin: TextIO | None = None) -> list[Manifest]:
    """Every document of every file, validated, in order; raises on the first bad one."""
    manifests: list[Manifest] = []
    for path in paths:
        source, text = _read(path, stdin or sys.stdin)
        documents = _documents(source, text)
        for number, (line, document) in enumerate(documents, start=1):
            for document_item in _expand(document):
                document_item, files = pack_source(document_item, source)
                try:
                    resource = parse_resource(document_item)
                except NodusError as exc:
                    where = source if len(documents) == 1 else f"{source} (document {number}, line {line})"
                    raise type(exc)(f"{where}: {exc.message}", code=exc.code, details=exc.details) from None
                manifests.append(Manifest(source, line, document_item, resource, files))
    if not manifests:
        raise Invalid(f"no resources found in {', '.join(paths)}", details={})
    return manifests
