"""The CLI of durable Python agents without a server: ``nodus apply -f`` with ``spec.source`` a
path beside the YAML file (packed, checked, uploaded, replaced by its digest), and ``nodus
agentrun output|outputs|children|retry|suspend|resume|logs``. Each failure is one error line.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from nodus.cli import main as cli
from nodus.cli import root as cli_root
from nodus.schema_agent import source_ref
from tests.unit.test_python_agent_sdk import PROJECT, _FakeAPI

MAIN = "import helpers\n\n\ndef main(ctx, input):\n    return helpers.double(input)\n"
HELPERS = "def double(x):\n    return 2 * x\n"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> _FakeAPI:
    fake = _FakeAPI()
    monkeypatch.setattr(cli_root, "client", lambda project=None: fake.client())
    return fake


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli.app, list(args))


def one_error_line(result: Any) -> str:
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return str(lines[0])


def _project(tmp_path: Path, source: str = "triage", main: str = MAIN) -> Path:
    (tmp_path / "triage").mkdir()
    (tmp_path / "triage" / "main.py").write_text(main)
    (tmp_path / "triage" / "helpers.py").write_text(HELPERS)
    (tmp_path / "triage" / "requirements.txt").write_text("httpx\n")
    (tmp_path / "triage" / "__pycache__").mkdir()
    (tmp_path / "triage" / "__pycache__" / "main.cpython-312.pyc").write_bytes(b"\x00junk")
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: nodus.dev/v1
            kind: Agent
            metadata:
              name: triage
            spec:
              source: {source}
              entrypoint: main:main
              setup: pip install -r requirements.txt
              memory: 1Gi
            """
        )
    )
    return manifest


def test_apply_packs_the_source_beside_the_file_uploads_it_and_applies_its_digest(
    api: _FakeAPI, tmp_path: Path
) -> None:
    manifest = _project(tmp_path, "./triage")
    assert Path.cwd() != tmp_path  # the path is relative to the YAML file, not to the shell
    result = invoke("apply", "-f", str(manifest))
    assert result.exit_code == 0, result.output
    assert "agent/triage created" in result.output
    files = {"helpers.py": HELPERS, "main.py": MAIN, "requirements.txt": "httpx\n"}
    uploads = [body for method, path, body in api.requests if path == f"{PROJECT}/agentsources"]
    assert uploads == [{"files": files}]
    applied = [body for method, path, body in api.requests if method == "PUT"]
    assert applied[0]["spec"]["source"] == source_ref(files)
    assert applied[0]["spec"]["entrypoint"] == "main:main"
    assert applied[0]["spec"]["setup"] == "pip install -r requirements.txt"


def test_apply_of_a_single_file_source(api: _FakeAPI, tmp_path: Path) -> None:
    manifest = _project(tmp_path, "triage/helpers.py")
    manifest.write_text(manifest.read_text().replace("main:main", "helpers:double"))
    assert invoke("apply", "-f", str(manifest)).exit_code == 0
    uploads = [body for method, path, body in api.requests if path == f"{PROJECT}/agentsources"]
    assert uploads == [{"files": {"helpers.py": HELPERS}}]


@pytest.mark.parametrize(
    ("source", "main", "says"),
    [
        ("triage", "def main(ctx, input):\n    return (\n", "main.py line 2"),
        ("triage", "def run(ctx, input):\n    return 1\n", "main is not defined"),
        ("missing", MAIN, "neither a file nor a directory"),
    ],
)
def test_apply_refuses_a_bad_source_in_one_line_sending_nothing(
    api: _FakeAPI, tmp_path: Path, source: str, main: str, says: str
) -> None:
    manifest = _project(tmp_path, source, main)
    line = one_error_line(invoke("apply", "-f", str(manifest)))
    assert str(manifest) in line and says in line, line
    assert api.requests == []


def test_output_downloads_to_a_file_or_stdout(api: _FakeAPI, tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    result = invoke("agentrun", "output", "triage-1", "report", "-o", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_bytes() == api.outputs["report"]
    result = invoke("agentrun", "output", "triage-1", "report")
    assert result.exit_code == 0 and result.stdout_bytes == api.outputs["report"]
    line = one_error_line(invoke("agentrun", "output", "triage-1", "summary", "-o", str(target)))
    assert "summary" in line
    assert target.read_bytes() == api.outputs["report"]  # a refused download leaves the file alone
    listed = invoke("agentrun", "outputs", "triage-1")
    assert (
        listed.exit_code == 0
        and "report" in listed.stdout
        and str(len(api.outputs["report"])) in listed.stdout
    )


def test_children_is_a_table_of_the_runs_children(api: _FakeAPI) -> None:
    result = invoke("agentrun", "children", "triage-1")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.strip().splitlines()
    assert header.split() == ["NAME", "PHASE", "REASON", "COST", "AGE"]
    assert [row.split()[0] for row in rows] == ["triage-1-a", "triage-1-b"]


def test_retry_suspend_and_resume_say_what_they_did(api: _FakeAPI) -> None:
    for verb, said in (("suspend", "suspended; phase Waiting"), ("resume", "resumed"), ("retry", "retried")):
        result = invoke("agentrun", verb, "triage-1")
        assert result.exit_code == 0, result.output
        assert f"agentrun/triage-1 {said}" in result.stdout
    assert [path for _, path in api.writes()] == [
        f"{PROJECT}/agentruns/triage-1/{verb}" for verb in ("suspend", "resume", "retry")
    ]


def test_logs_of_a_python_run_print_its_program_log(api: _FakeAPI) -> None:
    result = invoke("agentrun", "logs", "triage-1")
    assert result.exit_code == 0 and result.stdout == "hello\nworld\n"
    result = invoke("agentrun", "logs", "triage-1", "-f")
    assert result.exit_code == 0 and result.stdout == "hello\nworld\n"


def test_verbs_on_a_missing_run_are_one_error_line(api: _FakeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            404, json={"code": "NotFound", "message": "agentrun 'nope' not found", "details": {}}
        )

    monkeypatch.setattr(api, "handle", missing)
    for args in (("children", "nope"), ("retry", "nope"), ("suspend", "nope"), ("output", "nope", "x")):
        assert "not found" in one_error_line(invoke("agentrun", *args))
