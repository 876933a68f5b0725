"""Environments: deterministic task batches, hidden answers, honest graders, and the registry.

The python-fix grader runs its hidden checks in the real sandbox (bubblewrap, and the process
fallback), on a copy made the way the grader makes one: a plain directory under pytest's tmp.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from nodus_ray.environments import (
    ENTRY_POINT_GROUP,
    Environment,
    EnvironmentNotFound,
    Grade,
    GraderError,
    GradingWorkspace,
    Task,
    available,
    refresh,
    resolve,
)
from nodus_ray.environments.arithmetic import ArithmeticV2, last_number
from nodus_ray.environments.python_fix import PythonFix
from nodus_ray.models.base import ModelRequest
from nodus_ray.models.offline import OfflineProvider
from nodus_ray.sandbox import CommandResult
from nodus_ray.sandbox import backend as sandbox_backend

ARITHMETIC = "nodus/arithmetic-v2@2.0.0"
PYTHON_FIX = "nodus/python-fix@1.0.0"
PLAIN_RE = re.compile(r"^(?:What is [0-9+\-*() ]+\?|Compute [0-9+\-*() ]+\.)$")
NUMBER_TOKEN_RE = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
NOWHERE = GradingWorkspace(Path("/nonexistent-grading-workspace"))


def _task_json(task: Task) -> str:
    return json.dumps(
        {"id": task.id, "prompt": task.prompt, "files": dict(task.files), "answer": task.answer},
        sort_keys=True,
    )


def _offline_reply(prompt: str) -> str:
    """What the built-in offline model answers a run with this prompt (one turn, no tools)."""
    response = OfflineProvider().complete(
        ModelRequest(
            model="offline-haiku", system="", messages=[{"role": "user", "content": prompt}], max_tokens=1024
        )
    )
    assert response.stop_reason == "end_turn", f"the offline model wanted tools for {prompt!r}"
    return "".join(block.get("text", "") for block in response.content if block.get("type") == "text")


def _standalone_numbers(text: str) -> set[str]:
    return {token.replace(",", "") for token in NUMBER_TOKEN_RE.findall(text)}


# -- data types --------------------------------------------------------------------------------


def test_task_checks_its_id_and_files_and_keeps_files_read_only() -> None:
    task = Task(id="test-007", prompt="p", files={"a/b.py": "x"}, answer=3)
    assert "answer" not in repr(task) and "3" not in repr(task).replace("test-007", "")
    with pytest.raises(TypeError):
        task.files["c.py"] = "y"  # type: ignore[index]
    for bad_id in ("Test-1", "-a", "a-", "a_b", "x" * 21, ""):
        with pytest.raises(ValueError, match="DNS label"):
            Task(id=bad_id, prompt="p")
    for bad_path in ("../x", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(ValueError, match="relative"):
            Task(id="t-1", prompt="p", files={bad_path: "x"})
    with pytest.raises(ValueError):
        Task(id="t-1", prompt="  ")


def test_grade_enforces_verdict_and_reward_and_cuts_evidence() -> None:
    assert Grade("pass", 1, "ok").reward == 1.0
    assert Grade("partial", 0.25, "a\n  b").evidence == "a b"
    for verdict, reward in (
        ("pass", 0.5),
        ("partial", 1.0),
        ("partial", 0.0),
        ("fail", 0.1),
        ("invalid", 1.0),
        ("maybe", 0.0),
        ("fail", float("nan")),
        ("pass", True),
    ):
        with pytest.raises(ValueError):
            Grade(verdict, reward, "e")  # type: ignore[arg-type]
    assert len(Grade("fail", 0.0, "x" * 2000).evidence) == 500


# -- determinism and splits ----------------------------------------------------------------------


@pytest.mark.parametrize("ref", [ARITHMETIC, PYTHON_FIX])
def test_batches_are_deterministic_prefixes_and_splits_differ(ref: str) -> None:
    environment = resolve(ref)
    first = environment.tasks("test", 7, 30)
    again = type(environment)().tasks("test", 7, 30)
    assert [_task_json(t) for t in first] == [_task_json(t) for t in again]
    assert [t.id for t in first[:3]] == ["test-000", "test-001", "test-002"]
    assert len({t.id for t in first}) == 30
    # A smaller batch is a prefix of a larger one; another seed gives other tasks.
    assert [_task_json(t) for t in environment.tasks("test", 7, 12)] == [_task_json(t) for t in first[:12]]
    assert [t.prompt for t in environment.tasks("test", 8, 30)] != [t.prompt for t in first]
    # Splits never share a task: they partition the task space.
    train = environment.tasks("train", 7, 30)
    assert {t.id.split("-")[0] for t in train} == {"train"}
    if ref == ARITHMETIC:
        assert not {t.prompt for t in train} & {t.prompt for t in first}
    else:
        assert not {tuple(t.files.values()) for t in train} & {tuple(t.files.values()) for t in first}


@pytest.mark.parametrize("ref", [ARITHMETIC, PYTHON_FIX])
def test_batches_are_identical_in_another_python_process(ref: str) -> None:
    code = textwrap.dedent(f"""
        import json
        from nodus_ray.environments import resolve
        tasks = resolve({ref!r}).tasks("train", 123, 25)
        print(json.dumps([{{"id": t.id, "prompt": t.prompt, "files": dict(t.files), "answer": t.answer}}
                          for t in tasks], sort_keys=True))
    """)
    env = {**os.environ, "PYTHONHASHSEED": "4242"}  # hash() salted differently from this process
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    ).stdout
    here = json.loads(
        json.dumps([json.loads(_task_json(t)) for t in resolve(ref).tasks("train", 123, 25)], sort_keys=True)
    )
    assert json.loads(out) == here


@pytest.mark.parametrize("ref", [ARITHMETIC, PYTHON_FIX])
def test_bad_requests_are_refused(ref: str) -> None:
    environment = resolve(ref)
    with pytest.raises(ValueError, match="train, test"):
        environment.tasks("validation", 0, 5)
    for count in (0, -1, 1001):
        with pytest.raises(ValueError, match="1 to 1000"):
            environment.tasks("test", 0, count)
    assert len(environment.tasks("test", 0, 1)) == 1


def test_describe_lists_what_the_api_shows() -> None:
    assert resolve(PYTHON_FIX).describe() == {
        "ref": PYTHON_FIX,
        "owner": "nodus",
        "name": "python-fix",
        "version": "1.0.0",
        "description": PythonFix.description,
        "splits": ["train", "test"],
        "maxTasks": 1000,
        "image": None,
    }


# -- arithmetic ----------------------------------------------------------------------------------


def test_arithmetic_mixes_plain_and_word_tasks_and_hides_every_answer() -> None:
    tasks = [
        t for seed in range(3) for split in ("train", "test") for t in ArithmeticV2().tasks(split, seed, 150)
    ]
    plain = [t for t in tasks if PLAIN_RE.match(t.prompt)]
    assert 0.6 <= len(plain) / len(tasks) <= 0.8
    for task in tasks:
        assert isinstance(task.answer, int) and not task.files
        assert str(task.answer) not in _standalone_numbers(task.prompt), task.prompt
        if task not in plain:
            assert not any(str(abs(task.answer)) in n for n in _standalone_numbers(task.prompt)), task.prompt


@pytest.mark.parametrize(
    ("answer", "expected", "verdict"),
    [
        ("444", 444, "pass"),
        ("37 * 12 = 444.", 444, "pass"),
        ("The total is 1,234.", 1234, "pass"),
        ("1,234,567 apples", 1234567, "pass"),
        ("3 - 17 = -14.", -14, "pass"),
        ("It is \u221214", -14, "pass"),
        ("444.0", 444, "pass"),
        ("14", -14, "fail"),
        ("444.5", 444, "fail"),
        ("It is 444, not 412", 444, "fail"),  # the final number counts
        ("I am not sure.", 444, "invalid"),
        ("", 444, "invalid"),
        ("version v2", 2, "invalid"),
    ],
)
def test_arithmetic_grader_reads_the_final_number(answer: str, expected: int, verdict: str) -> None:
    task = Task(id="test-000", prompt="What is it?", answer=expected)
    grade = ArithmeticV2().grade(task, answer, NOWHERE)
    assert grade.verdict == verdict
    assert grade.reward == (1.0 if verdict == "pass" else 0.0)
    assert str(expected) not in _standalone_numbers(grade.evidence)


def test_arithmetic_fail_evidence_names_the_answers_number_only() -> None:
    grade = ArithmeticV2().grade(Task(id="t-1", prompt="What is 2 * 3?", answer=6), "37 * 12 = 412.", NOWHERE)
    assert grade.evidence == "the answer's final number 412 is not the expected result"
    assert last_number("1,234.") is not None and last_number("x=-3")[0] == -3  # type: ignore[index]


def test_the_offline_model_passes_plain_tasks_and_not_word_problems() -> None:
    environment = ArithmeticV2()
    tasks = environment.tasks("test", 0, 120) + environment.tasks("train", 5, 120)
    verdicts: dict[bool, set[str]] = {True: set(), False: set()}
    for task in tasks:
        reply = _offline_reply(task.prompt)
        grade = environment.grade(task, reply, NOWHERE)
        plain = bool(PLAIN_RE.match(task.prompt))
        verdicts[plain].add(grade.verdict)
        assert grade.verdict == "pass" if plain else grade.verdict in ("fail", "invalid"), (
            task.prompt,
            reply,
        )
        assert str(task.answer) not in _standalone_numbers(grade.evidence)
    assert verdicts[True] == {"pass"} and verdicts[False] <= {"fail", "invalid"} and verdicts[False]


# -- grading workspace ---------------------------------------------------------------------------


def test_grading_workspace_reads_only_inside_its_root(tmp_path: Path) -> None:
    root = tmp_path / "copy"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("outside")
    (root / "out").symlink_to(tmp_path / "secret.txt")
    (root / "in").symlink_to(root / "sub" / "a.txt")
    (root / "up").symlink_to(tmp_path)
    os.mkfifo(root / "pipe")
    workspace = GradingWorkspace(root)
    assert workspace.read_text("sub/a.txt") == "inside"
    assert workspace.read_text("in") == "inside"
    for path in (
        "../secret.txt",
        str(tmp_path / "secret.txt"),
        "out",
        "up/secret.txt",
        "missing",
        "sub",
        "pipe",
        "sub/../../secret.txt",
    ):
        assert workspace.read_text(path) is None, path
    assert workspace.exists("sub") and workspace.exists("pipe") and not workspace.exists("out")
    assert not workspace.exists("../secret.txt") and not workspace.exists("missing")


def test_grading_workspace_writes_never_follow_a_planted_symlink(tmp_path: Path) -> None:
    root = tmp_path / "copy"
    root.mkdir()
    target = tmp_path / "host-file"
    target.write_text("host")
    (root / "check.py").symlink_to(target)
    GradingWorkspace(root).write_text("check.py", "print('hi')")
    assert target.read_text() == "host"
    assert not (root / "check.py").is_symlink() and (root / "check.py").read_text() == "print('hi')"
    with pytest.raises(ValueError):
        GradingWorkspace(root).write_text("../escape.py", "x")


# -- python-fix ----------------------------------------------------------------------------------


@pytest.fixture(params=["bubblewrap", "process"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Grade under bubblewrap (skipped where it cannot run) and under the process fallback."""
    if request.param == "bubblewrap":
        if not sandbox_backend.bwrap_available():
            pytest.skip(f"bubblewrap cannot run here: {sandbox_backend._probe_bwrap()}")
    else:
        monkeypatch.setattr(sandbox_backend, "_probe_bwrap", lambda: "disabled for this test")
    return request.param


def _blocks(module_text: str) -> list[str]:
    return module_text.split("\n\n\ndef ")


def _copy(tmp_path: Path, task: Task, source: str | None) -> GradingWorkspace:
    """A grading copy holding the seeded files, with the module replaced by ``source`` (None: deleted)."""
    root = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
    root.mkdir()
    for path, text in task.files.items():
        (root / path).write_text(text)
    module = root / task.answer["module"]
    if source is None:
        module.unlink()
    else:
        module.write_text(source)
    return GradingWorkspace(root)


def _oracle_passes(task: Task, source: str) -> int:
    """How many hidden checks ``source`` passes, computed here without the grader."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # our own generated code
    return sum(1 for call, expected in task.answer["cases"] if repr(eval(call, namespace)) == expected)


def _evidence_leaks(task: Task, evidence: str) -> list[str]:
    """Expected values found in the evidence (beyond the "N of M hidden checks passed" counts)."""
    rest = re.sub(r"^\d+ of \d+ hidden checks passed", "", evidence)
    return [
        value
        for _, value in task.answer["cases"]
        if re.search(rf"(?<![\w']){re.escape(value)}(?![\w'])", rest)
    ]


def _two_bug_task() -> Task:
    for task in PythonFix().tasks("test", 3, 60):
        seeded, solution = _blocks(next(iter(task.files.values()))), _blocks(task.answer["solution"])
        if sum(a != b for a, b in zip(seeded, solution, strict=True)) == 2:
            return task
    raise AssertionError("no task with two bugs in the batch")


def test_python_fix_tasks_hide_the_solution_and_the_checks() -> None:
    for task in PythonFix().tasks("train", 0, 40):
        module = task.answer["module"]
        assert list(task.files) == [module] and f"`{module}`" in task.prompt
        seeded = task.files[module]
        assert task.answer["solution"] != seeded and task.answer["solution"] not in task.prompt
        differing = [
            b for a, b in zip(_blocks(seeded), _blocks(task.answer["solution"]), strict=True) if a != b
        ]
        assert 1 <= len(differing) <= 2
        assert 2 <= len(_blocks(seeded)) - 1 <= 4
        for block in differing:  # the fixed function appears nowhere the agent can see
            assert block not in seeded and block not in task.prompt
        for call, _expected in task.answer["cases"]:
            assert call not in task.prompt and call not in seeded
        # The seeded module fails at least one check; the solution passes them all.
        assert _oracle_passes(task, seeded) < len(task.answer["cases"])
        assert _oracle_passes(task, task.answer["solution"]) == len(task.answer["cases"])


def test_python_fix_grades_the_workspace_in_the_sandbox(tmp_path: Path, backend: str) -> None:
    environment = PythonFix()
    task = _two_bug_task()
    module = task.answer["module"]
    seeded, solution = task.files[module], task.answer["solution"]
    total = len(task.answer["cases"])

    untouched = environment.grade(task, "I could not fix it.", _copy(tmp_path, task, seeded))
    assert untouched.verdict in ("fail", "partial") and untouched.reward < 1.0
    assert untouched.reward == pytest.approx(_oracle_passes(task, seeded) / total)
    assert "failing:" in untouched.evidence

    fixed = environment.grade(task, "Fixed.", _copy(tmp_path, task, solution))
    assert (fixed.verdict, fixed.reward) == ("pass", 1.0)
    assert fixed.evidence == f"{total} of {total} hidden checks passed"

    # Fix one of the two bugs: the reward is the share of checks the half-fixed module passes.
    blocks, good = _blocks(seeded), _blocks(solution)
    first_bug = next(i for i, (a, b) in enumerate(zip(blocks, good, strict=True)) if a != b)
    half = "\n\n\ndef ".join(good[: first_bug + 1] + blocks[first_bug + 1 :])
    expected = _oracle_passes(task, half)
    assert 0 < expected < total
    partial = environment.grade(task, "Fixed one.", _copy(tmp_path, task, half))
    assert partial.verdict == "partial" and partial.reward == pytest.approx(expected / total)
    assert partial.evidence.startswith(f"{expected} of {total} hidden checks passed; failing: ")

    broken = environment.grade(task, "", _copy(tmp_path, task, solution + "\ndef broken(:\n"))
    assert (broken.verdict, broken.reward) == ("invalid", 0.0)
    assert "does not import: SyntaxError" in broken.evidence

    deleted = environment.grade(task, "", _copy(tmp_path, task, None))
    assert (deleted.verdict, deleted.reward) == ("invalid", 0.0) and "missing" in deleted.evidence

    for grade in (untouched, fixed, partial, broken, deleted):
        assert not _evidence_leaks(task, grade.evidence), grade.evidence


class _QuickFix(PythonFix):
    """Short timeouts, so the misbehaving-module tests stay fast."""

    import_timeout: ClassVar[float] = 3.0
    call_timeout: ClassVar[float] = 3.0


class _RecordingWorkspace(GradingWorkspace):
    written: list[str]

    def write_text(self, path: str, text: str) -> None:
        self.written = [*getattr(self, "written", []), text]
        super().write_text(path, text)


def test_python_fix_expected_values_never_enter_the_sandbox(tmp_path: Path) -> None:
    task = _two_bug_task()
    workspace = _RecordingWorkspace(_copy(tmp_path, task, task.answer["solution"]).root)
    assert PythonFix().grade(task, "", workspace).verdict == "pass"
    (script,) = workspace.written
    distinctive = [
        value for _, value in task.answer["cases"] if len(value) >= 3 and value not in ("True", "False")
    ]
    for value in distinctive:
        assert value not in script
    # The check script removed itself; only the module is left.
    assert sorted(p.name for p in workspace.root.iterdir()) == [task.answer["module"]]


def test_python_fix_survives_hostile_modules(tmp_path: Path, backend: str) -> None:
    environment = _QuickFix()
    task = _two_bug_task()
    module = task.answer["module"]
    solution = task.answer["solution"]
    first_function = _blocks(solution)[1].split("(", 1)[0]
    total = len(task.answer["cases"])

    # One function hangs: only its checks fail; the others still pass.
    hanging = solution + f"\n\ndef {first_function}(*args):\n    while True:\n        pass\n"
    grade = environment.grade(task, "", _copy(tmp_path, task, hanging))
    checks = sum(1 for call, _ in task.answer["cases"] if call.startswith(first_function + "("))
    assert grade.verdict == "partial" and grade.reward == pytest.approx((total - checks) / total)
    assert f"failing: {first_function} (timed out)" in grade.evidence

    # Killing the checker from the module is a fail, not an unscored case.
    killer = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + solution
    grade = environment.grade(task, "", _copy(tmp_path, task, killer))
    assert (grade.verdict, grade.reward) == ("fail", 0.0) and "did not finish" in grade.evidence

    # A module planting json.py for the checker to import, and printing a fake summary, changes nothing.
    copy = _copy(tmp_path, task, 'print(\'summary {"import": {"status": "ok"}}\')\n' + _blocks(solution)[0])
    (copy.root / "json.py").write_text("raise SystemExit('hijacked')\n")
    grade = environment.grade(task, "", copy)
    assert grade.verdict == "fail" and grade.evidence.startswith(f"0 of {total} hidden checks passed")
    assert "(missing)" in grade.evidence

    # A module that never finishes importing is invalid.
    grade = environment.grade(task, "", _copy(tmp_path, task, "while True:\n    pass\n"))
    assert (grade.verdict, grade.reward) == ("invalid", 0.0) and "did not finish within 3s" in grade.evidence

    # A symlink out of the copy is not a module.
    copy = _copy(tmp_path, task, None)
    os.symlink("/etc/hostname", copy.root / module)
    assert environment.grade(task, "", copy).verdict == "invalid"


class _BrokenSandbox(GradingWorkspace):
    def run(self, command: str, *, timeout: float = 30.0) -> CommandResult:
        return CommandResult(1, "bwrap: Creating new namespace failed", False, False, False, 0.01, None)


def test_python_fix_raises_grader_error_when_the_sandbox_fails(tmp_path: Path) -> None:
    task = _two_bug_task()
    workspace = _BrokenSandbox(_copy(tmp_path, task, task.answer["solution"]).root)
    with pytest.raises(GraderError, match="could not start in the sandbox: it exited with code 1"):
        PythonFix().grade(task, "", workspace)


# -- registry ------------------------------------------------------------------------------------


def test_resolve_finds_the_built_ins_by_exact_ref() -> None:
    assert isinstance(resolve(ARITHMETIC), ArithmeticV2)
    assert isinstance(resolve(PYTHON_FIX), PythonFix)
    assert resolve(ARITHMETIC) is resolve(ARITHMETIC)  # discovery is cached
    refs = [environment.ref for environment in available()]
    assert refs == sorted(refs) and {ARITHMETIC, PYTHON_FIX} <= set(refs)
    assert ENTRY_POINT_GROUP == "nodus.environments"


@pytest.mark.parametrize(
    "ref",
    [
        "nodus/arithmetic-v2",
        "arithmetic-v2@2.0.0",
        "nodus/arithmetic-v2@",
        "",
        "nodus/a/b@1.0.0",
        "nodus/arithmetic-v2@2.0.0 ",
    ],
)
def test_resolve_refuses_malformed_refs(ref: str) -> None:
    with pytest.raises(ValueError, match="owner/name@version"):
        resolve(ref)


def test_resolve_names_the_installed_versions_when_one_is_missing() -> None:
    with pytest.raises(EnvironmentNotFound) as caught:
        resolve("nodus/arithmetic-v2@9.9.9")
    assert caught.value.ref == "nodus/arithmetic-v2@9.9.9"
    assert caught.value.known == [ARITHMETIC]
    assert str(caught.value) == (
        "environment nodus/arithmetic-v2@9.9.9 is not installed; installed versions of "
        "nodus/arithmetic-v2: 2.0.0"
    )
    with pytest.raises(EnvironmentNotFound) as caught:
        resolve("nobody/nothing@1.0.0")
    assert {ARITHMETIC, PYTHON_FIX} <= set(caught.value.known) and "installed environments" in str(
        caught.value
    )
    assert isinstance(caught.value, LookupError)


ACME_MODULE = """
from nodus_ray.environments import Environment, Grade, Task


class AcmeCount(Environment):
    owner = "acme"
    name = "count"
    version = "0.1.0"
    description = "Count the letters."

    def tasks(self, split, seed, count):
        self.check_request(split, seed, count)
        return [Task(id=self.task_id(split, i), prompt="How many letters: " + "a" * (i + 1), answer=i + 1)
                for i in range(count)]

    def grade(self, task, answer, workspace):
        if answer.strip() == str(task.answer):
            return Grade("pass", 1.0, "counted right")
        return Grade("fail", 0.0, "counted wrong")


class Impostor(AcmeCount):
    owner = "nodus"
    name = "arithmetic-v2"
    version = "2.0.0"


class BadVersion(AcmeCount):
    name = "bad"
    version = "latest"


NOT_AN_ENVIRONMENT = 42
"""

ACME_ENTRY_POINTS = f"""
[{ENTRY_POINT_GROUP}]
acme-count = acme_envs:AcmeCount
acme-missing = acme_envs_missing:Nope
acme-not-env = acme_envs:NOT_AN_ENVIRONMENT
acme-impostor = acme_envs:Impostor
acme-bad-version = acme_envs:BadVersion
"""


@pytest.fixture
def acme_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A third-party distribution on sys.path, as ``pip install acme-envs`` would leave it."""
    site = tmp_path / "site"
    info = site / "acme_envs-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "acme_envs.py").write_text(ACME_MODULE)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ACME_ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))  # first on sys.path: it is discovered before nodus-ray
    refresh()
    yield site
    refresh()  # lazy: the next lookup rescans after monkeypatch has restored sys.path
    sys.modules.pop("acme_envs", None)


def test_a_third_party_environment_is_found_through_its_entry_point(
    acme_installed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="nodus_ray.environments.registry"):
        acme = resolve("acme/count@0.1.0")
        assert type(acme).__module__ == "acme_envs" and isinstance(acme, Environment)
        task = acme.tasks("test", 0, 3)[2]
        assert acme.grade(task, "3", NOWHERE).verdict == "pass"
        # The impostor came first on sys.path, yet the built-in keeps its ref.
        assert isinstance(resolve(ARITHMETIC), ArithmeticV2)
        assert {"acme/count@0.1.0", ARITHMETIC, PYTHON_FIX} <= {e.ref for e in available()}
        with pytest.raises(EnvironmentNotFound):
            resolve("acme/bad@0.1.0")
    warnings = " ".join(record.getMessage() for record in caplog.records)
    for name in ("acme-missing", "acme-not-env", "acme-impostor", "acme-bad-version"):
        assert name in warnings
    assert "ModuleNotFoundError" in warnings and "not a semantic version" in warnings


def test_refresh_forgets_an_uninstalled_environment(
    acme_installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve("acme/count@0.1.0").ref == "acme/count@0.1.0"
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(acme_installed)])
    assert resolve("acme/count@0.1.0").ref == "acme/count@0.1.0"  # cached until refreshed
    refresh()
    with pytest.raises(EnvironmentNotFound):
        resolve("acme/count@0.1.0")
    assert isinstance(resolve(ARITHMETIC), ArithmeticV2)
