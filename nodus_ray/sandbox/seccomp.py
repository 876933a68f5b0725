"""A seccomp deny-list for sandboxed commands, compiled to classic BPF by hand.

Why a filter at all: the namespaces and the uid drop already leave a command without
capabilities, so most of these calls fail anyway. The filter removes the kernel attack surface
behind them (new mount API, io_uring, bpf, user namespaces, keyrings, perf, userfaultfd...):
the historic container escapes went through exactly these entry points, and a call the filter
rejects never reaches the code that had the bug. It mirrors what Docker's default profile
blocks, as a deny-list so that ordinary programs (bash, python, git, pip, compilers) keep
working without an allow-list to maintain.

Why by hand: libseccomp's Python binding is not on PyPI and the program is small. bubblewrap
takes the compiled ``struct sock_filter`` array from a file descriptor (``--seccomp FD``) and
installs it just before it executes the command, after its own setup; ``setpriv``'s uid drop
(setresuid, setresgid, setgroups, capset, prctl) runs under it and is not touched.

The program:

1. an architecture other than the one the numbers are for is killed (a 32-bit ``int 0x80``
   call would otherwise look up another table);
2. on x86_64, x32 calls (``nr & 0x40000000``) get EPERM: a second table of numbers;
3. the denied calls get EPERM;
4. ``clone`` with any namespace flag gets EPERM, and ``clone3`` gets ENOSYS, since its flags
   live in memory a filter cannot read; ENOSYS makes glibc fall back to ``clone``, as Docker
   does;
5. everything else is allowed.

Other architectures get no filter; :func:`unsupported_reason` says so for the sandbox's note.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = [
    "DENIED_SYSCALLS",
    "NAMESPACE_CLONE_FLAGS",
    "build_filter",
    "filter_fd",
    "native_arch",
    "unsupported_reason",
]

# linux/filter.h, linux/bpf_common.h
_BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_BPF_RET_K = 0x06  # BPF_RET | BPF_K
# linux/seccomp.h
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
# Both supported architectures are little-endian, so args[0]'s low word is at offset 16.
_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0_LOW = 16
_X32_SYSCALL_BIT = 0x40000000
_MAX_JUMP = 255  # jt/jf are one byte

# linux/sched.h. Only the low 32 bits of clone's flags reach the kernel.
NAMESPACE_CLONE_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)


@dataclass(frozen=True)
class _Arch:
    audit_arch: int  # linux/audit.h AUDIT_ARCH_*
    x32_bit: bool  # whether the x32 ABI's numbers must be refused
    numbers: Mapping[str, int]  # syscall name -> number, for this table


# Numbers from asm/unistd_64.h (x86_64) and asm-generic/unistd.h (aarch64); calls absent from
# a table (iopl on arm64) are simply not there. tests/unit/test_seccomp.py checks them against
# the installed headers.
_COMMON_NEW = {  # numbered alike on every architecture since Linux 5.1
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "process_madvise": 440,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "open_tree_attr": 467,
}
_X86_64 = _Arch(
    0xC000003E,
    True,
    {
        "clone": 56,
        "ptrace": 101,
        "syslog": 103,
        "uselib": 134,
        "ustat": 136,
        "sysfs": 139,
        "vhangup": 153,
        "pivot_root": 155,
        "_sysctl": 156,
        "chroot": 161,
        "acct": 163,
        "settimeofday": 164,
        "mount": 165,
        "umount2": 166,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "iopl": 172,
        "ioperm": 173,
        "create_module": 174,
        "init_module": 175,
        "delete_module": 176,
        "get_kernel_syms": 177,
        "query_module": 178,
        "quotactl": 179,
        "nfsservctl": 180,
        "lookup_dcookie": 212,
        "clock_settime": 227,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "migrate_pages": 256,
        "unshare": 272,
        "move_pages": 279,
        "perf_event_open": 298,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "clock_adjtime": 305,
        "setns": 308,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "finit_module": 313,
        "kexec_file_load": 320,
        "bpf": 321,
        "userfaultfd": 323,
        **_COMMON_NEW,
    },
)
_AARCH64 = _Arch(
    0xC00000B7,
    False,
    {
        "lookup_dcookie": 18,
        "umount2": 39,
        "mount": 40,
        "pivot_root": 41,
        "nfsservctl": 42,
        "chroot": 51,
        "vhangup": 58,
        "quotactl": 60,
        "acct": 89,
        "unshare": 97,
        "kexec_load": 104,
        "init_module": 105,
        "delete_module": 106,
        "clock_settime": 112,
        "syslog": 116,
        "ptrace": 117,
        "reboot": 142,
        "settimeofday": 170,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "clone": 220,
        "swapon": 224,
        "swapoff": 225,
        "migrate_pages": 238,
        "move_pages": 239,
        "perf_event_open": 241,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "clock_adjtime": 266,
        "setns": 268,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "finit_module": 273,
        "bpf": 280,
        "userfaultfd": 282,
        "kexec_file_load": 294,
        **_COMMON_NEW,
    },
)
_ARCHES = {"x86_64": _X86_64, "aarch64": _AARCH64}

# Refused with EPERM wherever the architecture has them. clone and clone3 are handled apart.
DENIED_SYSCALLS: tuple[str, ...] = (
    # mounts and root changes: the filesystem view is bubblewrap's business
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "open_tree_attr",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # namespaces: new user namespaces are the usual first step of a kernel exploit
    "unshare",
    "setns",
    # other processes' memory and descriptors
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "process_madvise",
    "kcmp",
    "move_pages",
    "migrate_pages",
    # kernel code, the machine, its clock and its logs
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    # large attack surfaces that ordinary programs do not need
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    # file handles bypass path lookup (the "shocker" escape); quotas; obsolete calls
    "open_by_handle_at",
    "name_to_handle_at",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "nfsservctl",
    "vhangup",
)


def native_arch() -> str:
    """The kernel's architecture name (``uname -m``), the key the filter is built for."""
    return platform.machine()


def unsupported_reason(arch: str | None = None) -> str | None:
    """None when :func:`build_filter` has a program for ``arch``, else why not (for a note)."""
    arch = arch or native_arch()
    if arch not in _ARCHES:
        return f"no seccomp filter for architecture {arch}"
    if arch == native_arch() and struct.calcsize("P") != 8:
        return f"no seccomp filter for 32-bit programs on {arch}"
    return None


class _Program:
    """A tiny assembler: instructions whose jumps name labels, resolved when packed."""

    def __init__(self) -> None:
        self._code: list[tuple[int, object, object, int]] = []
        self._labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self._labels[name] = len(self._code)

    def load(self, offset: int) -> None:
        self._code.append((_BPF_LD_W_ABS, 0, 0, offset))

    def jump(self, op: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self._code.append((op, jt, jf, k))

    def ret(self, value: int) -> None:
        self._code.append((_BPF_RET_K, 0, 0, value))

    def pack(self) -> bytes:
        out = bytearray()
        for index, (code, jt, jf, k) in enumerate(self._code):
            out += struct.pack("HBBI", code, self._offset(index, jt), self._offset(index, jf), k)
        return bytes(out)

    def _offset(self, index: int, target: object) -> int:
        if isinstance(target, int):
            return target
        offset = self._labels[str(target)] - index - 1
        if not 0 <= offset <= _MAX_JUMP:
            raise ValueError(f"seccomp jump to {target} out of range ({offset})")
        return offset


def build_filter(arch: str | None = None) -> bytes | None:
    """The compiled filter (``struct sock_filter[]``) for ``arch``, or None if it has none."""
    arch = arch or native_arch()
    if unsupported_reason(arch) is not None:
        return None
    table = _ARCHES[arch]
    denied = sorted({table.numbers[name] for name in DENIED_SYSCALLS if name in table.numbers})
    prog = _Program()
    prog.load(_OFF_ARCH)
    prog.jump(_BPF_JEQ_K, table.audit_arch, jt=1)
    prog.ret(_RET_KILL_PROCESS)
    prog.load(_OFF_NR)
    if table.x32_bit:
        prog.jump(_BPF_JSET_K, _X32_SYSCALL_BIT, jt="eperm")
    for nr in denied:
        prog.jump(_BPF_JEQ_K, nr, jt="eperm")
    prog.jump(_BPF_JEQ_K, table.numbers["clone3"], jt="enosys")
    prog.jump(_BPF_JEQ_K, table.numbers["clone"], jf="allow")
    prog.load(_OFF_ARG0_LOW)
    prog.jump(_BPF_JSET_K, NAMESPACE_CLONE_FLAGS, jt="eperm")
    prog.label("allow")
    prog.ret(_RET_ALLOW)
    prog.label("eperm")
    prog.ret(_RET_ERRNO | errno.EPERM)
    prog.label("enosys")
    prog.ret(_RET_ERRNO | errno.ENOSYS)
    return prog.pack()


@contextmanager
def filter_fd(program: bytes) -> Iterator[int]:
    """A readable descriptor holding ``program`` for ``bwrap --seccomp``; closed on exit.

    A pipe, written whole and its write end closed, because bubblewrap reads to end of file
    and the few hundred bytes fit in any pipe buffer. A fresh one per command: bubblewrap
    consumes it. The descriptor is not inheritable; pass it with ``Popen(pass_fds=...)``.
    """
    read_end, write_end = os.pipe()
    try:
        try:
            view = memoryview(program)
            while view:
                view = view[os.write(write_end, view) :]
        finally:
            os.close(write_end)
        yield read_end
    finally:
        os.close(read_end)
