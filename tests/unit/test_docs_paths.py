"""The docs name the code where it is: every repository path they mention exists.

A newcomer reads `docs/architecture.md` to find *where* something lives; a path that moved
without its doc line sends them nowhere. This checks every ``nodus_ray/...``, ``sdk/...``,
``serve/...``, ``tests/...``, ``benchmarks/...`` and ``examples/...`` path in the README and docs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PATH = re.compile(
    r"(?<![\w/.-])((?:nodus_ray|sdk|serve|tests|benchmarks|examples|dashboards)/[\w./-]*[\w/])"
)


def _mentioned() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in _PATH.finditer(doc.read_text(encoding="utf-8")):
            found.setdefault(match.group(1).rstrip("/."), set()).add(doc.name)
    return found


def test_every_path_the_docs_name_exists() -> None:
    mentioned = _mentioned()
    assert len(mentioned) > 30, "the docs name the code they describe"
    missing = {path: sorted(docs) for path, docs in mentioned.items() if not (ROOT / path).exists()}
    assert missing == {}, f"paths named in the docs that do not exist: {missing}"
