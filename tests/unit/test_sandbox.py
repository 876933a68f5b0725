"""The sandbox must contain what a model's commands do: files, network, processes, memory, output.

Containment tests run real commands under bubblewrap and are skipped only where bubblewrap
cannot run at all.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodus_ray.sandbox import (
    BubblewrapSandbox,
    CommandResult,
    ProcessSandbox,
    Sandbox,
    SandboxLimits,
    bwrap_available,
    create_sandbox,
)
from nodus_ray.sandbox import backend as backend_module
from nodus_ray.sandbox import bubblewrap as bubblewrap_module
from nodus_ray.sandbox import hidden as hidden_module
from nodus_ray.sandbox import workspace as workspace_module
from tests.sandbox_uids import processes_of, unused_uid

needs_bwrap = pytest.mark.skipif(
    not bwrap_available(),
    reason=f"bubblewrap cannot run here: {backend_module._probe_bwrap()}",
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop only happens when running as root")
SANDBOX_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
needs_python = pytest.mark.skipif(SANDBOX_PYTHON is None, reason="no python3 on the sandbox PATH")


def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture
def make_sandbox(tmp_path: Path) -> Iterator[Callable[..., Sandbox]]:
    made: list[Sandbox] = []

    def make(
        limits: SandboxLimits | None = None,
        *,
        name: str = "ws",
        workspace: Path | None = None,
        allow_network: bool = False,
        uid: int | None = None,
        hidden_paths: tuple[Path, ...] = (),
    ) -> Sandbox:
        limits = limits or SandboxLimits(timeout_seconds=30)
        box = create_sandbox(
            workspace or tmp_path / name,
            limits,
            allow_network=allow_network,
            uid=uid,
            hidden_paths=hidden_paths,
        )
        made.append(box)
        return box

    yield make
    for box in made:
        box.delete()


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A host directory that bubblewrap commands can see: not under /tmp, which is private inside."""
    path = Path(tempfile.mkdtemp(prefix="nodus-sandbox-test-", dir="/var/tmp"))
    path.chmod(0o755)  # traversable by every uid, so only the workspace's own mode keeps runs apart
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- results ---------------------------------------------------------------------------------


def test_command_result_round_trips_and_tells_the_model_how_it_ended() -> None:
    done = CommandResult(3, "boom\n", False, False, False, 0.2, None)
    assert CommandResult.from_dict(done.to_dict()) == done
    assert CommandResult.from_dict({**done.to_dict(), "future_field": 1}) == done
    assert done.for_model() == "exit code 3\nboom\n"

    timed_out = CommandResult(None, "", False, True, False, 2.01, "timeout")
    assert timed_out.for_model().startswith("killed: timeout after 2.0s")
    cancelled = CommandResult(None, "x", False, False, True, 0.1, None)
    assert cancelled.for_model() == "killed: cancelled\nx"
    cpu = CommandResult(152, "", False, False, False, 1.0, "cpu")
    assert cpu.for_model().startswith("exit code 152 (CPU time limit exceeded)")
    flooded = CommandResult(None, "y\n", True, False, False, 0.3, "output")
    assert flooded.for_model().startswith("killed: output limit exceeded")
    filled = CommandResult(None, "", False, False, False, 0.3, "disk")
    assert filled.for_model().startswith("killed: disk limit exceeded\n")
    assert (
        CommandResult(0, "", False, False, False, 0.1, "disk")
        .for_model()
        .startswith("exit code 0 (disk limit exceeded)")
    )


def test_bwrap_argv_without_root_uses_a_user_namespace() -> None:
    argv = bubblewrap_module._bwrap_argv(
        "/usr/bin/bwrap",
        None,
        Path("/srv/ws"),
        ["/bin/true"],
        SandboxLimits(),
        allow_network=False,
        host_uid=None,
    )
    assert argv[:7] == ["/usr/bin/bwrap", "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000"]
    assert "--share-net" not in argv and "--cap-add" not in argv
    assert argv[argv.index("--bind") + 1 : argv.index("--bind") + 3] == ["/srv/ws", "/tmp/workspace"]
    assert argv[-2:] == ["--", "/bin/true"]
    assert "--seccomp" not in argv
    networked = bubblewrap_module._bwrap_argv(
        "/usr/bin/bwrap",
        None,
        Path("/srv/ws"),
        ["/bin/true"],
        SandboxLimits(),
        allow_network=True,
        host_uid=None,
        seccomp_fd=7,
    )
    assert "--share-net" in networked
    assert networked[networked.index("--seccomp") : networked.index("--seccomp") + 3] == [
        "--seccomp",
        "7",
        "--",
    ]


def test_hidden_run_keeps_resolv_conf_for_networked_commands(host_dir: Path) -> None:
    run = host_dir / "run"
    (run / "resolve").mkdir(parents=True)
    (run / "resolve" / "stub-resolv.conf").write_text("nameserver 127.0.0.53\n")
    link = host_dir / "resolv.conf"
    link.symlink_to(run / "resolve" / "stub-resolv.conf")
    stub = str(run / "resolve" / "stub-resolv.conf")
    args = hidden_module._hide_args([run], keep=[str(link)])
    assert args == ["--tmpfs", str(run), "--ro-bind", stub, stub, "--remount-ro", str(run)]
    assert hidden_module._hide_args([run], keep=[str(host_dir / "elsewhere")]) == [
        "--tmpfs",
        str(run),
        "--remount-ro",
        str(run),
    ]


def test_sandbox_uid_is_stable_per_workspace_and_in_range() -> None:
    a = workspace_module._sandbox_uid(Path("/var/lib/nodus/sandboxes/p/run-a"))
    assert a == workspace_module._sandbox_uid(Path("/var/lib/nodus/sandboxes/p/run-a"))
    assert 200_000 <= a < 250_000
    others = {workspace_module._sandbox_uid(Path(f"/var/lib/nodus/sandboxes/p/run-{i}")) for i in range(50)}
    assert len(others) > 45


def test_create_sandbox_falls_back_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_module, "_probe_bwrap", lambda: "bwrap not found")
    box = create_sandbox(tmp_path / "a" / "b" / "ws")
    assert isinstance(box, ProcessSandbox)
    assert box.backend == "process"
    assert box.workspace.is_dir()
    assert box.note is not None and "bwrap not found" in box.note


@pytest.mark.parametrize("bad", [0, 999, 65534, 2**31 - 1, 2**32 - 1, -1, True, 1000.0, "2000"])
def test_invalid_uid_is_refused_before_anything_is_created(tmp_path: Path, bad: object) -> None:
    for make in (create_sandbox, ProcessSandbox, BubblewrapSandbox):
        with pytest.raises(ValueError, match="sandbox uid must be an int from 1000 to 2147483646"):
            make(tmp_path / "ws", uid=bad)  # type: ignore[operator]
    assert not (tmp_path / "ws").exists()


def test_uid_range_bounds_are_accepted(tmp_path: Path) -> None:
    for uid in (1000, 2**31 - 2):
        box = ProcessSandbox(tmp_path / f"ws-{uid}", uid=uid)
        assert box.host_uid == (uid if os.geteuid() == 0 else None)
        box.delete()


def test_invalid_hidden_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="absolute"):
        create_sandbox(tmp_path / "ws", hidden_paths=[Path("relative/dir")])
    with pytest.raises(ValueError, match="cannot hide /"):
        create_sandbox(tmp_path / "ws", hidden_paths=[Path("/")])
    with pytest.raises(TypeError):
        create_sandbox(tmp_path / "ws", hidden_paths=Path("/srv"))  # type: ignore[arg-type]


def test_workspace_is_private_even_without_bubblewrap(process_box: ProcessSandbox) -> None:
    st = process_box.workspace.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700
    if process_box.host_uid is not None:
        assert (st.st_uid, st.st_gid) == (process_box.host_uid, process_box.host_uid)
    # The command owns the directory and may open it up; it is closed again when the command ends.
    assert process_box.run("chmod 777 .").exit_code == 0
    assert stat.S_IMODE(process_box.workspace.stat().st_mode) == 0o700


def test_bwrap_argv_hides_paths_after_tmp_and_before_the_workspace(host_dir: Path) -> None:
    storage = host_dir / "storage"
    (storage / "nested").mkdir(parents=True)
    secret_file = host_dir / "token"
    secret_file.write_text("t")
    link = host_dir / "link-to-storage"
    link.symlink_to(storage)
    hidden = [storage / "nested", link, secret_file, host_dir / "missing", Path("/tmp/whatever")]
    argv = bubblewrap_module._bwrap_argv(
        "/usr/bin/bwrap",
        None,
        storage / "ws",
        ["/bin/true"],
        SandboxLimits(),
        allow_network=False,
        host_uid=None,
        hidden=hidden,
    )
    # The symlink is covered at its target; what is below a hidden dir, missing or in /tmp is not.
    tmpfs_targets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]
    assert tmpfs_targets == ["/tmp", "/dev/shm", str(storage)]
    assert argv[argv.index(str(storage)) + 1 : argv.index(str(storage)) + 3] == ["--remount-ro", str(storage)]
    file_bind = argv.index(str(secret_file))
    assert argv[file_bind - 2 : file_bind] == ["--ro-bind", "/dev/null"]
    assert argv.index("/dev/shm") < argv.index(str(storage)) < argv.index(bubblewrap_module.SANDBOX_WORKSPACE)
    assert argv.index(str(secret_file)) < argv.index(bubblewrap_module.SANDBOX_WORKSPACE)


def test_default_hidden_paths_cover_credentials_and_ray(
    host_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = host_dir / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAY_TMPDIR", str(host_dir / "raytmp"))
    defaults = hidden_module._default_hidden_paths()
    assert Path("/root") in defaults and home in defaults and host_dir / "raytmp" / "ray" in defaults
    assert Path("/run") in defaults and Path("/var/run") in defaults  # daemon sockets (docker.sock)
    # A home that is the system (Debian's ``daemon`` user has /usr/sbin) must never be hidden.
    for system_home in ("/", "/usr/sbin", "/usr", "/etc"):
        monkeypatch.setenv("HOME", system_home)
        assert Path(system_home) not in hidden_module._default_hidden_paths()


# -- bubblewrap ------------------------------------------------------------------------------


@needs_bwrap
def test_runs_in_workspace_with_exit_code_and_both_streams(make_sandbox: Callable[..., Sandbox]) -> None:
    box = make_sandbox()
    assert isinstance(box, BubblewrapSandbox) and box.backend == "bubblewrap" and box.note is None
    result = box.run("pwd; echo hello > made.txt; echo to-stdout; echo to-stderr >&2; exit 3")
    assert result.exit_code == 3
    assert "/tmp/workspace\n" in result.output
    assert "to-stdout" in result.output and "to-stderr" in result.output
    assert not (result.truncated or result.timed_out or result.cancelled) and result.limit is None
    assert (box.workspace / "made.txt").read_text() == "hello\n"
    assert box.run("cat made.txt").output == "hello\n"


@needs_bwrap
def test_workspace_under_a_root_private_directory_works(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    box = create_sandbox(private / "ws")
    try:
        assert box.run("echo ok > f && cat f").output == "ok\n"
    finally:
        box.delete()


@needs_bwrap
@needs_root
def test_same_workspace_same_uid_so_a_replay_can_write(make_sandbox: Callable[..., Sandbox]) -> None:
    first = make_sandbox()
    assert first.run("mkdir -p d && echo one > d/f && chmod 600 d/f").exit_code == 0
    second = make_sandbox()  # same path, e.g. the run actor after a restart
    assert second.host_uid == first.host_uid  # type: ignore[attr-defined]
    assert second.run("echo two >> d/f && cat d/f").output == "one\ntwo\n"
    assert second.run("id -u").output.strip() != "0"


@needs_bwrap
@needs_root
def test_explicit_uid_is_used_and_owns_a_private_workspace(make_sandbox: Callable[..., Sandbox]) -> None:
    uid = unused_uid()
    box = make_sandbox(uid=uid)
    assert box.host_uid == uid  # type: ignore[attr-defined]
    result = box.run("id -u; id -g; echo x > f; mkdir d; chmod 777 .")
    assert result.output == f"{uid}\n{uid}\n"
    for path in (box.workspace, box.workspace / "f", box.workspace / "d"):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (uid, uid), path
    assert stat.S_IMODE(box.workspace.stat().st_mode) == 0o700  # re-closed after the chmod


@needs_bwrap
@needs_root
def test_an_existing_workspace_is_handed_to_a_new_explicit_uid(
    make_sandbox: Callable[..., Sandbox], tmp_path: Path
) -> None:
    first = make_sandbox()  # hashed uid
    assert first.run("mkdir -p d && echo one > d/f && chmod 600 d/f && ln -s /etc/shadow link").exit_code == 0
    uid = unused_uid()
    second = make_sandbox(uid=uid)  # same path, now with an allocated uid
    assert second.run("echo two >> d/f && cat d/f").output == "one\ntwo\n"
    assert Path("/etc/shadow").stat().st_uid == 0  # the symlink was changed, not followed
    assert os.lstat(second.workspace / "link").st_uid == uid


@needs_bwrap
@needs_root
@pytest.mark.parametrize("second_backend", ["bubblewrap", "process"])
def test_another_runs_visible_workspace_is_unreadable(host_dir: Path, second_backend: str) -> None:
    first = create_sandbox(host_dir / "run-1", uid=unused_uid())
    other_uid = unused_uid()
    if second_backend == "process":
        second: Sandbox = ProcessSandbox(host_dir / "run-2", uid=other_uid)
    else:
        second = create_sandbox(host_dir / "run-2", uid=other_uid)
    try:
        assert first.run("echo first-secret > notes.txt && chmod 644 notes.txt").exit_code == 0
        ws1 = first.workspace
        result = second.run(f"ls -d {ws1} && echo VISIBLE; cat {ws1}/notes.txt; ls {ws1}; touch {ws1}/x")
        assert "VISIBLE" in result.output  # the host path is not hidden: only the 0700 mode stops it
        lines = result.output.splitlines()
        assert "first-secret" not in lines and "notes.txt" not in lines  # neither content nor listing
        assert result.output.count("Permission denied") == 3, result.output
        assert not (ws1 / "x").exists()
    finally:
        first.delete()
        second.delete()


@needs_bwrap
def test_hidden_sandbox_root_hides_other_runs_and_workspaces_under_it_still_work(
    make_sandbox: Callable[..., Sandbox], host_dir: Path
) -> None:
    root = host_dir / "sandboxes"
    uids = (unused_uid(), unused_uid()) if os.geteuid() == 0 else (None, None)
    first = make_sandbox(workspace=root / "default" / "run-1", uid=uids[0], hidden_paths=(root,))
    second = make_sandbox(workspace=root / "default" / "run-2", uid=uids[1], hidden_paths=(root,))
    result = first.run(f"echo one > f && cat f && pwd && ls -A {root}; echo rc=$?")
    assert result.output == "one\n/tmp/workspace\nrc=0\n"  # works, yet its own parent is empty
    assert (first.workspace / "f").read_text() == "one\n"
    result = second.run(f"ls -A {root}; echo rc=$?; cat {first.workspace}/f; touch {root}/x")
    assert result.output.startswith("rc=0\n")  # an empty listing: not even the run names
    assert "one" not in result.output
    assert "Read-only file system" in result.output
    assert sorted(os.listdir(root / "default")) == ["run-1", "run-2"]


@needs_bwrap
def test_hidden_paths_are_empty_and_read_only_inside(
    make_sandbox: Callable[..., Sandbox], host_dir: Path
) -> None:
    storage = host_dir / "storage"
    (storage / "runs").mkdir(parents=True)
    (storage / "secret.txt").write_text("storage-secret\n")
    (storage / "secret.txt").chmod(0o644)
    token = host_dir / "token"
    token.write_text("token-secret\n")
    token.chmod(0o644)
    link = host_dir / "storage-link"
    link.symlink_to(storage)
    # Positive control: without hiding, the world-readable secrets are readable inside.
    assert "storage-secret" in make_sandbox(name="plain").run(f"cat {storage}/secret.txt").output
    box = make_sandbox(hidden_paths=(link, token))  # a symlink hides its target
    result = box.run(
        f"ls -A {storage}; echo rc=$?; cat {storage}/secret.txt {link}/secret.txt {token}; "
        f"touch {storage}/x; echo ok > f && cat f"
    )
    assert result.output.startswith("rc=0\n")
    assert "secret" not in result.output.replace("secret.txt", "")
    assert "Read-only file system" in result.output
    assert result.output.endswith("ok\n")
    assert not (storage / "x").exists()


@needs_bwrap
def test_root_home_is_not_listable(make_sandbox: Callable[..., Sandbox]) -> None:
    if not os.path.isdir("/root"):
        pytest.skip("no /root on this host")
    result = make_sandbox().run("ls -A /root; echo rc=$?; ls -A ~root | wc -l")
    assert result.output == "rc=0\n0\n"


@needs_bwrap
def test_ray_temp_dir_outside_tmp_is_hidden_by_default(
    make_sandbox: Callable[..., Sandbox], host_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sockets = host_dir / "raytmp" / "ray" / "session_2026-01-01" / "sockets"
    sockets.mkdir(parents=True)
    (sockets / "raylet").write_text("")
    monkeypatch.setenv("RAY_TMPDIR", str(host_dir / "raytmp"))
    result = make_sandbox().run(f"ls -A {host_dir}/raytmp/ray; echo rc=$?")
    assert result.output == "rc=0\n"


@needs_bwrap
def test_no_network_even_to_host_loopback(make_sandbox: Callable[..., Sandbox]) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        box = make_sandbox()
        result = box.run(
            f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo LOOPBACK-CONNECTED; "
            "timeout 5 bash -c 'exec 3<>/dev/tcp/1.1.1.1/53' && echo INTERNET-CONNECTED; "
            "echo interfaces: $(tail -n +3 /proc/net/dev | cut -d: -f1)"
        )
        assert "LOOPBACK-CONNECTED" not in result.output
        assert "INTERNET-CONNECTED" not in result.output
        assert "interfaces: lo\n" in result.output  # only the namespace's own loopback
        with pytest.raises(BlockingIOError):
            listener.accept()


@needs_bwrap
@needs_python
def test_python_socket_cannot_reach_the_internet(make_sandbox: Callable[..., Sandbox]) -> None:
    result = make_sandbox().run(
        "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2);"
        " print('CONNECTED')\""
    )
    assert result.exit_code != 0
    assert "CONNECTED" not in result.output
    assert "OSError" in result.output or "unreachable" in result.output.lower()


@needs_bwrap
def test_allow_network_shares_the_host_network(make_sandbox: Callable[..., Sandbox]) -> None:
    # The positive control for the test above: the same probe connects when networking is allowed.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        box = make_sandbox(allow_network=True)
        result = box.run(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo LOOPBACK-CONNECTED")
        assert "LOOPBACK-CONNECTED" in result.output


@needs_bwrap
def test_cannot_write_outside_the_workspace(make_sandbox: Callable[..., Sandbox], tmp_path: Path) -> None:
    marker = f"nodus-escape-{uuid.uuid4().hex}"
    host_tmp_dir = tmp_path / "other"
    host_tmp_dir.mkdir()
    host_tmp_dir.chmod(0o777)
    shared_dir = Path(tempfile.mkdtemp(dir="/var/tmp"))  # visible inside, world-writable on the host
    shared_dir.chmod(0o777)
    targets = [
        Path("/etc") / marker,
        Path("/usr") / marker,
        Path("/var/tmp") / marker,
        Path.home() / marker,
        host_tmp_dir / marker,
        shared_dir / marker,
    ]
    try:
        box = make_sandbox()
        for target in targets:
            result = box.run(f"echo pwned > {target} && echo WROTE")
            assert "WROTE" not in result.output, target
            assert not target.exists(), target
        # Inside, /tmp and /dev/shm are private: writable, but nothing lands on the host.
        result = box.run(
            f"echo inside > /tmp/{marker} && cat /tmp/{marker} && echo x > ../{marker}-up"
            f" && echo shm > /dev/shm/{marker} && cat /dev/shm/{marker}"
        )
        assert result.exit_code == 0 and result.output == "inside\nshm\n"
        assert not (Path("/tmp") / marker).exists()
        assert not (Path("/dev/shm") / marker).exists()
        assert not (box.workspace.parent / f"{marker}-up").exists()
    finally:
        shutil.rmtree(shared_dir)


@needs_bwrap
def test_host_environment_is_not_visible(
    make_sandbox: Callable[..., Sandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-secret")
    result = make_sandbox().run("env; tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/1/environ")
    assert "sk-test-secret" not in result.output
    assert "ANTHROPIC_API_KEY" not in result.output
    names = {line.split("=", 1)[0] for line in result.output.splitlines() if "=" in line}
    assert {"PATH", "HOME", "LANG", "TERM"} <= names <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_"}
    assert "HOME=/tmp/workspace" in result.output and "LANG=C.UTF-8" in result.output


@needs_bwrap
def test_pid_namespace_shows_only_the_sandbox(make_sandbox: Callable[..., Sandbox]) -> None:
    result = make_sandbox().run("echo shell=$$; ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '")
    lines = result.output.splitlines()
    assert int(lines[0].removeprefix("shell=")) <= 3
    pids = [int(p) for p in lines[1].split()]
    assert pids and max(pids) < 20  # pid 1 is bubblewrap's init; the host's processes are absent


@needs_bwrap
def test_fork_bomb_is_held_to_the_process_limit_then_killed(make_sandbox: Callable[..., Sandbox]) -> None:
    limits = SandboxLimits(processes=64, timeout_seconds=3)
    box = make_sandbox(limits)
    uid = box.host_uid  # type: ignore[attr-defined]
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(processes_of(uid)))

    watcher = threading.Thread(target=watch, daemon=True)
    if uid is not None:
        watcher.start()
    result = box.run(":(){ :|:& };:; sleep 30")
    stop.set()
    if uid is not None:
        watcher.join(timeout=10)
        assert peak <= limits.processes
        assert _wait_until(lambda: not processes_of(uid), timeout=10), "fork bomb survived its command"
    assert result.timed_out and result.exit_code is None
    assert result.limit == "processes"  # how fast the kill comes: benchmarks/sandbox_hardening.py --stops
    assert "process limit" in result.for_model()
    assert box.run("echo alive").output == "alive\n"


@needs_bwrap
@needs_python
def test_memory_bomb_fails_and_is_reported(make_sandbox: Callable[..., Sandbox]) -> None:
    result = make_sandbox().run("python3 -c \"b = bytearray(8 << 30); print('ALLOCATED')\"")
    assert result.exit_code not in (0, None)
    assert "ALLOCATED" not in result.output
    assert result.limit == "memory"


@needs_bwrap
def test_runaway_loop_is_stopped_by_the_timeout(make_sandbox: Callable[..., Sandbox]) -> None:
    box = make_sandbox()
    result = box.run("while true; do :; done", timeout=2)
    assert result.timed_out and result.exit_code is None and result.limit == "timeout"
    # The runner reports the time it let the command run; how close to 2 s: the --stops benchmark.
    assert result.for_model().startswith("killed: timeout after 2.")
    assert box.run("echo next").exit_code == 0


@needs_bwrap
def test_cpu_limit_stops_a_busy_loop_before_the_timeout(make_sandbox: Callable[..., Sandbox]) -> None:
    box = make_sandbox(SandboxLimits(cpu_seconds=1, timeout_seconds=20))
    result = box.run("while true; do :; done")
    assert not result.timed_out
    assert result.limit == "cpu"
    assert result.exit_code == 128 + 24  # SIGXCPU


@needs_bwrap
def test_file_size_limit(make_sandbox: Callable[..., Sandbox]) -> None:
    box = make_sandbox(SandboxLimits(file_size_bytes=1 << 20))
    result = box.run("head -c 5000000 /dev/zero > big")
    assert result.exit_code != 0 and result.limit == "file-size"
    assert (box.workspace / "big").stat().st_size <= 1 << 20


@needs_bwrap
def test_long_output_is_truncated_with_an_exact_marker(make_sandbox: Callable[..., Sandbox]) -> None:
    box = make_sandbox(SandboxLimits(output_bytes=4096))
    result = box.run("head -c 200000 /dev/zero | tr '\\0' a")
    assert result.exit_code == 0 and result.truncated and result.limit is None
    assert result.output == "a" * 4096 + "\n[output truncated: 195904 more bytes not shown]"


@needs_bwrap
def test_endless_output_is_killed_and_memory_stays_bounded(make_sandbox: Callable[..., Sandbox]) -> None:
    box = make_sandbox()  # default 64 KiB cap
    tracemalloc.start()
    try:
        result = box.run("yes | head -c 50000000")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20  # 50 MB went through; at most a few chunks were held at once
    assert result.truncated and result.limit == "output" and result.exit_code is None
    assert result.output.startswith("y\ny\n")
    assert result.output.endswith("more bytes not shown]")
    assert len(result.output) < (64 << 10) + 100

    forever = make_sandbox(SandboxLimits(output_bytes=1000, timeout_seconds=30), name="ws2").run("yes")
    assert forever.limit == "output" and not forever.timed_out  # stopped by the cap, not the 30 s timeout


@needs_bwrap
def test_cancel_from_another_thread_stops_the_command(make_sandbox: Callable[..., Sandbox]) -> None:
    box = make_sandbox()
    box.cancel()  # nothing running: must not affect the next command
    results: list[CommandResult] = []
    worker = threading.Thread(target=lambda: results.append(box.run("touch started; sleep 60")))
    worker.start()
    assert _wait_until((box.workspace / "started").exists, timeout=10)
    box.cancel()
    worker.join(timeout=10)
    assert not worker.is_alive()
    (result,) = results
    assert result.cancelled and result.exit_code is None and not result.timed_out
    assert result.for_model().startswith("killed: cancelled")
    assert box.run("echo again").output == "again\n"


@needs_bwrap
def test_delete_removes_the_workspace(tmp_path: Path) -> None:
    box = create_sandbox(tmp_path / "ws")
    assert box.run("mkdir -p a/b && echo x > a/b/c && chmod 500 a/b").exit_code == 0
    box.delete()
    assert not box.workspace.exists()
    with pytest.raises(RuntimeError):
        box.run("true")


# -- process fallback ------------------------------------------------------------------------


@pytest.fixture
def process_box(tmp_path: Path) -> Iterator[ProcessSandbox]:
    box = ProcessSandbox(tmp_path / "ws", SandboxLimits(timeout_seconds=30), note="testing the fallback")
    yield box
    box.delete()


def test_process_sandbox_basics(process_box: ProcessSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-secret")
    assert process_box.backend == "process" and process_box.note == "testing the fallback"
    result = process_box.run("pwd; echo out; echo err >&2; echo data > f; env; exit 4")
    assert result.exit_code == 4
    assert f"{process_box.workspace}\n" in result.output
    assert "out" in result.output and "err" in result.output
    assert "sk-test-secret" not in result.output
    names = {line.split("=", 1)[0] for line in result.output.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_"}
    assert (process_box.workspace / "f").read_text() == "data\n"


@needs_root
def test_process_sandbox_drops_root(process_box: ProcessSandbox) -> None:
    result = process_box.run("id -u; touch /etc/nodus-should-not-exist")
    assert result.output.splitlines()[0] == str(process_box.host_uid)
    assert not Path("/etc/nodus-should-not-exist").exists()


@needs_root
def test_process_sandbox_as_root_kills_children_that_left_the_session(tmp_path: Path) -> None:
    uid = unused_uid()
    box = ProcessSandbox(tmp_path / "ws", SandboxLimits(timeout_seconds=30), uid=uid)
    try:
        result = box.run(
            "setsid -f sh -c 'echo $$ > daemon.pid; exec sleep 300' </dev/null >/dev/null 2>&1; "
            "for _ in $(seq 100); do [ -s daemon.pid ] && break; sleep 0.05; done; "
            "echo shell-session $(cut -d' ' -f6 /proc/$$/stat); "
            "echo daemon-session $(cut -d' ' -f6 /proc/$(cat daemon.pid)/stat)"
        )
        # Returned by itself, not held until the 30 s timeout by the daemon's 300 s sleep.
        assert result.exit_code == 0 and not result.timed_out
        sessions = dict(line.split() for line in result.output.splitlines())
        assert sessions["shell-session"] != sessions["daemon-session"]  # it really escaped the group
        daemon = int((box.workspace / "daemon.pid").read_text())
        assert _wait_until(lambda: not processes_of(uid), timeout=10), "setsid child outlived its command"
        assert daemon not in processes_of(uid)
        assert box.run("echo alive").output == "alive\n"
    finally:
        box.delete()


@needs_root
def test_process_sandboxes_with_their_own_uids_do_not_reap_each_other(tmp_path: Path) -> None:
    a = ProcessSandbox(tmp_path / "a", SandboxLimits(timeout_seconds=30), uid=unused_uid())
    b = ProcessSandbox(tmp_path / "b", SandboxLimits(timeout_seconds=30), uid=unused_uid())
    try:
        results: list[CommandResult] = []
        slow = "touch started; sleep 2; echo survived"
        worker = threading.Thread(target=lambda: results.append(a.run(slow)))
        worker.start()
        assert _wait_until((a.workspace / "started").exists, timeout=10)
        assert b.run("sleep 100 & echo b").exit_code == 0  # b's cleanup kills everything of b's uid
        worker.join(timeout=10)
        assert results and results[0].exit_code == 0 and results[0].output == "survived\n"
    finally:
        a.delete()
        b.delete()


def test_process_sandbox_timeout_and_leftovers(process_box: ProcessSandbox) -> None:
    result = process_box.run("while true; do :; done", timeout=1)
    assert result.timed_out and result.exit_code is None and result.limit == "timeout"
    # Closing the output is not finishing: the timeout still applies.
    result = process_box.run("exec >/dev/null 2>&1; sleep 60", timeout=1)
    assert result.timed_out and result.limit == "timeout"
    # A background process holding the output pipe must not hold the command open: the command
    # ends by itself, not at the 30 s timeout (the background sleep outlives that).
    result = process_box.run("sleep 60 & echo started")
    assert result.exit_code == 0 and "started" in result.output and not result.timed_out
    if process_box.host_uid is not None:
        assert _wait_until(lambda: not processes_of(process_box.host_uid), timeout=10)


def test_process_sandbox_has_the_disk_cap_too(tmp_path: Path) -> None:
    box = ProcessSandbox(tmp_path / "ws", SandboxLimits(timeout_seconds=30, disk_bytes=4 << 20))
    try:
        result = box.run(
            "for i in $(seq 100); do head -c 1M /dev/zero >> fill; sleep 0.01; done; echo FINISHED"
        )
        assert result.exit_code is None and result.limit == "disk" and "FINISHED" not in result.output
        assert result.for_model().startswith("killed: disk limit exceeded\n")
        assert box.run("rm fill && echo ok").output == "ok\n"
    finally:
        box.delete()


def test_process_sandbox_output_cap_and_cancel(tmp_path: Path) -> None:
    box = ProcessSandbox(tmp_path / "ws", SandboxLimits(output_bytes=100))
    try:
        result = box.run("head -c 1000 /dev/zero | tr '\\0' b")
        assert result.output == "b" * 100 + "\n[output truncated: 900 more bytes not shown]"
        results: list[CommandResult] = []
        worker = threading.Thread(target=lambda: results.append(box.run("touch started; sleep 60")))
        worker.start()
        assert _wait_until((box.workspace / "started").exists, timeout=10)
        box.cancel()
        worker.join(timeout=10)
        assert results and results[0].cancelled and results[0].exit_code is None
    finally:
        box.delete()
    assert not box.workspace.exists()
