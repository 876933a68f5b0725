"""An Agent's source: the files its program is made of, read and checked the same way on both ends.

The SDK calls `source_files` (a file, a directory or a dict of files) and `check_source` before
it uploads; the server calls the same functions on what it receives, so a refusal reads the same
wherever it happens. Checking never runs the user's code: syntax by `compile`, the entrypoint by
`ast`. No I/O besides reading the given path.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from ..errors import Invalid, PayloadTooLarge

__all__ = ["MAX_SOURCE_FILES", "MAX_SOURCE_BYTES", "source_files", "check_source", "entrypoint_parts"]

MAX_SOURCE_FILES = 1000
MAX_SOURCE_BYTES = 4 << 20  # 4 MiB of UTF-8 text, all files together

_SKIP_DIRS = {"__pycache__", "node_modules"}
_ENTRYPOINT = re.compile(r"([A-Za-z_][\w-]*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*)")


def _refuse(message: str, field: str = "source") -> Invalid:
    return Invalid(message, details={"field": field})


def _clean_path(path: str) -> str:
    """A relative POSIX path without ``..``; the key a file is stored and bound under."""
    if not isinstance(path, str) or not path or "\\" in path or "\x00" in path:
        raise _refuse(f"source path {str(path)[:200]!r} is not a relative path")
    pure = PurePosixPath(path)
    if pure.is_absolute() or re.match(r"[A-Za-z]:/", path):  # also "C:/..." from Windows
        raise _refuse(f"source path {path[:200]!r} is absolute; paths are relative to the source root")
    if ".." in pure.parts:
        raise _refuse(f"source path {path[:200]!r} contains '..'")
    clean = "/".join(part for part in pure.parts if part != ".")
    if not clean:
        raise _refuse(f"source path {path[:200]!r} names no file")
    return clean


def _check_limits(count: int, total: int) -> None:
    if count > MAX_SOURCE_FILES:
        raise _refuse(f"source has more than {MAX_SOURCE_FILES} files (the limit is {MAX_SOURCE_FILES})")
    if total > MAX_SOURCE_BYTES:
        raise PayloadTooLarge(
            f"source is larger than 4 MiB (the limit is {MAX_SOURCE_BYTES} bytes)",
            details={"field": "source"},
        )


def _read(path: Path, name: str) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(f"source file {name} is not UTF-8 text") from None


def _walk(root: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    total = 0
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in sorted(names):
            if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                continue
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            _check_limits(len(files) + 1, total + path.stat().st_size)  # before reading it
            files[relative] = _read(path, relative)
            total += len(files[relative].encode("utf-8"))
    return files


def source_files(source: str | os.PathLike[str] | Mapping[str, str]) -> dict[str, str]:
    """``{relative path: text}`` from a file, a directory (recursively, without ``__pycache__``,
    dot-files and dot-directories such as ``.git`` and ``.venv``, and ``*.pyc``) or a dict.

    Raises `nodus.errors.Invalid` (``details.field == "source"``) for an absolute path or one
    with ``..``, a file that is not UTF-8 (naming it), more than 1,000 files or more than 4 MiB.
    """
    if isinstance(source, Mapping):
        files: dict[str, str] = {}
        total = 0
        for path, text in source.items():
            clean = _clean_path(path)
            if not isinstance(text, str):
                raise _refuse(f"source file {clean} must be text (a str), not {type(text).__name__}")
            if clean in files:
                raise _refuse(f"source file {clean} is given twice")
            files[clean] = text
            total += len(text.encode("utf-8", "surrogatepass"))
            _check_limits(len(files), total)
        for clean, text in files.items():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise _refuse(f"source file {clean} is not UTF-8 text") from None
        return dict(sorted(files.items()))
    if not isinstance(source, str | os.PathLike):
        raise _refuse(f"source must be a file, a directory or a dict of files, not {type(source).__name__}")
    where = Path(source)
    if where.is_file():
        return {where.name: _read(where, where.name)}
    if where.is_dir():
        return _walk(where)
    raise _refuse(f"source {str(where)[:300]} is neither a file nor a directory")


def entrypoint_parts(entrypoint: str) -> tuple[str, str]:
    """``"pkg.mod:main"`` -> ``("pkg.mod", "main")``; Invalid (``spec.entrypoint``) otherwise."""
    match = _ENTRYPOINT.fullmatch(entrypoint) if isinstance(entrypoint, str) else None
    if match is None:
        raise _refuse(
            f"entrypoint {str(entrypoint)[:200]!r} is not module:function (such as main:main)",
            "spec.entrypoint",
        )
    return match.group(1), match.group(2)


def _top_level_names(body: list[ast.stmt]) -> set[str]:
    """Names a module binds at its top level, including inside top-level if/try/with blocks."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.If | ast.With | ast.AsyncWith):
            names |= _top_level_names(node.body) | _top_level_names(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            names |= _top_level_names(node.body) | _top_level_names(node.orelse)
            names |= _top_level_names(node.finalbody)
            for handler in node.handlers:
                names |= _top_level_names(handler.body)
    return names


def check_source(files: Mapping[str, str], entrypoint: str) -> None:
    """Refuse a source whose ``.py`` files do not compile (``Invalid``, ``spec.source``, "main.py
    line 3: invalid syntax") or whose entrypoint module/function is not defined at its top level
    (``Invalid``, ``spec.entrypoint``). Reads the code with `compile` and `ast`, never runs it."""
    trees: dict[str, ast.Module] = {}
    for path, text in sorted(files.items()):
        if not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(text, path)
            compile(tree, path, "exec", dont_inherit=True)  # what the AST alone lets through
        except SyntaxError as bad:
            line = f" line {bad.lineno}" if bad.lineno else ""
            raise _refuse(f"{path}{line}: {bad.msg}", "spec.source") from None
        except ValueError as bad:  # a null byte
            raise _refuse(f"{path}: {bad}", "spec.source") from None
        trees[path] = tree
    module, function = entrypoint_parts(entrypoint)
    base = module.replace(".", "/")
    candidates = (f"{base}.py", f"{base}/__init__.py")
    found = next((trees[c] for c in candidates if c in trees), None)
    if found is None:
        raise _refuse(
            f"entrypoint {entrypoint}: the source has no module {module} ({candidates[0]} or {candidates[1]})",
            "spec.entrypoint",
        )
    if function not in _top_level_names(found.body):
        raise _refuse(
            f"entrypoint {entrypoint}: {function} is not defined at the top level of {module}",
            "spec.entrypoint",
        )
