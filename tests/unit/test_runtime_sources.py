"""Reading and checking an Agent's source: what is taken from a directory, and each refusal with
the field and the words that tell the user what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodus._runtime.sources import MAX_SOURCE_BYTES, MAX_SOURCE_FILES, check_source, source_files
from nodus.errors import Invalid


def test_a_directory_is_read_recursively_without_caches_dot_files_and_bytecode(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / "main.py").write_text("def main(ctx, input):\n    return 1\n")
    (tmp_path / "pkg" / "util.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\x00\xff")
    (tmp_path / "pkg" / "old.pyc").write_bytes(b"\x00\xff")
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / ".venv" / "lib" / "x.py").write_text("")
    (tmp_path / ".env").write_text("SECRET=1")
    (tmp_path / "requirements.txt").write_text("httpx\n")
    assert source_files(tmp_path) == {
        "main.py": "def main(ctx, input):\n    return 1\n",
        "pkg/util.py": "X = 1\n",
        "requirements.txt": "httpx\n",
    }
    assert source_files(tmp_path / "main.py") == {"main.py": "def main(ctx, input):\n    return 1\n"}
    assert source_files({"./a/b.py": "", "c.py": "x"}) == {"a/b.py": "", "c.py": "x"}


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"/etc/passwd": ""}, "is absolute"),
        ({"a/../../b.py": ""}, "contains '..'"),
        ({"a.py": b"bytes"}, "must be text"),
        ({f"f{i}.py": "" for i in range(MAX_SOURCE_FILES + 1)}, "more than 1000 files"),
        ({"big.txt": "x" * (MAX_SOURCE_BYTES + 1)}, "larger than 4 MiB"),
    ],
)
def test_a_dict_source_is_refused_naming_what_is_wrong(files: dict[str, object], words: str) -> None:
    with pytest.raises(Invalid, match=words) as refused:
        source_files(files)  # type: ignore[arg-type]
    assert refused.value.details == {"field": "source"}


def test_a_directory_over_a_limit_or_with_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(Invalid, match="source file blob.bin is not UTF-8 text"):
        source_files(tmp_path)
    (tmp_path / "blob.bin").unlink()
    (tmp_path / "big.txt").write_bytes(b"x" * (MAX_SOURCE_BYTES + 1))
    with pytest.raises(Invalid, match="the limit is 4194304 bytes"):
        source_files(tmp_path)
    with pytest.raises(Invalid, match="neither a file nor a directory"):
        source_files(tmp_path / "missing")


def test_check_source_names_the_file_and_line_of_a_syntax_error() -> None:
    files = {"main.py": "def main(ctx, input):\n    return 1\n", "lib/helpers.py": "x = 1\n\ndef f(:\n"}
    with pytest.raises(Invalid) as refused:
        check_source(files, "main:main")
    assert str(refused.value) == "lib/helpers.py line 3: invalid syntax"
    assert refused.value.details == {"field": "spec.source"}


@pytest.mark.parametrize(
    ("entrypoint", "words"),
    [
        ("main", "is not module:function"),
        ("missing:main", "has no module missing"),
        ("main:nope", "nope is not defined at the top level of main"),
        ("main:inner", "inner is not defined at the top level"),
    ],
)
def test_check_source_refuses_an_entrypoint_that_is_not_defined(entrypoint: str, words: str) -> None:
    files = {"main.py": "def main(ctx, input):\n    def inner():\n        pass\n    return inner\n"}
    with pytest.raises(Invalid, match=words) as refused:
        check_source(files, entrypoint)
    assert refused.value.details == {"field": "spec.entrypoint"}


def test_check_source_accepts_every_way_a_module_binds_a_name_at_top_level() -> None:
    files = {
        "app/__init__.py": "",
        "app/agents.py": (
            "import json\nfrom json import dumps as entry_a\n"
            "async def entry_b(ctx, input):\n    return 1\n"
            "entry_c = entry_b\n"
            "try:\n    def entry_d(ctx, input):\n        return 2\nexcept ImportError:\n    pass\n"
            "raise SystemExit('never executed by the check')\n"
        ),
        "pkg/__init__.py": "def main(ctx, input):\n    return 0\n",
    }
    for name in ("entry_a", "entry_b", "entry_c", "entry_d"):
        check_source(files, f"app.agents:{name}")
    check_source(files, "pkg:main")  # a package's __init__.py
