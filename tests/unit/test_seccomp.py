"""The hand-built seccomp program: run through a small BPF interpreter, so each decision it makes
is checked without a kernel; tests/integration/test_sandbox_escape.py checks it in a real sandbox."""

from __future__ import annotations

import errno
import os
import re
import struct
from pathlib import Path

import pytest

from nodus_ray.sandbox import seccomp
from nodus_ray.sandbox.seccomp import DENIED_SYSCALLS, NAMESPACE_CLONE_FLAGS, build_filter, filter_fd

ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
X86_64, AARCH64, I386 = 0xC000003E, 0xC00000B7, 0x40000003
CLONE_THREAD_FLAGS = 0x003D0F00  # what glibc's pthread_create passes
CLONE_NEWUSER = 0x10000000


def run_filter(program: bytes, nr: int, arch: int = X86_64, args: tuple[int, ...] = ()) -> int:
    """Evaluate a classic-BPF seccomp program on one ``struct seccomp_data``, as the kernel does."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack("HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    for _ in range(len(insns) + 1):  # no backward jumps: each instruction runs at most once
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x15:  # jeq #k
            pc += jt if acc == k else jf
        elif code == 0x45:  # jset #k
            pc += jt if acc & k else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
    raise AssertionError("program ran off its end")


def x86_numbers() -> dict[str, int]:
    return dict(seccomp._X86_64.numbers)


def test_program_is_well_formed_and_small() -> None:
    program = build_filter("x86_64")
    assert program is not None and len(program) % 8 == 0
    count = len(program) // 8
    # arch check (3), nr load, x32 check, one jump per denied call, clone3, clone (3), 3 returns
    denied = {x86_numbers()[name] for name in DENIED_SYSCALLS if name in x86_numbers()}
    assert count == 3 + 1 + 1 + len(denied) + 1 + 3 + 3
    assert count <= 255  # every jump reaches the returns at the end with a one-byte offset


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_every_denied_call_gets_eperm_and_ordinary_ones_pass(arch: str) -> None:
    program = build_filter(arch)
    assert program is not None
    table = seccomp._ARCHES[arch]
    numbers = table.numbers
    for name in DENIED_SYSCALLS:
        if name in numbers:
            assert run_filter(program, numbers[name], table.audit_arch) == EPERM, name
    denied = {numbers[n] for n in DENIED_SYSCALLS if n in numbers} | {numbers["clone"], numbers["clone3"]}
    allowed = [nr for nr in range(0, 470) if nr not in denied]
    assert all(run_filter(program, nr, table.audit_arch) == ALLOW for nr in allowed)


def test_the_calls_the_brief_names_are_all_denied_on_x86_64() -> None:
    required = (
        "mount umount2 pivot_root chroot ptrace process_vm_readv process_vm_writev kexec_load "
        "kexec_file_load init_module finit_module delete_module bpf perf_event_open keyctl add_key "
        "request_key unshare setns userfaultfd open_by_handle_at name_to_handle_at swapon swapoff "
        "reboot acct quotactl syslog lookup_dcookie io_uring_setup io_uring_enter io_uring_register "
        "fsopen fsconfig fsmount fspick move_mount open_tree mount_setattr iopl ioperm uselib vhangup"
    ).split()
    assert set(required) <= set(DENIED_SYSCALLS)
    assert set(DENIED_SYSCALLS) <= set(x86_numbers())  # every name has an x86_64 number


def test_uid_drop_calls_stay_allowed() -> None:
    # setpriv runs under the filter: setresuid, setresgid, setgroups, capset, prctl.
    program = build_filter("x86_64")
    assert program is not None
    for nr in (117, 119, 116, 126, 157):
        assert run_filter(program, nr) == ALLOW


def test_clone_with_a_namespace_flag_is_refused_threads_and_forks_are_not() -> None:
    program = build_filter("x86_64")
    assert program is not None
    clone = x86_numbers()["clone"]
    assert run_filter(program, clone, args=(CLONE_THREAD_FLAGS,)) == ALLOW
    assert run_filter(program, clone, args=(0x01200011,)) == ALLOW  # fork(): CHILD_SETTID|CLEARTID|SIGCHLD
    for bit in range(32):
        flag = 1 << bit
        if flag & NAMESPACE_CLONE_FLAGS:
            assert run_filter(program, clone, args=(flag | 17,)) == EPERM, hex(flag)
    # The high word of the flags never reaches the kernel's clone, so it is not what is checked.
    assert run_filter(program, clone, args=(CLONE_NEWUSER | (1 << 40),)) == EPERM
    assert run_filter(program, x86_numbers()["clone3"]) == ENOSYS


def test_other_abis_are_refused() -> None:
    program = build_filter("x86_64")
    assert program is not None
    assert run_filter(program, 0x40000000 | 0) == EPERM  # x32 read
    assert run_filter(program, 0x40000000 | 165) == EPERM  # x32 mount
    assert run_filter(program, 0, arch=I386) == KILL_PROCESS  # int 0x80 read
    assert run_filter(program, 0, arch=AARCH64) == KILL_PROCESS
    arm = build_filter("aarch64")
    assert arm is not None
    assert run_filter(arm, 0x40000000 | 63, arch=AARCH64) == ALLOW  # no x32 there; just unknown
    assert run_filter(arm, 63, arch=X86_64) == KILL_PROCESS


def test_unknown_architectures_get_no_filter_and_a_reason() -> None:
    assert build_filter("riscv64") is None
    assert seccomp.unsupported_reason("riscv64") == "no seccomp filter for architecture riscv64"
    assert seccomp.unsupported_reason("x86_64") is None


def _header_numbers(path: str, pattern: str) -> dict[str, int]:
    text = Path(path).read_text()
    return {m[0]: int(m[1]) for m in re.findall(pattern, text)}


@pytest.mark.parametrize(
    ("arch", "header", "pattern"),
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"#define __NR_(\w+)\s+(\d+)"),
        ("aarch64", "/usr/include/asm-generic/unistd.h", r"#define __NR(?:3264)?_(\w+)\s+(\d+)"),
    ],
)
def test_numbers_match_the_installed_kernel_headers(arch: str, header: str, pattern: str) -> None:
    if not os.path.exists(header):
        pytest.skip(f"{header} not installed")
    from_header = _header_numbers(header, pattern)
    ours = seccomp._ARCHES[arch].numbers
    checked = [name for name in ours if name in from_header]
    assert len(checked) >= len(ours) - 2  # headers older than the newest calls lack those
    for name in checked:
        assert ours[name] == from_header[name], name


def test_filter_fd_holds_the_program_and_is_closed_after() -> None:
    program = build_filter("x86_64")
    assert program is not None
    with filter_fd(program) as fd:
        assert not os.get_inheritable(fd)
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
        assert b"".join(chunks) == program
    with pytest.raises(OSError):
        os.fstat(fd)
