"""What a sandboxed run may use, and what came of it."""

from __future__ import annotations

import math
from dataclasses import dataclass

STATUSES = ("ok", "error", "timeout", "killed", "sandbox_failed")

# Why a run or a test failed, as counted by the code reward (`reason`). Every abnormal end of a
# program is one of these; only "sandbox_failed" means the program could not be judged.
REASONS = (
    "exit",  # non-zero exit status (SystemExit)
    "exception",  # an uncaught exception
    "signal",  # ended by a signal that is not a limit's
    "memory",  # MemoryError at the address-space limit, or killed by the cgroup's OOM killer
    "cpu_time",  # RLIMIT_CPU
    "wall_time",  # the wall clock
    "output_limit",  # stdout or stderr over `output_bytes`
    "file_size",  # RLIMIT_FSIZE
    "sandbox_failed",
)


@dataclass(frozen=True)
class Limits:
    """Resource limits for one run of model-written code."""

    cpu_seconds: float = 2.0  # RLIMIT_CPU (rounded up to whole seconds)
    wall_seconds: float = 5.0  # the run is killed after this
    memory_mb: int = 256  # RLIMIT_AS, and the run's memory cgroup where the machine has one
    file_size_mb: int = 8  # RLIMIT_FSIZE; /work and /tmp are each max(16, 4x this) MB of tmpfs
    processes: int = 16  # RLIMIT_NPROC (threads count): for the run's own uid when root
    output_bytes: int = 65536  # stdout and stderr each; more ends the run ("output_limit")
    spawn: bool = False  # may start processes (fork, exec); threads are always allowed

    def rlimits(self) -> dict[str, int]:
        mb = 1024 * 1024
        return {
            "cpu": max(1, math.ceil(self.cpu_seconds)),
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
    "assertion", "raised", "load" or "wrong_output"), or None when it could not be judged
    ("sandbox_failed", "unsupported", "bad_test")."""

    passed: bool | None
    reason: str
    detail: str = ""
