"""Run model-written Python under limits, in namespaces where the kernel allows it.

`run_python` writes the code to `main.py` in a fresh temporary directory (with any extra files),
starts the launcher (sandbox/_launcher.py) in a new session with a clean environment, feeds stdin,
keeps at most `output_bytes` of stdout and stderr, and kills the whole sandbox at the wall-clock
limit. `capabilities()` says which isolation is active on this machine; see sandbox/README.md.

Thread-safe: no `preexec_fn` (Prefect runs tasks in threads); the launcher sets everything up
in its own process.
"""

from __future__ import annotations

import contextlib
import marshal
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox.limits import Limits, SandboxResult

LAUNCHER = Path(__file__).with_name("_launcher.py")
# The interpreter that runs the program (standard library only: it runs with -S); R1_SANDBOX_PYTHON
# names another, e.g. one the program's uid may execute when ours lives in a private home.
PYTHON = os.path.realpath(os.environ.get("R1_SANDBOX_PYTHON") or sys.executable)
# When root, each run gets its own uid from this range, so RLIMIT_NPROC counts only its processes
# and nothing it starts can signal or read another run's processes or files.
UID_BASE = 2_000_000_000
UID_SPAN = 1 << 24

_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
_DRAIN_AFTER_KILL_S = 1.0
_LAUNCHER_GRACE_S = 2.0


@dataclass(frozen=True)
class Capabilities:
    """The isolation `run_python` applies on this machine."""

    namespaces: bool  # private root, network, PID, IPC and UTS namespaces
    uid_drop: bool  # the program runs under its own unprivileged uid
    network_isolated: bool  # no interface but a down loopback: no connection can be made
    filesystem_isolated: bool  # only /usr, the interpreter, /work and /tmp are visible
    reason: str  # why namespaces are off, or "" when on
    runs_programs: bool = True  # False: even a trivial program fails (see `reason`)


_capabilities: Capabilities | None = None
_capabilities_lock = threading.Lock()


def capabilities() -> Capabilities:
    """Which isolation is active here, found once by a trial setup of the namespaces."""
    global _capabilities
    with _capabilities_lock:
        if _capabilities is None:
            _capabilities = _probe()
        return _capabilities


def _probe() -> Capabilities:
    root = os.geteuid() == 0
    if os.environ.get("R1_SANDBOX_NO_NAMESPACES"):
        reason = "disabled by R1_SANDBOX_NO_NAMESPACES"
    else:
        outcome = _launch("pass", "", Limits(), None, namespaces=True, probe=True)
        reason = "" if outcome.status == "ok" else outcome.detail or "namespace setup failed"
    on = not reason
    runs = True
    if not on:
        plain = _launch("pass", "", Limits(), None, namespaces=False, probe=False)
        runs = plain.status == "ok"
        if not runs:  # e.g. the interpreter lives where the run's uid cannot go
            reason += f"; and runs without namespaces fail too: {plain.detail}"
    return Capabilities(
        namespaces=on,
        uid_drop=root,
        network_isolated=on,
        filesystem_isolated=on,
        reason=reason,
        runs_programs=runs,
    )


def run_python(
    code: str,
    stdin: str = "",
    limits: Limits = Limits(),  # noqa: B008 - frozen, so sharing the default is safe
    files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run `code` as /work/main.py with `stdin`; `files` (relative path -> text) go beside it.

    Refused (sandbox_failed) when neither namespaces nor a uid drop is available, where the
    program could signal or read our own processes, unless R1_SANDBOX_UNISOLATED=1 allows it.
    """
    caps = capabilities()
    if not (caps.namespaces or caps.uid_drop or os.environ.get("R1_SANDBOX_UNISOLATED")):
        return SandboxResult("sandbox_failed", None, "", "", 0.0, f"no isolation: {caps.reason}")
    return _launch(code, stdin, limits, files, namespaces=caps.namespaces, probe=False)


def _launch(
    code: str,
    stdin: str,
    limits: Limits,
    files: dict[str, str] | None,
    *,
    namespaces: bool,
    probe: bool,
) -> SandboxResult:
    start = time.monotonic()
    root = os.geteuid() == 0
    uid, gid = _run_ids()
    base: Path | None = None
    try:
        base = Path(tempfile.mkdtemp(prefix="r1-sandbox-", dir=_scratch_dir(namespaces)))
        work = _prepare(base, code, files, uid, gid, namespaces=namespaces)
        config = {
            "namespaces": namespaces,
            "probe": probe,
            "root": str(base / "root"),
            "work": str(work),
            "binds": _interpreter_dirs(),
            "python": PYTHON,
            "env": _ENV if namespaces else {**_ENV, "HOME": str(work), "TMPDIR": str(work)},
            "uid": uid,
            "gid": gid,
            "tmpfs_mb": max(16, 4 * limits.file_size_mb),
            "limits": _rlimits(limits),
        }
        return _execute(config, stdin, limits, start, sweep_uid=uid if root else None)
    except Exception as exc:  # the sandbox, not the code, failed
        return SandboxResult(
            "sandbox_failed", None, "", "", time.monotonic() - start, f"{type(exc).__name__}: {exc}"
        )
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


def _scratch_dir(namespaces: bool) -> str | None:
    """Where the run's directory goes: /dev/shm when the program only reads it (namespaces: it
    writes to its own tmpfs), as creating and removing directories there is cheap; else the
    default temporary directory."""
    if namespaces and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return None


def _run_ids() -> tuple[int, int]:
    """The uid and gid the program runs under: a fresh one per run when root, else our own."""
    if os.geteuid() == 0:
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        return uid, uid
    return os.getuid(), os.getgid()


def _prepare(
    base: Path, code: str, files: dict[str, str] | None, uid: int, gid: int, *, namespaces: bool
) -> Path:
    """The run's directory: main.py and its files; owned by the program's uid outside namespaces."""
    work = base / "work"
    work.mkdir()
    (base / "root").mkdir()
    for name, text in (files or {}).items():
        path = work / name
        if Path(name).is_absolute() or not path.resolve().is_relative_to(work.resolve()):
            raise ValueError(f"sandbox file name must be relative and inside /work: {name!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_encode(text))
    (work / "main.py").write_bytes(_encode(code))
    if not namespaces and os.geteuid() == 0:
        base.chmod(0o711)  # the program may pass through, not list
        for path in [work, *work.rglob("*")]:
            os.chown(path, uid, gid)
    return work


def _encode(text: str) -> bytes:
    """UTF-8, lone surrogates kept as they are (the program then fails, not the sandbox)."""
    return text.encode("utf-8", "surrogatepass")


def _interpreter_dirs() -> list[str]:
    """Host directories the program's interpreter needs (bound read-only into the root)."""
    dirs = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    dirs.add(os.path.dirname(os.path.dirname(PYTHON)))
    return sorted(d for d in dirs if d not in ("/", "") and not d.startswith("/usr/"))


def _rlimits(limits: Limits) -> dict[str, int]:
    mb = 1024 * 1024
    return {
        "cpu": max(1, math.ceil(limits.cpu_seconds)),
        "memory": limits.memory_mb * mb,
        "file_size": limits.file_size_mb * mb,
        "processes": limits.processes,
    }


def _execute(
    config: dict, stdin: str, limits: Limits, start: float, sweep_uid: int | None
) -> SandboxResult:
    status_read, status_write = os.pipe()
    try:
        config["status_fd"] = status_write
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(LAUNCHER), marshal.dumps(config).hex()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": _ENV["PATH"], "LANG": _ENV["LANG"]},
            cwd="/",
            start_new_session=True,
            pass_fds=(status_write,),
        )
    except BaseException:
        os.close(status_read)
        raise
    finally:
        os.close(status_write)

    def end_all() -> None:
        if proc.poll() is None:  # the launcher kills the init and returns once it is reaped
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(_LAUNCHER_GRACE_S)
        _kill_group(proc.pid)
        if sweep_uid is not None and not config["namespaces"]:
            _kill_uid(sweep_uid)

    with os.fdopen(status_read, "rb") as status_pipe:
        deadline = start + limits.wall_seconds
        stdout, stderr, timed_out = _communicate(
            proc, _encode(stdin), limits.output_bytes, deadline, end_all
        )
        end_all()
        messages = [
            marshal.loads(bytes.fromhex(line.decode()))
            for line in status_pipe.read().splitlines()
            if line.strip()
        ]
    return _result(messages, stdout, stderr, timed_out, limits, time.monotonic() - start)


def _communicate(
    proc: subprocess.Popen, stdin: bytes, cap: int, deadline: float, end_all: Callable[[], None]
) -> tuple[bytes, bytes, bool]:
    """Feed stdin and read both outputs (each kept up to `cap` bytes) until exit or deadline.

    True in the last place when the launcher was still running at the deadline. Once the launcher
    has ended (or been ended), whatever still holds the outputs open is killed and they are
    drained briefly.
    """
    assert proc.stdin and proc.stdout and proc.stderr
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    selector = selectors.DefaultSelector()
    for fd in (out_fd, err_fd):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(in_fd, False)
        selector.register(in_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    timed_out = ended = False
    try:
        while any(key.fd != in_fd for key in selector.get_map().values()):
            now = time.monotonic()
            if not ended and (now >= deadline or proc.poll() is not None):
                timed_out = proc.poll() is None
                end_all()
                ended = True
                deadline = time.monotonic() + _DRAIN_AFTER_KILL_S
            elif ended and now >= deadline:
                break
            for key, _ in selector.select(min(0.05, max(0.0, deadline - now))):
                if key.fd == in_fd:
                    pending = _write_some(selector, proc, pending)
                else:
                    _read_some(selector, key.fd, kept[key.fd], cap)
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            end_all()
            proc.wait()
    finally:
        selector.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()
    return bytes(kept[out_fd]), bytes(kept[err_fd]), timed_out


def _write_some(
    selector: selectors.BaseSelector, proc: subprocess.Popen, pending: memoryview
) -> memoryview:
    assert proc.stdin
    try:
        pending = pending[os.write(proc.stdin.fileno(), pending[:65536]) :]
    except BlockingIOError:
        return pending
    except OSError:  # the program closed its stdin
        pending = pending[:0]
    if not pending:
        selector.unregister(proc.stdin.fileno())
        with contextlib.suppress(OSError):
            proc.stdin.close()
    return pending


def _read_some(selector: selectors.BaseSelector, fd: int, kept: bytearray, cap: int) -> None:
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return
    if not chunk:
        selector.unregister(fd)
    elif len(kept) < cap:
        kept += chunk[: cap - len(kept)]


def _kill_group(pgid: int) -> None:
    """SIGKILL the launcher's process group; the init's death then ends its PID namespace."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_uid(uid: int) -> None:
    """SIGKILL every live process of the run's own uid (without namespaces, when root)."""
    import psutil  # only this fallback needs it

    for _ in range(50):
        alive = [
            proc
            for proc in psutil.process_iter(["uids", "status"])
            if proc.info["uids"] is not None
            and uid in (proc.info["uids"].real, proc.info["uids"].effective)
            and proc.info["status"] != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    raise RuntimeError(f"processes of sandbox uid {uid} survive repeated kills")


_SIGNAL_DETAIL = {
    signal.SIGXCPU: "cpu time limit",
    signal.SIGXFSZ: "file size limit",
    signal.SIGSEGV: "segmentation fault (possibly the memory limit)",
}


def _result(
    messages: list[dict],
    stdout: bytes,
    stderr: bytes,
    timed_out: bool,
    limits: Limits,
    seconds: float,
) -> SandboxResult:
    """Classify the run from the launcher's status messages."""
    out = stdout.decode("utf-8", errors="replace")
    err = stderr.decode("utf-8", errors="replace")

    def result(status: str, code: int | None, detail: str) -> SandboxResult:
        return SandboxResult(status, code, out, err, seconds, detail)

    failed = [m for m in messages if m["kind"] in ("setup_failed", "exec_failed")]
    if failed:
        return result("sandbox_failed", None, f"{failed[0]['kind']}: {failed[0]['error']}")
    if any(m["kind"] == "probe_ok" for m in messages):
        return result("ok", 0, "probe")
    exits = [m for m in messages if m["kind"] == "exit"]
    if timed_out:
        return result("timeout", None, f"wall clock limit ({limits.wall_seconds:g}s)")
    if not exits:
        return result("sandbox_failed", None, "the launcher ended without a status")
    code, cpu = exits[0]["code"], exits[0]["cpu"]
    if code == 0:
        return result("ok", 0, "")
    if code > 0:
        return result("error", code, _error_detail(code, err))
    sig = signal.Signals(-code)
    detail = _SIGNAL_DETAIL.get(sig, f"signal {sig.name}")
    if sig == signal.SIGKILL and cpu >= math.ceil(limits.cpu_seconds):
        detail = "cpu time limit"
    return result("killed", code, f"{detail} ({sig.name}, cpu {cpu:.2f}s)")


def _error_detail(code: int, stderr: str) -> str:
    tail = stderr.strip().splitlines()[-1:] or [""]
    if "MemoryError" in tail[0]:
        return "memory limit (MemoryError)"
    if "File too large" in stderr:
        return "file size limit (File too large)"
    return f"exit code {code}" + (f": {tail[0][:200]}" if tail[0] else "")
