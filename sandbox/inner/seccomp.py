"""A seccomp filter for sandboxed programs, written as classic BPF with the standard library only.

What it refuses (EPERM, so the program sees an ordinary error, except clone3: ENOSYS, so that the
C library falls back to clone, whose flags the filter can read):
- memory a process holds outside its address space: `memfd_create`, `memfd_secret`,
  `userfaultfd`, and a pipe grown past its default size (`fcntl(F_SETPIPE_SZ)`);
- System V IPC (`shmget`, `shmat`, `semget`, `msgget` and the rest) and POSIX message queues
  (`mq_open` and the rest): objects that outlive the process that made them, and that another
  process could find by key or name (each program also has an IPC namespace of its own);
- `io_uring_*` (asynchronous I/O beyond the filter's view), `bpf`, `perf_event_open`, the kernel
  keyring (`add_key`, `request_key`, `keyctl`);
- sockets of any family but AF_UNIX (`socket`, `socketpair`);
- reaching other processes: `ptrace`, `process_vm_readv/writev`, `kcmp`, `pidfd_open`,
  `pidfd_getfd`, `pidfd_send_signal`; signals to -1, to the sandbox's own processes (`guarded`)
  and, when the program may not start processes, to anything but itself;
- namespaces and mounts: `unshare`, `setns`, `mount`, `umount2`, `pivot_root`, `chroot`;
- when `spawn` is False: new processes (`fork`, `vfork`, `clone` without CLONE_THREAD, `clone3`)
  and `execve`/`execveat`. Threads stay allowed.

Only x86_64 is supported; `supported()` is False elsewhere and the sandbox says so at start.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000

# x86_64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl)
NR = {
    "shmget": 29,
    "shmat": 30,
    "shmctl": 31,
    "socket": 41,
    "socketpair": 53,
    "clone": 56,
    "fork": 57,
    "vfork": 58,
    "execve": 59,
    "kill": 62,
    "semget": 64,
    "semop": 65,
    "semctl": 66,
    "shmdt": 67,
    "msgget": 68,
    "msgsnd": 69,
    "msgrcv": 70,
    "msgctl": 71,
    "fcntl": 72,
    "ptrace": 101,
    "rt_sigqueueinfo": 129,
    "pivot_root": 155,
    "chroot": 161,
    "mount": 165,
    "umount2": 166,
    "tkill": 200,
    "semtimedop": 220,
    "tgkill": 234,
    "mq_open": 240,
    "mq_unlink": 241,
    "mq_timedsend": 242,
    "mq_timedreceive": 243,
    "mq_notify": 244,
    "mq_getsetattr": 245,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "rt_tgsigqueueinfo": 297,
    "perf_event_open": 298,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "memfd_create": 319,
    "bpf": 321,
    "execveat": 322,
    "userfaultfd": 323,
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "pidfd_open": 434,
    "clone3": 435,
    "pidfd_getfd": 438,
    "memfd_secret": 447,
}

IPC_CALLS = (
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget",
    "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
)  # fmt: skip
ALWAYS_DENIED = (
    "memfd_create", "memfd_secret", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "bpf", "perf_event_open", "add_key", "request_key", "keyctl", "ptrace",
    "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "tkill",
    *IPC_CALLS,
)  # fmt: skip
SPAWN_DENIED = ("fork", "vfork", "execve", "execveat")
# Signal calls whose first argument names the target process (or group, when negative).
SIGNAL_CALLS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")

AF_UNIX = 1
CLONE_THREAD = 0x00010000
F_SETPIPE_SZ = 1031

# classic BPF opcodes
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K

RET_ALLOW = 0x7FFF0000
RET_KILL = 0x80000000  # SECCOMP_RET_KILL_PROCESS


def RET_ERRNO(err: int) -> int:  # noqa: N802 - the kernel's name
    return 0x00050000 | err


# offsets in struct seccomp_data
OFF_NR, OFF_ARCH = 0, 4


def off_arg(i: int) -> int:
    return 16 + 8 * i  # low 32 bits of args[i] (little-endian)


PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def supported() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


Insn = tuple[int, int, int, int]


def _stmt(code: int, k: int) -> Insn:
    return (code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> Insn:
    return (code, jt, jf, k)


def build(spawn: bool, self_pid: int, guarded: tuple[int, ...]) -> list[Insn]:
    """The filter's instructions.

    `self_pid` is the program's own pid (its only allowed signal target when it may not spawn);
    `guarded` are pids no signal may reach (the sandbox's init, zygote and judge).
    """
    eperm = RET_ERRNO(errno.EPERM)
    prog: list[Insn] = [
        _stmt(LD_W_ABS, OFF_ARCH),
        _jump(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        _stmt(RET_K, RET_KILL),
        _stmt(LD_W_ABS, OFF_NR),
        _jump(JGE_K, X32_BIT, 0, 1),  # the x32 ABI: another set of numbers, refused whole
        _stmt(RET_K, eperm),
    ]
    denied = list(ALWAYS_DENIED) + ([] if spawn else list(SPAWN_DENIED))
    for name in denied:
        prog += [_jump(JEQ_K, NR[name], 0, 1), _stmt(RET_K, eperm)]
    prog += [_jump(JEQ_K, NR["clone3"], 0, 1), _stmt(RET_K, RET_ERRNO(errno.ENOSYS))]
    prog += _arg_rules(spawn, self_pid, guarded, eperm)
    prog.append(_stmt(RET_K, RET_ALLOW))
    return prog


def _arg_rules(spawn: bool, self_pid: int, guarded: tuple[int, ...], eperm: int) -> list[Insn]:
    """Rules that read an argument; each block starts with the system call number loaded and
    leaves it loaded (or returns)."""
    rules: list[Insn] = []
    for name in ("socket", "socketpair"):  # family: AF_UNIX only
        rules += [
            _jump(JEQ_K, NR[name], 0, 4),
            _stmt(LD_W_ABS, off_arg(0)),
            _jump(JEQ_K, AF_UNIX, 0, 1),
            _stmt(RET_K, RET_ALLOW),
            _stmt(RET_K, eperm),
        ]
    rules += [  # fcntl(fd, F_SETPIPE_SZ, ...)
        _jump(JEQ_K, NR["fcntl"], 0, 4),
        _stmt(LD_W_ABS, off_arg(1)),
        _jump(JEQ_K, F_SETPIPE_SZ, 0, 1),
        _stmt(RET_K, eperm),
        _stmt(RET_K, RET_ALLOW),
    ]
    if not spawn:  # clone: threads only
        rules += [
            _jump(JEQ_K, NR["clone"], 0, 4),
            _stmt(LD_W_ABS, off_arg(0)),
            _jump(JSET_K, CLONE_THREAD, 0, 1),
            _stmt(RET_K, RET_ALLOW),
            _stmt(RET_K, eperm),
        ]
    for name in SIGNAL_CALLS:
        rules += _signal_rule(NR[name], spawn, self_pid, guarded, eperm)
    return rules


def _signal_rule(nr: int, spawn: bool, self_pid: int, guarded: tuple[int, ...], eperm: int):
    """Allow a signal call by its target (argument 0, compared on its low 32 bits)."""
    if spawn:  # any target but -1 and the guarded processes (as pids or as groups)
        refused = (
            [0xFFFFFFFF] + [p & 0xFFFFFFFF for p in guarded] + [-p & 0xFFFFFFFF for p in guarded]
        )
        body: list[Insn] = [_stmt(LD_W_ABS, off_arg(0))]
        for i, target in enumerate(refused):
            to_refuse = len(refused) - i  # jump over the remaining checks and the allow
            body.append(_jump(JEQ_K, target, to_refuse, 0))
        body += [_stmt(RET_K, RET_ALLOW), _stmt(RET_K, eperm)]
    else:  # itself only (0: its own process group, which is itself after setsid)
        body = [
            _stmt(LD_W_ABS, off_arg(0)),
            _jump(JEQ_K, self_pid & 0xFFFFFFFF, 2, 0),
            _jump(JEQ_K, 0, 1, 0),
            _stmt(RET_K, eperm),
            _stmt(RET_K, RET_ALLOW),
        ]
    return [_jump(JEQ_K, nr, 0, len(body)), *body]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PID_PLACEHOLDER = 0x7FFFFFFE  # above any pid (PID_MAX_LIMIT is 2**22)


class Filter:
    """A filter built and laid out in memory once (in the zygote); a forked process fills in its
    own pid and installs it. Building it in each process would touch, and so copy, many pages."""

    def __init__(self, spawn: bool, guarded: tuple[int, ...]):
        program = build(spawn, _PID_PLACEHOLDER, guarded)
        packed = pack(program)
        self.pid_slots = [
            8 * i + 4 for i, insn in enumerate(program) if insn[3] == _PID_PLACEHOLDER
        ]
        self.buffer = ctypes.create_string_buffer(packed, len(packed))
        self.fprog = _SockFprog(len(packed) // 8, ctypes.cast(self.buffer, ctypes.c_void_p))
        self.pointer = ctypes.byref(self.fprog)

    def install_for(self, pid: int) -> None:
        """Install the filter with `pid` as the program's own pid. Raises OSError."""
        for offset in self.pid_slots:
            struct.pack_into("I", self.buffer, offset, pid & 0xFFFFFFFF)
        _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self.pointer, 0, 0)


def pack(prog: list[Insn]) -> bytes:
    return b"".join(struct.pack("HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


# The C library, with the functions the sandbox calls looked up once (here, in the zygote).
LIBC = ctypes.CDLL(None, use_errno=True)
for _name in ("prctl", "unshare", "mount", "syscall"):
    getattr(LIBC, _name)


def _prctl(option: int, *args: object) -> None:
    if LIBC.prctl(option, *args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {errno.errorcode.get(err, err)}")


def install(packed: bytes) -> None:
    """Install a packed filter on the calling process (after no_new_privs). Raises OSError."""
    buffer = ctypes.create_string_buffer(packed, len(packed))
    fprog = _SockFprog(len(packed) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
