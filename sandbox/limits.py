"""What a sandboxed run may use, and what came of it."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("ok", "error", "timeout", "killed", "sandbox_failed")

# Why a run or a test failed, as counted by the code reward (`reason`). Every abnormal end of a
# program is one of these; only "sandbox_failed" means the program could not be judged.
REASONS = (
    "syntax",  # the program does not compile (SyntaxError, IndentationError, null bytes)
    "exit",  # non-zero exit status (SystemExit, os._exit)
    "exception",  # an uncaught exception
    "signal",  # ended by a signal that is not a limit's (an uncaught KeyboardInterrupt: SIGINT)
    "memory",  # MemoryError at the address-space limit, or killed by the cgroup's OOM killer
    "cpu_time",  # the run's CPU limit (kept by the judge; RLIMIT_CPU for the whole job)
    "wall_time",  # the wall clock (also: the judge's own work on the program's reply)
    "output_limit",  # stdout or stderr over `output_bytes`
    "file_size",  # RLIMIT_FSIZE
    "reply",  # what it sent back is not plain data, or over the bounds (sandbox/inner/wire.py)
    "sandbox_failed",
)


@dataclass(frozen=True)
class Limits:
    """Resource limits for one run of model-written code."""

    cpu_seconds: float = 2.0  # each run's or test's CPU time (all its threads)
    wall_seconds: float = 5.0  # the run is killed after this
    memory_mb: int = 256  # RLIMIT_AS, and the run's memory cgroup where the machine has one
    file_size_mb: int = 8  # RLIMIT_FSIZE; /work and /tmp are each max(16, 4x this) MB of tmpfs
    processes: int = 16  # RLIMIT_NPROC (threads count): for the run's own uid when root
    output_bytes: int = 65536  # stdout and stderr each; more ends the run ("output_limit")
    spawn: bool = False  # may start processes (fork, exec); threads are always allowed

    def rlimits(self) -> dict[str, int]:
        mb = 1024 * 1024
        return {
            "memory": self.memory_mb * mb,
            "file_size": self.file_size_mb * mb,
            "processes": self.processes,
        }

    @property
    def tmpfs_mb(self) -> int:
        return max(16, 4 * self.file_size_mb)


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run.

    `status` is "ok" (exit 0), "error" (non-zero exit), "timeout" (wall clock), "killed" (a signal
    or a limit) or "sandbox_failed" (the sandbox itself could not run the code: the result says
    nothing about the code). `reason` is one of REASONS ("" when ok); `detail` says it in words.
    """

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    detail: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Verdict:
    """One assert-style test of a program: passed, failed (`reason` from REASONS, or
    "assertion", "raised", "load", "test_error" or "wrong_output"), or None when it could not be
    judged ("sandbox_failed", "unsupported", "bad_test")."""

    passed: bool | None
    reason: str
    detail: str = ""
