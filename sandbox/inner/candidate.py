"""The process that runs one program: forked from the zygote, confined, then the program's own.

`start` never returns. Confinement comes first, in this order, before any of the program's code is
read: its own session; a private /work and /tmp (a mount namespace of its own, when the sandbox
has namespaces); its memory cgroup; its descriptors (0-2 and the channel to the judge, 3, nothing
else); resource limits; its own uid (when the sandbox is root); no new privileges and the seccomp
filter. Then it tells the judge it is ready (a setup failure before that point is the sandbox's,
after it the program's) and reads the program.

Two modes, each serving one program's runs or tests, one after another, until the judge says
bye (the judge starts a fresh process after one that ended abnormally):
- program: for each run the judge sends fresh stdin, stdout and stderr (SCM_RIGHTS on the
  channel); the code runs as a fresh `__main__` on them, and the harness reports its exit code:
  0 when it returns, SystemExit's code, or 1 with the traceback on stderr. atexit hooks and
  `sys.excepthook` do not run. Between runs the interpreter's state the code may have changed
  (builtins, signal handlers, the working directory, sys.path, tracing) is put back.
- calls (sandbox/inner/callee.py): the code is loaded as a module (`__name__ == "solution"`), its
  top-level names are reported, and the judge's calls are answered one message each, values as
  plain data (sandbox/inner/wire.py). Its stdout and stderr go to /dev/null.
Each run or test gets `cpu_seconds` of CPU: the judge reads the process's CPU clock from outside
and has it killed there (sandbox/inner/process.py). The process's RLIMIT_CPU, like each of its
limits, has hard = soft, set before the program exists: the program can lower its limits but
never raise one.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import fcntl
import io
import json
import os
import resource
import signal
import socket
import sys
import traceback
import types
from typing import Any, NoReturn

from sandbox.inner import callee, seccomp, wire
from sandbox.inner.cgroups import RunCgroups

CHANNEL = 3
DEVNULL = 4
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV = 2, 4
PR_SET_PDEATHSIG = 1
REQUEST_LIMIT = 64 << 20

_libc = seccomp.LIBC
READY = wire.dumps({"ready": True})


def start(setup: dict, fds: list[int], cgroups: RunCgroups | None) -> NoReturn:
    """Confine this process as `setup` says and serve the program's runs; never returns.

    `fds` become descriptors 0-3: /dev/null three times and the channel to the judge.
    """
    placed = [False]
    builtins.exit = builtins.quit = _Quitter()  # type: ignore[attr-defined]
    try:
        _confine(setup, fds, cgroups, placed)
        os.write(CHANNEL, READY)
        load = wire.read_message(CHANNEL, REQUEST_LIMIT)
    except BaseException as exc:  # noqa: BLE001 - the sandbox failed, not the program
        if placed[0]:
            _report_setup_failure(exc)
        os._exit(127)
    if setup["mode"] == "calls":
        callee.serve(load, CHANNEL, REQUEST_LIMIT)
    serve_program(load, setup["work"])


# What CPython sets at start-up (Python/pylifecycle.c, signal_install_handlers): SIGPIPE and
# SIGXFSZ ignored (a write to a closed pipe or over the file size limit is an OSError, EPIPE or
# EFBIG), SIGINT raising KeyboardInterrupt. Every other signal keeps its default action.
PYTHON_SIGNALS = {signal.SIGPIPE: signal.SIG_IGN, signal.SIGXFSZ: signal.SIG_IGN,
                  signal.SIGINT: signal.default_int_handler}  # fmt: skip


class _Quitter:
    """`exit()` and `quit()`, which `python main.py` has from the site module and the session,
    run without it (-S), would otherwise lack: they raise SystemExit, as sys.exit does."""

    def __repr__(self) -> str:
        return "Use exit() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code: object = None) -> NoReturn:
        raise SystemExit(code)


def _default_signals() -> None:
    """Signals as a fresh `python main.py` started from a terminal has them, whatever the sandbox
    was started under (nohup leaves SIGHUP ignored, a shell's background job SIGINT): CPython's
    own (PYTHON_SIGNALS), every other one at its default action, and none blocked."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):  # the C library's own (32, 33)
            signal.signal(sig, PYTHON_SIGNALS.get(sig, signal.SIG_DFL))
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _confine(setup: dict, fds: list[int], cgroups: RunCgroups | None, placed: list[bool]) -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    os.setsid()
    _default_signals()
    if setup["namespaces"]:
        _private_dirs(setup)
    if cgroups is not None and setup.get("cgroup"):
        cgroups.join(setup["cgroup"])
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]  # out of the way of 0-3
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(CHANNEL + 1, 1 << 20)
    os.open(os.devnull, os.O_RDWR)  # DEVNULL: where 0-2 point between runs
    placed[0] = True
    _set_limits(setup["rlimits"])
    _drop_privileges(setup["uid"], setup["gid"])
    _drop_capabilities()
    if setup["seccomp"]:
        setup["filter"].install_for(os.getpid())
    else:
        _check(_libc.prctl(seccomp.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    os.chdir(setup["work"])
    os.environ.clear()
    os.environ.update(setup["env"])


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _private_dirs(setup: dict) -> None:
    """Namespaces of its own for what a program could leave behind or share with another: mounts
    (a fresh tmpfs on /work and /tmp, owned by its uid; /dev/shm, where POSIX shared memory and
    semaphores live, points into /tmp), IPC (System V objects and POSIX message queues) and the
    network (abstract AF_UNIX socket names live in one). All of it goes with its last process."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET), "unshare(mount, ipc, net)")
    options = (
        f"size={setup['tmpfs_mb']}m,nr_inodes=4096,mode=700,uid={setup['uid']},gid={setup['gid']}"
    )
    for target in ("/work", "/tmp"):
        result = _libc.mount(
            b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()
        )
        _check(result, f"mount tmpfs on {target}")


def _set_limits(limits: dict[str, int]) -> None:
    """Every resource limit with hard = soft: what the program gets is what it can ever have
    (it may lower a limit, never raise one). Those the sandbox does not set keep their soft
    value as the hard one too."""
    chosen = {
        resource.RLIMIT_CPU: limits["cpu"],  # the whole job's; each run's is kept by the judge
        resource.RLIMIT_AS: limits["memory"],
        resource.RLIMIT_FSIZE: limits["file_size"],
        resource.RLIMIT_NPROC: limits["processes"],
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_MSGQUEUE: 0,
        resource.RLIMIT_MEMLOCK: 0,
    }
    for which in _rlimits():
        soft, hard = resource.getrlimit(which)
        value = chosen.get(which, soft)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard) if value != resource.RLIM_INFINITY else hard
        resource.setrlimit(which, (value, value))


def _rlimits() -> list[int]:
    return [getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")]


_CAPABILITY_VERSION_3 = 0x20080522
SYS_CAPSET = 126  # x86_64; elsewhere the drop is skipped (see _drop_capabilities)


def _drop_capabilities() -> None:
    """No capability left. Root's uid drop clears them; a sandbox that is not root runs in a
    user namespace it made, where every process holds all of them until it gives them up (the
    program could otherwise rename the host in the session's UTS namespace or reconfigure its
    network). Skipped where the system call number is not known (not x86_64)."""
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if seccomp.supported():
        _check(_libc.syscall(SYS_CAPSET, header, data), "capset")


def _drop_privileges(uid: int, gid: int) -> None:
    if os.getuid() == 0 and uid != 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("could not drop to the program's uid")


def _report_setup_failure(exc: BaseException) -> None:
    with contextlib.suppress(BaseException):  # else the judge sees the channel close instead
        wire.write_message(CHANNEL, {"setup_failed": f"{type(exc).__name__}: {exc}"[:500]})


# ---- program mode -------------------------------------------------------------------------------


def serve_program(load: dict, work: str) -> NoReturn:
    """Run the program once per request, on the descriptors that come with it."""
    code = str(load["code"])
    files = {**(load.get("files") or {}), "main.py": code}
    channel = socket.socket(fileno=CHANNEL)
    baseline = _Baseline(work)
    try:
        compiled = compile(code, os.path.join(work, "main.py"), "exec", dont_inherit=True)
    except BaseException as exc:  # noqa: BLE001 - reported by every run, as Python would
        compiled = exc
    while True:
        request, fds = _receive(channel)
        if request.get("op") != "run" or len(fds) != 3:
            os._exit(0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        status, end = _run_once(compiled, files, work)
        for fd in (0, 1, 2):  # the judge sees this run's outputs close
            os.dup2(DEVNULL, fd)
        baseline.restore()
        wire.write_message(CHANNEL, {"nonce": request.get("nonce"), "exit": status, "end": end})


def _receive(channel: socket.socket) -> tuple[dict, list[int]]:
    """One message and the descriptors that came with it; exits when the judge is gone."""
    data, fds = b"", []
    while (
        len(data) < wire.HEADER.size
        or len(data) < wire.HEADER.size + wire.HEADER.unpack(data[: wire.HEADER.size])[0]
    ):
        chunk, new, _, _ = socket.recv_fds(channel, 1 << 16, 3)
        if not chunk:
            os._exit(0)
        data, fds = data + chunk, fds + new
    return json.loads(data[wire.HEADER.size :]), fds


def _run_once(
    compiled: types.CodeType | BaseException, files: dict[str, str], work: str
) -> tuple[int, dict[str, Any]]:
    """The program once, as `python main.py` would run it: its exit status and how it ended
    (`ending`), or, in a process it forked, the end of that process."""
    owner = os.getpid()
    _fresh_streams()
    main = types.ModuleType("__main__")
    main.__file__ = os.path.join(work, "main.py")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    try:
        _write_files(work, files)
        if isinstance(compiled, BaseException):
            raise compiled
        exec(compiled, main.__dict__)
        _join_threads()
        status, end = 0, {"kind": "returned"}
    except SystemExit as exc:
        status, end = _system_exit_code(exc), {"kind": "exit"}
    except BaseException as exc:  # noqa: BLE001 - the program's error: reported as Python would
        with contextlib.suppress(BaseException):  # from the program's own frame on
            tb = exc.__traceback__.tb_next if exc is not compiled else None
            traceback.print_exception(type(exc), exc, tb)
        status, end = ending(exc, compiled=exc is compiled)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # an output the program closed or broke
            stream.flush()
    if os.getpid() != owner:  # a process the program forked, at the program's end: it ends here
        os._exit(status & 0xFF)
    main.__dict__.clear()
    return status, end


def ending(exc: BaseException, compiled: bool) -> tuple[int, dict[str, Any]]:
    """The exit status and the kind of end of an uncaught exception: "syntax" when the program
    does not compile, else "exception" with its type (and errno). An uncaught KeyboardInterrupt
    ends CPython by SIGINT: status -2, as that signal would."""
    if isinstance(exc, KeyboardInterrupt):
        return -int(signal.SIGINT), {"kind": "signal"}
    end: dict[str, Any] = {"kind": "exception", "type": type(exc).__name__[:100]}
    if compiled and not isinstance(exc, MemoryError):
        end["kind"] = "syntax"
    if isinstance(exc, OSError) and isinstance(exc.errno, int):
        end["errno"] = exc.errno
    return 1, end


def _fresh_streams() -> None:
    """Standard streams on descriptors 0-2, as a fresh `python main.py` has them."""
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), "utf-8")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), "utf-8")
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)), "utf-8", "backslashreplace"
    )
    sys.stderr.reconfigure(line_buffering=True)


class _Baseline:
    """The interpreter state a run starts from, put back after each run."""

    def __init__(self, work: str):
        self.work = work
        sys.path[:] = [work, *[p for p in sys.path if p.startswith(sys.base_prefix)]]
        sys.argv = ["main.py"]
        sys.excepthook = sys.__excepthook__
        self.path = list(sys.path)
        self.builtins = dict(builtins.__dict__)
        self.environ = dict(os.environ)
        self.recursion = sys.getrecursionlimit()
        self.handlers = {sig: signal.getsignal(sig) for sig in _catchable()}

    def restore(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        for sig, handler in self.handlers.items():
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        sys.settrace(None)
        sys.setprofile(None)
        sys.setrecursionlimit(self.recursion)
        sys.excepthook = sys.__excepthook__
        sys.path[:] = self.path
        sys.argv = ["main.py"]
        builtins.__dict__.clear()
        builtins.__dict__.update(self.builtins)
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        os.chdir(self.work)


def _catchable() -> list[signal.Signals]:
    return [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def _write_files(work: str, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = os.path.normpath(os.path.join(work, name))
        if not path.startswith(work.rstrip("/") + "/"):
            raise ValueError(f"file name outside the work directory: {name!r}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(text.encode("utf-8", "surrogatepass"))


def _join_threads() -> None:
    """Wait for the run's non-daemon threads, as the interpreter does at exit."""
    threading = sys.modules.get("threading")
    if threading is None:
        return
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(BaseException):
        print(exc.code, file=sys.stderr)
    return 1
