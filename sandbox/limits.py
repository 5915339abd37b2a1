"""What a sandboxed run may use, and what came of it."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("ok", "error", "timeout", "killed", "sandbox_failed")


@dataclass(frozen=True)
class Limits:
    """Resource limits for one run of model-written code."""

    cpu_seconds: float = 2.0  # RLIMIT_CPU (rounded up to whole seconds)
    wall_seconds: float = 5.0  # the whole sandbox is killed after this
    memory_mb: int = 256  # RLIMIT_AS
    file_size_mb: int = 8  # RLIMIT_FSIZE
    processes: int = 16  # RLIMIT_NPROC, counted for the sandbox's own uid
    output_bytes: int = 65536  # stdout and stderr each kept at most


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run.

    `status` is "ok" (exit 0), "error" (non-zero exit), "timeout" (wall clock), "killed" (a signal,
    usually a limit) or "sandbox_failed" (the sandbox itself could not run the code: the result
    says nothing about the code).
    """

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    detail: str = ""
