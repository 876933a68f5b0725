"""A Python program's interpreter and venv stay reachable inside bubblewrap wherever they are.

The program runs with the server's own interpreter, bound read-only at its own paths. A venv in
a clone under ``/tmp`` (CI's, a user's scratch checkout) falls inside the sandbox's private
``/tmp``: its bind needs mount points whose parents bubblewrap would make 0700 and root's, which
the sandbox uid cannot pass. These check the arguments, then run a real program there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodus_ray.sandbox import SandboxLimits, bwrap_available, create_sandbox, program
from nodus_ray.sandbox.hidden import _keep_tmp_args


def test_parents_of_a_kept_directory_under_tmp_are_made_passable_before_its_bind(tmp_path: Path) -> None:
    venv = tmp_path / "clone" / ".venv"
    sdk = tmp_path / "clone" / "sdk"
    venv.mkdir(parents=True)
    sdk.mkdir()
    args = _keep_tmp_args([str(venv), str(sdk)], hidden=[])
    clone = os.path.realpath(tmp_path / "clone")
    if not clone.startswith("/tmp/"):
        pytest.skip("pytest's temp dir is not under /tmp here")
    dirs = [args[i + 3] for i in range(len(args) - 3) if args[i : i + 3] == ["--perms", "0755", "--dir"]]
    assert clone in dirs and os.path.dirname(clone) in dirs or os.path.dirname(clone) == "/tmp"
    binds = [args[i + 1] for i, a in enumerate(args) if a == "--ro-bind"]
    assert binds == sorted([os.path.realpath(venv), os.path.realpath(sdk)])
    assert max(args.index(d) for d in dirs) < args.index("--ro-bind")  # the parents first


@pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap")
def test_an_interpreter_in_a_venv_under_tmp_runs_a_program_inside_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = Path("/tmp") / f"nodus-keep-{os.getpid()}"
    venv = base / "deep" / "venv"
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        dirs = [os.path.realpath(venv), os.path.realpath(sys.base_prefix)]
        monkeypatch.setattr(program, "interpreter_dirs", lambda: dirs)
        sandbox = create_sandbox(tmp_path / "ws")
        launch = program.ProgramLaunch(
            argv=[str(venv / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
            runtime_dir=runtime,
            limits=SandboxLimits(),
        )
        proc = program.start_program(sandbox, launch)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and output.decode().strip() == str(venv), output.decode()
    finally:
        shutil.rmtree(base, ignore_errors=True)
