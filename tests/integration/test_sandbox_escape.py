"""Escape attempts against a real bubblewrap sandbox, configured the way the server configures it.

No Ray here (the ``server`` fixture is not used): each test builds sandboxes directly, with the
hidden paths the control plane passes (the sandbox root and local storage), the server user's
home in ``$HOME`` and a per-run uid when the tests run as root, as CI does. Every test runs one
escape attempt as a real command and asserts that it fails *the way it should* (hidden paths
read as missing, the filter answers EPERM...), so an unrelated failure ("command not found", a
typo in the probe) does not pass for containment. Where a result could hold for another reason,
a positive control shows the probe works when the barrier is absent.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodus_ray.sandbox import (
    CommandResult,
    ProcessSandbox,
    Sandbox,
    SandboxLimits,
    bwrap_available,
    create_sandbox,
    seccomp,
)
from nodus_ray.sandbox import backend as sandbox_backend
from nodus_ray.sandbox import bubblewrap as sandbox_bubblewrap
from nodus_ray.sandbox.disk_usage import disk_usage
from tests.sandbox_uids import unused_uid

pytestmark = pytest.mark.skipif(
    not bwrap_available(), reason=f"bubblewrap cannot run here: {sandbox_backend._probe_bwrap()}"
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop only happens when running as root")
needs_filter = pytest.mark.skipif(
    seccomp.unsupported_reason() is not None, reason=str(seccomp.unsupported_reason())
)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def _tool(name: str) -> str:
    path = shutil.which(name, path=SANDBOX_PATH)
    if path is None:
        pytest.skip(f"{name} is not on the sandbox's PATH here")
    return path


@dataclass
class Host:
    """A host laid out like a root server's: sandbox root, storage, home, Ray's temp dir."""

    base: Path
    sandboxes: Path
    storage: Path
    home: Path
    ray_tmp: Path
    make: Callable[..., Sandbox]

    def secret(self, path: Path, text: str, mode: int = 0o644) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return path


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    # Not under /tmp: the sandbox's /tmp is private, so nothing there would be a real test.
    base = Path(tempfile.mkdtemp(prefix="nodus-escape-", dir="/var/tmp"))
    base.chmod(0o755)  # every directory traversable: only the sandbox's own barriers stand in the way
    sandboxes, storage, home, ray_tmp = base / "sandboxes", base / "storage", base / "home", base / "raytmp"
    for path in (sandboxes, storage, home, ray_tmp):
        path.mkdir(mode=0o755)
    # What the server process sees, and so what _default_hidden_paths hides.
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    made: list[Sandbox] = []

    def make(name: str = "run-1", limits: SandboxLimits | None = None, **kwargs: object) -> Sandbox:
        kwargs.setdefault("uid", unused_uid() if os.geteuid() == 0 else None)
        kwargs.setdefault("hidden_paths", (sandboxes, storage))  # as control.run_supervisor passes them
        box = create_sandbox(
            sandboxes / "default" / name, limits or SandboxLimits(timeout_seconds=30), **kwargs
        )  # type: ignore[arg-type]
        made.append(box)
        return box

    yield Host(base, sandboxes, storage, home, ray_tmp, make)
    for box in made:
        box.delete()
    shutil.rmtree(base, ignore_errors=True)


def run_python(box: Sandbox, *parts: str) -> CommandResult:
    """Run a python3 script, made of dedented ``parts``, in the sandbox (on stdin, a quoted here-document)."""
    _tool("python3")
    code = "\n".join(textwrap.dedent(part) for part in parts)
    return box.run(f"python3 - <<'NODUS_PY'\n{code}\nNODUS_PY")


def results(output: str) -> dict[str, str]:
    """``name result`` lines printed by a probe script."""
    return dict(line.split(" ", 1) for line in output.splitlines() if line.count(" ") == 1)


# The probe scripts' helper: call a syscall by number, print "name OK" or "name ERRNO".
SYSCALL_PRELUDE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(name, nr, *args):
    conv = [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_char_p(a) if isinstance(a, bytes)
            else ctypes.c_long(a) for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *conv)
    if r == 0 and name.startswith("clone"):
        os._exit(0)  # a clone that succeeded: the child must not run the rest of the probe
    print(name, "OK" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
"""


def nr(name: str) -> int:
    return seccomp._ARCHES[seccomp.native_arch()].numbers[name]


# -- other runs, storage, Ray, the server's credentials ------------------------------------------


def test_another_runs_workspace_is_invisible(host: Host) -> None:
    other = host.make("run-2")
    assert other.run("echo other-run-secret > notes.txt").exit_code == 0
    # Open it up on the host as widely as it goes: only the hidden sandbox root may stand in the way.
    other.workspace.chmod(0o755)
    (other.workspace / "notes.txt").chmod(0o644)
    box = host.make("run-1")
    result = box.run(
        f"ls -A {host.sandboxes}; echo listing=$?; cat {other.workspace}/notes.txt; "
        f"cd {other.workspace}; echo cd=$?"
    )
    lines = result.output.splitlines()
    assert lines[0] == "listing=0"  # empty: not even the run names
    assert "No such file or directory" in lines[1] and "No such file or directory" in lines[2]
    assert lines[3] == "cd=1"
    assert "other-run-secret" not in result.output


def test_storage_directory_is_invisible(host: Host) -> None:
    host.secret(host.storage / "default" / "runs" / "run-2" / "journal.jsonl", '{"api_key": "sk-stored"}\n')
    result = host.make().run(
        f"ls -A {host.storage}; echo rc=$?; cat {host.storage}/default/runs/run-2/journal.jsonl"
    )
    assert result.output.startswith("rc=0\n")
    assert "No such file or directory" in result.output and "sk-stored" not in result.output


def test_ray_session_directories_are_invisible(host: Host) -> None:
    session = host.ray_tmp / "ray" / "session_latest" / "sockets"
    session.mkdir(parents=True)
    host.secret(session.parent / "logs" / "raylet.out", "ray-log-secret\n")
    result = host.make().run(
        f"ls -A /tmp; ls /tmp/ray; echo tmp-ray=$?; ls -A {host.ray_tmp}/ray; echo rc=$?; "
        f"cat {session.parent}/logs/raylet.out"
    )
    lines = result.output.splitlines()
    assert lines[0] == "workspace"  # the private /tmp holds only the workspace: no /tmp/ray
    assert "No such file or directory" in lines[1] and lines[2] == "tmp-ray=2"
    assert lines[3] == "rc=0"  # $RAY_TMPDIR/ray outside /tmp is an empty mount
    assert "ray-log-secret" not in result.output


def test_server_home_credentials_are_invisible(host: Host) -> None:
    credentials = host.secret(host.home / ".nodus" / "credentials", "token = nodus-secret-token\n")
    key = host.secret(host.home / ".ssh" / "id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY----- x\n")
    for directory in (host.home / ".nodus", host.home / ".ssh"):
        directory.chmod(0o755)
    # Positive control: with these permissions any uid can read them where they are not hidden.
    visible = host.secret(host.base / "visible" / "credentials", "token = visible-token\n")
    box = host.make()
    result = box.run(f"cat {visible}; ls -A {host.home}; echo rc=$?; cat {credentials} {key}; ls ~root")
    assert "visible-token" in result.output
    assert "rc=0" in result.output.splitlines()
    assert result.output.count("No such file or directory") == 2
    assert "nodus-secret-token" not in result.output and "PRIVATE KEY" not in result.output


def test_host_process_environments_are_out_of_reach(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = f"nodus-env-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("NODUS_ESCAPE_TEST_SECRET", marker)
    result = host.make().run(
        "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null; "
        "cat /proc/1/environ; echo pids: $(ls -d /proc/[0-9]* | wc -l)"
    )
    assert marker not in result.output
    assert "Permission denied" in result.output  # pid 1 is bubblewrap's init, still root
    assert int(result.output.rsplit("pids: ", 1)[1]) < 10  # only the sandbox's own processes


# -- the host filesystem --------------------------------------------------------------------------


def test_cannot_write_outside_the_workspace(host: Host) -> None:
    marker = f"nodus-escape-{uuid.uuid4().hex}"
    targets = [
        Path("/etc") / marker,
        Path("/usr") / marker,
        Path("/usr/local/bin") / marker,
        host.base / marker,
        Path("/var/tmp") / marker,
    ]
    result = host.make().run("; ".join(f"echo x > {t}" for t in targets))
    assert result.output.count("Read-only file system") == len(targets), result.output
    assert not any(t.exists() for t in targets)


def test_kernel_tunables_are_read_only(host: Host) -> None:
    targets = [
        "/proc/sys/kernel/hostname",
        "/proc/sys/vm/drop_caches",
        "/proc/sysrq-trigger",
        "/sys/kernel/uevent_helper",
    ]
    result = host.make().run("; ".join(f"echo 1 > {t}" for t in targets) + "; hostname")
    errors = [line for line in result.output.splitlines() if line.startswith("bash:")]
    assert len(errors) == len(targets), result.output
    for line in errors:  # refused, or not even there: /proc/sysrq-trigger is masked by bubblewrap
        assert line.endswith(("Permission denied", "Read-only file system", "No such file or directory")), (
            line
        )
    assert result.output.splitlines()[-1] == "nodus-sandbox"


def test_run_directory_is_empty_so_daemon_sockets_are_unreachable(host: Host) -> None:
    assert os.listdir("/run"), "precondition: the host's /run has something to hide"
    result = host.make().run("ls -A /run /var/run/; echo rc=$?; touch /run/docker.sock; ls /run/dbus")
    assert result.output.startswith("/run:\n\n/var/run/:\nrc=0\n"), result.output
    assert "Read-only file system" in result.output and "No such file or directory" in result.output


@needs_root
def test_symlink_to_a_host_secret_does_not_leak_it(host: Host) -> None:
    hidden_secret = host.secret(host.home / ".nodus" / "credentials", "hidden-secret\n")
    (host.home / ".nodus").chmod(0o755)
    root_only = host.secret(host.base / "root-only" / "key", "root-only-secret\n", mode=0o600)
    box = host.make()
    result = box.run(f"ln -s {hidden_secret} a && ln -s {root_only} b && cat a; cat b")
    lines = result.output.splitlines()
    assert lines[0].endswith("No such file or directory")  # the hidden one is not there at all
    assert lines[1].endswith("Permission denied")  # the visible one is still root's alone
    assert "hidden-secret" not in result.output and "root-only-secret" not in result.output
    # The host walks the workspace as root (the chown when a sandbox is made for it, the disk
    # watch): neither follows the links, so the secret is still root's and still unreadable.
    again = host.make()
    assert again.run("cat b").output.endswith("Permission denied\n")
    st = root_only.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)


@pytest.mark.parametrize("backend", ["bubblewrap", "process"])
def test_hard_link_to_a_root_owned_file_fails(host: Host, backend: str) -> None:
    if backend == "process" and os.geteuid() != 0:
        pytest.skip("the process fallback only drops to another uid as root")
    # Same filesystem as the workspace, so only the kernel's rules can refuse the link. Had it
    # worked, making a sandbox again would chown the workspace, and with it the root's file.
    target = host.secret(host.base / "root-owned" / "config", "root-config\n", mode=0o600)
    if backend == "process":
        box: Sandbox = ProcessSandbox(host.sandboxes / "default" / "proc-run", uid=unused_uid())
    else:
        box = host.make()
    try:
        result = box.run(f"ln {target} hl; echo rc=$?")
        assert "rc=1" in result.output
        # bubblewrap: another mount (EXDEV); process: fs.protected_hardlinks (EPERM).
        assert "Invalid cross-device link" in result.output or "Operation not permitted" in result.output
        assert not (box.workspace / "hl").exists()
        assert target.stat().st_uid == os.geteuid()
    finally:
        if backend == "process":
            box.delete()


def test_a_hard_link_that_got_into_a_workspace_never_hands_its_file_to_the_sandbox(host: Host) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root chowns a workspace to the sandbox uid")
    # However it got there (a restored snapshot, a host tool, a kernel that allowed the link),
    # making a sandbox over the workspace must not chown the file it shares an inode with.
    target = host.secret(host.base / "root-owned" / "linked", "root-config\n", mode=0o600)
    workspace = host.sandboxes / "default" / "linked-run"
    workspace.mkdir(parents=True)
    os.link(target, workspace / "hl")
    (workspace / "own").write_text("mine\n")
    box = host.make("linked-run")
    st = target.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert box.run("cat hl").output.endswith("Permission denied\n")
    assert box.run("cat own").output == "mine\n"  # the rest of the workspace is handed over


def test_device_nodes_cannot_be_made(host: Host) -> None:
    _tool("mknod")
    result = host.make().run("mknod disk b 8 0; mknod mem c 1 1; mknod null c 1 3; ls")
    assert result.output.count("Operation not permitted") == 3, result.output
    assert result.output.count("mknod:") == 3


# -- privileges -----------------------------------------------------------------------------------


def test_no_capabilities_no_new_privileges_and_a_filter(host: Host) -> None:
    result = host.make().run("grep -E '^(Cap[A-Za-z]+|NoNewPrivs|Seccomp|Uid):' /proc/self/status")
    fields = {line.split(":")[0]: line.split()[1:] for line in result.output.splitlines()}
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert fields[cap] == ["0000000000000000"], (cap, result.output)
    assert fields["NoNewPrivs"] == ["1"]
    assert fields["Seccomp"] == (["2"] if seccomp.unsupported_reason() is None else ["0"])
    if os.geteuid() == 0:
        assert "0" not in fields["Uid"]


def test_setuid_programs_do_not_give_root(host: Host) -> None:
    su = _tool("su")
    mount = _tool("mount")
    assert os.stat(su).st_mode & stat.S_ISUID and os.stat(mount).st_mode & stat.S_ISUID  # precondition
    result = run_python(
        host.make(),
        f"""
        import os, subprocess
        su = subprocess.run(["{su}", "root", "-c", "id -u"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
        print("su-exit", su.returncode)
        print("su-stdout", su.stdout.strip() or "-")
        print("su-stderr", "failure" if "Authentication failure" in su.stderr else repr(su.stderr))
        try:
            os.setuid(0)
            print("setuid OK")
        except PermissionError:
            print("setuid EPERM")
        print("euid", "root" if os.geteuid() == 0 else "user")
    """,
    )
    # su runs without its setuid bit (no_new_privs), cannot read /etc/shadow and gives up.
    assert results(result.output) == {
        "su-exit": "1",
        "su-stdout": "-",
        "su-stderr": "failure",
        "setuid": "EPERM",
        "euid": "user",
    }, result.output


# -- system calls behind the filter ---------------------------------------------------------------


def test_mount_is_refused_by_the_mount_command_and_the_syscall(host: Host) -> None:
    _tool("mount")
    box = host.make()
    result = box.run(
        "mkdir -p m; mount -t tmpfs none m; mount --bind /etc m; mount -t proc proc m; "
        "umount /tmp/workspace; echo umount=$?; ls -A m | wc -l"
    )
    assert result.output.count("must be superuser to use mount") == 3, result.output
    assert result.output.splitlines()[-1] == "0"
    probe = run_python(
        box,
        SYSCALL_PRELUDE,
        f"""
        sc("mount_tmpfs", {nr("mount")}, b"none", b"/tmp/workspace/m", b"tmpfs", 0, 0)
        sc("mount_bind", {nr("mount")}, b"/etc", b"/tmp/workspace/m", 0, 4096, 0)  # MS_BIND
        sc("mount_proc", {nr("mount")}, b"proc", b"/tmp/workspace/m", b"proc", 0, 0)
        sc("umount2", {nr("umount2")}, b"/tmp/workspace", 2)  # MNT_DETACH
        sc("fsopen", {nr("fsopen")}, b"tmpfs", 0)
        sc("open_tree", {nr("open_tree")}, -100, b"/etc", 1)  # OPEN_TREE_CLONE
        sc("pivot_root", {nr("pivot_root")}, b".", b".")
        sc("chroot", {nr("chroot")}, b"/tmp/workspace")
    """,
    )
    assert set(results(probe.output).values()) == {"EPERM"}, probe.output
    assert len(results(probe.output)) == 8


def test_new_namespaces_are_refused(host: Host) -> None:
    _tool("unshare")
    box = host.make()
    result = box.run(
        "unshare -U true; echo rc=$?; unshare -n true; echo rc=$?; unshare -m true; echo rc=$?; "
        "unshare -Ur id -u; echo rc=$?"
    )
    assert result.output.count("unshare failed: Operation not permitted") == 4, result.output
    assert result.output.count("rc=1") == 4
    clone_flags = {"NEWUSER": 0x10000000, "NEWNS": 0x20000, "NEWNET": 0x40000000, "NEWPID": 0x20000000}
    probe = run_python(
        box,
        SYSCALL_PRELUDE,
        "\n".join(
            [
                f'sc("clone_{name}", {nr("clone")}, {flag} | 17, 0, 0, 0, 0)'
                for name, flag in clone_flags.items()
            ]
            + [
                f'sc("unshare_user", {nr("unshare")}, 0x10000000)',
                f'sc("setns", {nr("setns")}, 0, 0)',
                f'sc("clone3", {nr("clone3")}, 0, 0)',
            ]
        )
        + "\nimport subprocess; print('fork', 'OK' if subprocess.run(['true']).returncode == 0 else 'FAIL')",
    )
    found = results(probe.output)
    assert {k: v for k, v in found.items() if k.startswith("clone_")} == {
        f"clone_{n}": "EPERM" for n in clone_flags
    }
    assert found["unshare_user"] == "EPERM" and found["setns"] == "EPERM"
    assert found["clone3"] == "ENOSYS"  # so libc falls back to clone, which is checked
    assert found["fork"] == "OK"  # ordinary process creation is untouched


def test_ptrace_is_refused(host: Host) -> None:
    probe = run_python(
        host.make(),
        SYSCALL_PRELUDE,
        f"""
        import signal, time
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        sc("ptrace_attach", {nr("ptrace")}, 16, child, 0, 0)  # PTRACE_ATTACH
        sc("ptrace_seize", {nr("ptrace")}, 0x4206, child, 0, 0)  # PTRACE_SEIZE
        iov = (ctypes.c_long * 2)(0, 0)
        sc("process_vm_readv", {nr("process_vm_readv")}, child, ctypes.c_void_p(ctypes.addressof(iov)), 1,
           ctypes.c_void_p(ctypes.addressof(iov)), 1, 0)
        sc("pidfd_getfd", {nr("pidfd_getfd")}, 0, 0, 0)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        r, w = os.pipe()
        traced = os.fork()
        if traced == 0:
            res = libc.syscall(ctypes.c_long({nr("ptrace")}), ctypes.c_long(0), 0, 0, 0)  # PTRACE_TRACEME
            os.write(w, b"OK" if res == 0 else errno.errorcode[ctypes.get_errno()].encode())
            os._exit(0)
        os.waitpid(traced, 0)
        print("ptrace_traceme", os.read(r, 100).decode())
    """,
    )
    assert results(probe.output) == {
        name: "EPERM"
        for name in ("ptrace_attach", "ptrace_seize", "process_vm_readv", "pidfd_getfd", "ptrace_traceme")
    }, probe.output


@needs_filter
def test_kernel_attack_surface_calls_are_refused(host: Host) -> None:
    buf = "ctypes.c_void_p(ctypes.addressof(ctypes.create_string_buffer(256)))"
    calls = {
        "init_module": f"{buf}, 16, b''",
        "finit_module": "0, b'', 0",
        "delete_module": "b'ext4', 0",
        "kexec_load": "0, 0, 0, 0",
        "bpf": f"5, {buf}, 128",  # BPF_PROG_LOAD
        "perf_event_open": f"{buf}, 0, -1, -1, 0",
        "keyctl": "0, -3, 1",  # KEYCTL_GET_KEYRING_ID of the session keyring, creating it
        "add_key": "b'user', b'nodus', b'secret', 6, -3",
        "request_key": "b'user', b'nodus', 0, 0",
        "io_uring_setup": f"4, {buf}",
        "userfaultfd": "1",  # UFFD_USER_MODE_ONLY
        "open_by_handle_at": f"-100, {buf}, 0",
        "name_to_handle_at": f"-100, b'/', {buf}, {buf}, 0",
        "syslog": f"3, {buf}, 256",  # SYSLOG_ACTION_READ_ALL
        "reboot": "0xfee1dead, 672274793, 0x4321fedc, 0",
        "swapon": "b'/tmp/workspace/swap', 0",
        "acct": "b'/tmp/workspace/acct'",
        "kcmp": "os.getpid(), os.getpid(), 0, 0, 0",
    }
    if seccomp.native_arch() == "x86_64":
        calls.update({"iopl": "3", "ioperm": "0x80, 1, 1"})
    probe = run_python(
        host.make(),
        SYSCALL_PRELUDE,
        "\n".join(f"sc({name!r}, {nr(name)}, {args})" for name, args in calls.items()),
    )
    assert results(probe.output) == dict.fromkeys(calls, "EPERM"), probe.output


@needs_filter
def test_positive_control_without_the_filter_these_calls_work(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same probes, filter off: they succeed, so the EPERMs above are the filter's doing."""
    monkeypatch.setattr(sandbox_bubblewrap, "_seccomp_program", lambda: None)
    probe = run_python(
        host.make(),
        SYSCALL_PRELUDE,
        f"""
        sc("keyctl", {nr("keyctl")}, 0, -3, 1)
        sc("add_key", {nr("add_key")}, b"user", b"nodus", b"secret", 6, -3)
        sc("clone3", {nr("clone3")}, 0, 0)
        print("seccomp", [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0])
    """,
    )
    found = results(probe.output)
    assert found == {"keyctl": "OK", "add_key": "OK", "clone3": "EINVAL", "seccomp": "0"}, probe.output


def test_ordinary_programs_still_work_under_the_filter(host: Host) -> None:
    for tool in ("python3", "git"):
        _tool(tool)
    result = host.make().run(
        "set -e; git init -q repo && cd repo && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x"
        " && git log --oneline | wc -l; cd ..; python3 -c 'import threading, subprocess, multiprocessing, sqlite3;"
        ' t = threading.Thread(target=print, args=("thread",)); t.start(); t.join();'
        ' print(subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())\';'
        " python3 -m pip --version >/dev/null && echo pip; sort --parallel=2 /etc/passwd | wc -l >/dev/null;"
        " echo a | xargs -P2 -n1 echo"
    )
    assert result.exit_code == 0, result.output
    assert result.output == "1\nthread\nchild\npip\na\n"


# -- network --------------------------------------------------------------------------------------


def test_host_loopback_and_the_internet_are_unreachable(host: Host) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        probe = run_python(
            host.make(),
            f"""
            import errno, socket
            for name, address in (("loopback", ("127.0.0.1", {port})), ("internet", ("1.1.1.1", 53))):
                try:
                    socket.create_connection(address, timeout=3).close()
                    print(name, "CONNECTED")
                except OSError as exc:
                    print(name, errno.errorcode.get(exc.errno, str(exc.errno)))
        """,
        )
        # Nothing listens on the sandbox's own loopback; there is no route out at all.
        assert results(probe.output) == {"loopback": "ECONNREFUSED", "internet": "ENETUNREACH"}, probe.output
        with pytest.raises(BlockingIOError):
            listener.accept()


@pytest.mark.parametrize("allow_network", [False, True])
def test_abstract_unix_socket_on_the_host_is_unreachable(host: Host, allow_network: bool) -> None:
    # Abstract sockets ignore the filesystem: only the network namespace separates them. With
    # allow_network (the positive control) the sandbox shares the host's, and the probe connects.
    name = f"nodus-escape-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(f"\0{name}")
        listener.listen(1)
        probe = run_python(
            host.make(allow_network=allow_network),
            f"""
            import errno, socket
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect("\\0{name}")
                print("abstract CONNECTED")
            except OSError as exc:
                print("abstract", errno.errorcode.get(exc.errno, str(exc.errno)))
        """,
        )
        expected = "CONNECTED" if allow_network else "ECONNREFUSED"
        assert results(probe.output) == {"abstract": expected}, probe.output


# -- processes ------------------------------------------------------------------------------------


def test_host_processes_cannot_be_signalled(host: Host) -> None:
    box = host.make()
    uid = box.host_uid  # type: ignore[attr-defined]
    # A host process of the sandbox's own uid: the uid alone would allow the kill, if it were visible.
    victim = (
        subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[])
        if uid is not None
        else subprocess.Popen(["sleep", "60"])
    )
    try:
        result = box.run(f"kill -9 {victim.pid}; echo rc=$?; kill -9 -1; echo all=$?")
        assert result.output.startswith(f"bash: line 1: kill: ({victim.pid}) - No such process\nrc=1\n")
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


# -- the disk cap ---------------------------------------------------------------------------------


def test_disk_cap_kills_a_command_that_keeps_writing(host: Host) -> None:
    cap = 8 << 20
    box = host.make(limits=SandboxLimits(timeout_seconds=30, disk_bytes=cap))
    # Paced, so that uncapped it would run for seconds and write 200 MiB.
    result = box.run("for i in $(seq 200); do head -c 1M /dev/zero >> fill; sleep 0.01; done; echo FINISHED")
    assert result.exit_code is None and result.limit == "disk" and not result.timed_out, result
    assert result.for_model().startswith("killed: disk limit exceeded\n")
    assert "over its cap of 8.0 MiB" in result.output and "FINISHED" not in result.output
    # The cap is on the workspace's allocated bytes (the file and its directory), so the watch
    # may kill the command as its file reaches the cap exactly: over the cap, and not far over.
    assert cap < disk_usage(box.workspace)
    assert cap <= (box.workspace / "fill").stat().st_size < 100 << 20
    # Over the cap now: a command that only deletes is not killed for the earlier excess...
    result = box.run("rm fill; echo removed; du -sk . | cut -f1")
    assert result.exit_code == 0 and result.limit is None and result.output.startswith("removed\n")
    # ...and a command that writes within the cap is not either.
    assert box.run("head -c 4M /dev/zero > small && echo ok").output == "ok\n"


def test_disk_cap_spares_a_command_that_shrinks_a_workspace_already_over_it(host: Host) -> None:
    cap = 8 << 20
    box = host.make(limits=SandboxLimits(timeout_seconds=30, disk_bytes=cap))
    assert (
        box.run("head -c 6M /dev/urandom > a; head -c 6M /dev/urandom > b; head -c 6M /dev/urandom > c").limit
        == "disk"
    )
    # 18 MiB, over the cap; this deletes 6 MiB, stays over the cap for several polls, and lives.
    result = box.run("rm a; for i in $(seq 20); do sleep 0.05; cat b > /dev/null; done; echo survived")
    assert result.exit_code == 0 and result.limit is None and result.output == "survived\n", result
    # Growing it again, though, is stopped even though the command started over the cap.
    result = box.run("for i in $(seq 100); do head -c 1M /dev/zero >> more; sleep 0.01; done; echo FINISHED")
    assert result.limit == "disk" and "FINISHED" not in result.output
