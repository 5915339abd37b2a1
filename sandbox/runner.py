"""Run model-written Python in a sandbox session: many runs, one confined process each.

`run_jobs(jobs)` starts one session (sandbox/inner/launcher.py: namespaces, a private root, a
zygote that forks each run's process, a judge that runs the tests) for a whole batch, sends the
jobs, and turns what comes back into a `SandboxResult` per program job and a list of `Verdict`s
per calls job. `run_python` is one program job. `capabilities()` says which guards are in force
here (found once per process by a trial session) and logs a warning naming what is not contained.

Thread-safe: no `preexec_fn` (Prefect runs tasks in threads); the launcher sets everything up in
its own process.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.host_dirs import interpreter_dirs, site_packages_dirs
from sandbox.inner import cgroups, seccomp, wire
from sandbox.inner.process import GRACE_SECONDS, SETUP_SECONDS
from sandbox.limits import Limits, SandboxResult, Verdict
from sandbox.outcome import classify, verdict_of

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("inner") / "launcher.py"
# The interpreter the session runs on (standard library only: it runs with -I -S); it must be one
# the programs' uids may read when the sandbox has no private root (R1_SANDBOX_PYTHON names one).
PYTHON = os.path.realpath(os.environ.get("R1_SANDBOX_PYTHON") or sys.executable)
UID_BASE = 2_000_000_000  # when root, each session takes a block of uids from here
UID_SPAN = 1 << 24
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
STARTUP_SECONDS = 15.0
RESULT_LIMIT = 512 << 20


@dataclass(frozen=True)
class Job:
    """One program: run once per stdin in `inputs` (a program job), or loaded as a module and
    checked by assert-style `tests` run in the judge (a calls job). Each run or test has the
    whole of `limits`; they share one confined process while it keeps running normally."""

    code: str
    inputs: tuple[str, ...] = ("",)
    files: dict[str, str] | None = None
    tests: tuple[str, ...] | None = None
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Capabilities:
    """The guards a session applies on this machine."""

    namespaces: bool  # private root, network, PID, IPC and UTS namespaces
    uid_drop: bool  # each run has its own unprivileged uid
    network_isolated: bool  # no interface but a down loopback
    filesystem_isolated: bool  # only /usr, the interpreter (no site-packages), /work and /tmp
    reason: str  # why namespaces are off, or ""
    runs_programs: bool = True  # False: even a trivial program fails (see `reason`)
    cgroup: str = ""  # "v2", "v1" or "": the memory cgroup each run gets
    seccomp: bool = False  # the system call filter (sandbox/inner/seccomp.py)
    uncontained: tuple[str, ...] = ()  # what is not contained here, in words


_capabilities: Capabilities | None = None
_capabilities_lock = threading.Lock()
_session_lock = threading.Lock()
_cgroup: cgroups.MemoryCgroup | None = None
_cgroup_reason = ""


def capabilities() -> Capabilities:
    """The guards in force here, found once by a trial session."""
    global _capabilities
    with _capabilities_lock:
        if _capabilities is None:
            _capabilities = _probe()
            log.info("sandbox guards: %s", describe(_capabilities))
            for gap in _capabilities.uncontained:
                log.warning("sandbox: %s", gap)
        return _capabilities


def _probe() -> Capabilities:
    global _cgroup, _cgroup_reason
    _cgroup, _cgroup_reason = cgroups.find_memory_cgroup()
    _remove_stale_sessions()
    root = os.geteuid() == 0
    reason = ""
    guards: dict[str, Any] = {}
    if os.environ.get("R1_SANDBOX_NO_NAMESPACES"):
        reason = "disabled by R1_SANDBOX_NO_NAMESPACES"
    else:
        result, guards = _Session([Job("pass")], namespaces=True, workers=1).run_with_guards()
        if result[0][0].status != "ok":
            reason = result[0][0].detail or "namespace setup failed"
    on = not reason
    runs = True
    if not on:
        result, guards = _Session([Job("pass")], namespaces=False, workers=1).run_with_guards()
        runs = result[0][0].status == "ok"
        if not runs:
            reason += f"; and runs without namespaces fail too: {result[0][0].detail}"
    caps = Capabilities(
        namespaces=on,
        uid_drop=root,
        network_isolated=on,
        filesystem_isolated=on,
        reason=reason,
        runs_programs=runs,
        cgroup=f"v{guards['cgroup']}" if guards.get("cgroup") else "",
        seccomp=bool(guards.get("seccomp")),
    )
    return Capabilities(**{**caps.__dict__, "uncontained": _uncontained(caps)})


def describe(caps: Capabilities) -> str:
    """The guards in force, in a line."""
    guards = [
        "namespaces (mount, IPC and network ones per program) and a private root"
        if caps.namespaces
        else "no namespaces",
        "a uid per run" if caps.uid_drop else "one shared uid",
        f"memory cgroup {caps.cgroup}" if caps.cgroup else "no memory cgroup",
        "seccomp filter" if caps.seccomp else "no seccomp filter",
    ]
    return ", ".join(guards)


def _uncontained(caps: Capabilities) -> tuple[str, ...]:
    gaps = []
    if not caps.namespaces:
        gaps.append(
            f"no namespaces ({caps.reason}): programs can reach the network, read world-readable "
            "files, write the world-writable /tmp and /dev/shm and share abstract socket names"
        )
    if not caps.cgroup:
        held = "memfd_create is refused by seccomp" if caps.seccomp else "memfd files"
        gaps.append(
            f"no memory cgroup ({_cgroup_reason}): memory outside a process's address space is not "
            f"bounded in total ({held}; tmpfs files up to the tmpfs size; pipe and socket buffers)"
        )
    if not caps.seccomp:
        why = "not x86_64" if not seccomp.supported() else "the kernel refused the filter"
        gaps.append(
            f"no seccomp filter ({why}): memfd_create, io_uring, non-AF_UNIX sockets, ptrace, "
            "System V IPC and signals to other processes are not refused by a filter"
        )
    if not caps.uid_drop:
        gaps.append("not root: every run and the judge share one uid")
    return tuple(gaps)


Outcome = list[SandboxResult] | list[Verdict]


def run_jobs(jobs: Sequence[Job], workers: int | None = None) -> list[Outcome]:
    """Run every job in one session: a SandboxResult per input of a program job, a Verdict per
    test of a calls job. Refused (every result sandbox_failed) where there is no isolation at
    all, unless R1_SANDBOX_UNISOLATED=1 allows it."""
    if not jobs:
        return []
    caps = capabilities()
    refused = ""
    if not caps.runs_programs:
        refused = f"the sandbox cannot run programs here: {caps.reason}"
    elif not (caps.namespaces or caps.uid_drop or os.environ.get("R1_SANDBOX_UNISOLATED")):
        refused = f"no isolation: {caps.reason}"
    if refused:
        return [_failed(job, refused) for job in jobs]
    session = _Session(jobs, namespaces=caps.namespaces, workers=workers or default_workers())
    return session.run_with_guards()[0]


def default_workers() -> int:
    """Runs in flight: one per core, plus one to fill the gaps while others wait on the zygote."""
    return (os.cpu_count() or 1) + 1


def run_python(
    code: str,
    stdin: str = "",
    limits: Limits = Limits(),  # noqa: B008 - frozen, so sharing the default is safe
    files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run `code` as /work/main.py with `stdin`; `files` (relative path -> text) go beside it."""
    (result,) = run_jobs([Job(code, (stdin,), files, None, limits)], workers=1)[0]
    assert isinstance(result, SandboxResult)
    return result


def _failed(job: Job, detail: str) -> Outcome:
    if job.tests is not None:
        return [Verdict(None, "sandbox_failed", detail) for _ in job.tests]
    return [_sandbox_failed(detail) for _ in job.inputs]


def _sandbox_failed(detail: str) -> SandboxResult:
    return SandboxResult("sandbox_failed", None, "", "", 0.0, detail, "sandbox_failed")


class _Session:
    """One launch of the sandbox for a batch of jobs."""

    def __init__(self, jobs: Sequence[Job], namespaces: bool, workers: int):
        self.jobs = list(jobs)
        self.namespaces = namespaces
        self.workers = max(1, min(workers, len(self.jobs)))
        self.results: dict[int, dict[str, Any]] = {}
        self.frames = wire.Frames(RESULT_LIMIT)
        self.guards: dict[str, Any] = {}
        self.status: list[dict[str, Any]] = []

    def run_with_guards(self) -> tuple[list[Outcome], dict[str, Any]]:
        with _session_lock if os.environ.get("R1_SANDBOX_SERIAL") else contextlib.nullcontext():
            why = self._run()
        return [self._outcome(i, job, why) for i, job in enumerate(self.jobs)], self.guards

    def _run(self) -> str:
        """Run the session; "" or why results are missing."""
        base = Path(tempfile.mkdtemp(prefix=_session_prefix(), dir=_scratch_dir(self.namespaces)))
        cgroup_dir = ""
        try:
            if _cgroup is not None:
                with contextlib.suppress(OSError):
                    cgroup_dir = cgroups.make_session_dir(_cgroup, base.name)
            return self._launch(base, cgroup_dir)
        except Exception as exc:  # the sandbox, not the code, failed
            return f"{type(exc).__name__}: {exc}"
        finally:
            if cgroup_dir:
                cgroups.remove_tree(cgroup_dir)
            shutil.rmtree(base, ignore_errors=True)

    def _launch(self, base: Path, cgroup_dir: str) -> str:
        (base / "root").mkdir()
        (base / "work").mkdir(mode=0o711)
        job_r, job_w = os.pipe()
        result_r, result_w = os.pipe()
        status_r, status_w = os.pipe()
        config = self._config(base, cgroup_dir, job_r, result_w, status_w)
        try:
            proc = subprocess.Popen(
                [PYTHON, "-I", "-S", "-B", str(LAUNCHER), marshal.dumps(config).hex()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={"PATH": ENV["PATH"], "LANG": ENV["LANG"]},
                cwd="/",
                start_new_session=True,
                pass_fds=(job_r, result_w, status_w),
            )
        except BaseException:
            for fd in (job_w, result_r, status_r):
                os.close(fd)
            raise
        finally:
            for fd in (job_r, result_w, status_w):
                os.close(fd)
        writer = threading.Thread(target=self._send_jobs, args=(job_w,), daemon=True)
        writer.start()
        try:
            timed_out = self._collect(proc, result_r, status_r)
        finally:
            _end(proc)
            writer.join(5)
            for fd in (result_r, status_r):
                os.close(fd)
        if timed_out:
            quiet = self._quiet_limit()
            return f"the sandbox session stopped answering (no result for {quiet:.0f}s)"
        return self._why_missing(proc)

    def _config(
        self, base: Path, cgroup_dir: str, job_r: int, result_w: int, status_w: int
    ) -> dict:
        root = os.geteuid() == 0
        if root and not self.namespaces:
            base.chmod(0o711)
            os.chown(base / "work", 0, 0)
        return {
            "namespaces": self.namespaces,
            "root": str(base / "root"),
            "binds": interpreter_dirs(PYTHON),
            "masks": site_packages_dirs(),
            "cgroup": cgroup_dir,
            "cgroup_version": _cgroup.version if (cgroup_dir and _cgroup) else 0,
            "seccomp": seccomp.supported(),
            "workers": self.workers,
            "uid_base": UID_BASE + secrets.randbelow(UID_SPAN // 4096) * 4096,
            "plain_work": str(base / "work"),
            "setup": {"env": ENV, "work": "/work"},
            "job_fd": job_r,
            "result_fd": result_w,
            "status_fd": status_w,
        }

    def _send_jobs(self, fd: int) -> None:
        try:
            for i, job in enumerate(self.jobs):
                wire.write_message(fd, _job_message(i, job))
            wire.write_message(fd, {"end": True})
        except OSError:
            pass  # the session ended early; the missing results say so
        finally:
            os.close(fd)

    def _collect(self, proc: subprocess.Popen, result_r: int, status_r: int) -> bool:
        """Read results, status lines and the launcher's stderr until all are closed, or until
        no result has come for longer than the session's quiet limit; True when it had not."""
        quiet = self._quiet_limit()
        deadline = time.monotonic() + STARTUP_SECONDS + quiet
        selector = selectors.DefaultSelector()
        assert proc.stderr is not None
        buffers = {status_r: bytearray(), proc.stderr.fileno(): bytearray()}
        for fd in (result_r, *buffers):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                for key, _ in selector.select(left):
                    try:
                        chunk = os.read(key.fd, 1 << 20)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        selector.unregister(key.fd)
                    elif key.fd == result_r:
                        self._take_results(chunk)
                        deadline = time.monotonic() + quiet
                    elif len(buffers[key.fd]) < RESULT_LIMIT:
                        buffers[key.fd] += chunk
        finally:
            selector.close()
            self._take_status(bytes(buffers[status_r]))
            self.stderr = bytes(buffers[proc.stderr.fileno()])[-2000:].decode("utf-8", "replace")
        return False

    def _quiet_limit(self) -> float:
        """The longest a working session goes without a result: one run or test at its worst
        (`item_seconds`). The judge's supervisor ends a worker that overruns its own deadline,
        so a session quiet for longer is stuck, and only then are the results it lacks
        sandbox_failed. There is no budget for the whole batch: however slow the siblings, each
        sample is scored by what its own programs did."""
        return max(item_seconds(job.limits) for job in self.jobs)

    def _take_results(self, chunk: bytes) -> None:
        """Each run's or test's result as the judge passes it on, then the job's end."""
        for message in self.frames.feed(chunk):
            entry = self.results.setdefault(int(message["job"]), {"items": []})
            if "item" in message:
                entry["items"].append(message["item"])
            if "done" in message:
                entry.update(message["done"], done=True)

    def _take_status(self, data: bytes) -> None:
        for line in data.splitlines():
            with contextlib.suppress(ValueError, EOFError, TypeError):
                message = marshal.loads(bytes.fromhex(line.decode()))
                self.status.append(message)
                if message.get("kind") == "guards":
                    self.guards = message

    def _why_missing(self, proc: subprocess.Popen) -> str:
        for message in self.status:
            if message.get("kind") == "setup_failed":
                return f"setup_failed: {message.get('error')}"
        if sum(bool(entry.get("done")) for entry in self.results.values()) < len(self.jobs):
            tail = self.stderr.strip().splitlines()[-1:] or [f"launcher exit {proc.returncode}"]
            return f"the sandbox ended without every result ({tail[0][:300]})"
        return ""

    def _outcome(self, i: int, job: Job, why: str) -> Outcome:
        """The job's results: those that came, each as it came; what did not, sandbox_failed."""
        raw = self.results.get(i)
        if raw is None:
            return _failed(job, why or "no result")
        error = raw.get("setup_error") or raw.get("judge_error") or why or "no result"
        if job.tests is None:
            runs = [classify(facts, job.limits) for facts in raw["items"]]
            return runs + [_sandbox_failed(error) for _ in job.inputs[len(runs) :]]
        verdicts = [verdict_of(v, job.limits) for v in raw["items"]]
        return verdicts + [
            Verdict(None, "sandbox_failed", error) for _ in job.tests[len(verdicts) :]
        ]


def item_seconds(limits: Limits) -> float:
    """The longest one run or test can take, every step at the deadline the judge keeps for it:
    a fresh process spawned, the program loaded (a calls job; the run's wall clock) and called
    (the wall clock again), the timed-out process ended, and the supervisor's grace on each.
    Early in RL many programs are this slow: loading for most of the wall clock, then looping."""
    spawn = 2 * SETUP_SECONDS + 1  # what a worker announces while it spawns
    end = 2 * SETUP_SECONDS + 2  # and while it ends a process
    return spawn + 2 * limits.wall_seconds + end + 3 * GRACE_SECONDS


def _job_message(index: int, job: Job) -> dict[str, Any]:
    limits = job.limits
    message: dict[str, Any] = {
        "job": index,
        "kind": "calls" if job.tests is not None else "program",
        "code": job.code,
        "limits": {
            "cpu_seconds": limits.cpu_seconds,
            "wall_seconds": limits.wall_seconds,
            "output_bytes": limits.output_bytes,
            "spawn": limits.spawn,
            "tmpfs_mb": limits.tmpfs_mb,
            "rlimits": limits.rlimits(),
        },
    }
    if job.tests is not None:
        message["tests"] = list(job.tests)
    else:
        message["inputs"] = list(job.inputs)
        message["files"] = job.files or {}
    return message


def _end(proc: subprocess.Popen) -> None:
    """End the session: the launcher kills the init (and with it the PID namespace)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(2.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


SESSION_PREFIX = "r1-sandbox-"


def _session_prefix() -> str:
    """A session's folder and cgroup are named after the process that runs it, so that what a
    killed process left behind can be told from what a live one is using."""
    return f"{SESSION_PREFIX}{os.getpid()}-"


def _remove_stale_sessions() -> None:
    """Remove the session folders and cgroups whose process is gone: one killed before its
    session's cleanup ran leaves both (empty folders in /dev/shm, a cgroup that a machine-wide
    check counts). A session of a live process, or one named otherwise, is left alone."""
    places = [_scratch_dir(True), tempfile.gettempdir()]
    if _cgroup is not None:
        places.append(_cgroup.path)
    for place in filter(None, places):
        with contextlib.suppress(OSError):
            for entry in os.scandir(place):
                if entry.is_dir(follow_symlinks=False) and _owner_gone(entry.name):
                    log.info("sandbox: removing %s, left by a process that has ended", entry.path)
                    if place == getattr(_cgroup, "path", None):
                        cgroups.remove_tree(entry.path)
                    else:
                        shutil.rmtree(entry.path, ignore_errors=True)


def _owner_gone(name: str) -> bool:
    pid, _, rest = name.removeprefix(SESSION_PREFIX).partition("-")
    if not name.startswith(SESSION_PREFIX) or not pid.isdigit() or not rest:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, someone else's
        return False
    return False


def _scratch_dir(namespaces: bool) -> str | None:
    """/dev/shm when the programs only read the session directory (namespaces), as creating and
    removing directories there is cheap; else the default temporary directory."""
    if namespaces and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return None
