"""What a run's facts (as the judge reports them) mean: status, reason and detail. Pure."""

from __future__ import annotations

import signal
from typing import Any

from sandbox.limits import Limits, SandboxResult, Verdict


def signal_name(number: int) -> str:
    """A signal's name for any number 1-64 (real-time ones as SIGRTMIN+n); never raises."""
    try:
        return signal.Signals(number).name
    except ValueError:
        low, high = int(signal.SIGRTMIN), int(signal.SIGRTMAX)
        if low <= number <= high:
            return f"SIGRTMIN+{number - low}"
        return f"signal {number}"


def classify(facts: dict[str, Any] | None, limits: Limits, why_missing: str = "") -> SandboxResult:
    """The SandboxResult of one program run from the judge's facts (None: no facts came back)."""
    if not facts or facts.get("setup_error") or facts.get("judge_error"):
        detail = (facts or {}).get("setup_error") or (facts or {}).get("judge_error") or why_missing
        return SandboxResult(
            "sandbox_failed", None, "", "", 0.0, detail or "no result", "sandbox_failed"
        )
    out = facts.get("stdout", "").encode("latin-1").decode("utf-8", "replace")
    err = facts.get("stderr", "").encode("latin-1").decode("utf-8", "replace")
    status, seconds = facts.get("status"), float(facts.get("seconds", 0.0))

    def result(kind: str, code: int | None, reason: str, detail: str) -> SandboxResult:
        return SandboxResult(kind, code, out, err, seconds, detail, reason)

    if facts.get("output_exceeded"):
        return result("killed", status, "output_limit", f"output over {limits.output_bytes} bytes")
    if facts.get("refused"):
        return result("killed", status, "reply", f"ended for its reply: {facts['refused']}")
    if facts.get("oom"):
        return result(
            "killed", status, "memory", "memory limit (killed by the cgroup's OOM killer)"
        )
    cpu = float(facts.get("cpu", 0.0))
    if facts.get("cpu_limit"):
        return result("killed", status, "cpu_time", f"cpu time limit (cpu {cpu:.2f}s)")
    if facts.get("timed_out"):
        return result("timeout", None, "wall_time", f"wall clock limit ({limits.wall_seconds:g}s)")
    if status is None:
        return result("sandbox_failed", None, "sandbox_failed", "no exit status came back")
    if status == 0:
        return result("ok", 0, "", "")
    if status > 0:
        reason, detail = _error_reason(status, facts.get("end") or {}, err)
        return result("error", status, reason, detail)
    return _killed(-status, cpu, result)


EFBIG = 27


def _error_reason(code: int, end: dict[str, Any], stderr: str) -> tuple[str, str]:
    """Why a run exited with a non-zero status, from how the harness saw it end (`end`): its
    program did not compile, raised, or exited; with no word from the harness, it exited
    (os._exit, or its process ended some other way with that status)."""
    lines = stderr.strip().splitlines()
    tail = lines[-1][:200] if lines else ""
    detail = f"exit code {code}" + (f": {tail}" if tail else "")
    kind = end.get("kind")
    if kind == "syntax":
        return "syntax", f"the program does not compile: {tail}"
    if kind != "exception":
        return "exit", detail
    if end.get("type") == "MemoryError":
        return "memory", "memory limit (MemoryError)"
    if end.get("errno") == EFBIG:
        return "file_size", "file size limit (File too large)"
    return "exception", detail


def _killed(number: int, cpu: float, result) -> SandboxResult:
    """Ended by a signal that is not a limit's (the CPU limit's SIGKILL is known by `cpu_limit`;
    SIGXFSZ is the file size limit's for a program that stopped ignoring it)."""
    name = signal_name(number)
    if number == signal.SIGXFSZ:
        return result("killed", -number, "file_size", f"file size limit ({name})")
    return result("killed", -number, "signal", f"killed by {name} (cpu {cpu:.2f}s)")


def verdict_of(raw: dict[str, Any], limits: Limits) -> Verdict:
    """One assert-style test's verdict from the judge's report."""
    passed, why = raw.get("passed"), str(raw.get("why", ""))
    detail = str(raw.get("detail", ""))
    if passed is True:
        return Verdict(True, "passed")
    if passed is None:
        return Verdict(None, why or "sandbox_failed", detail)
    if why in ("ended", "load") and raw.get("facts"):
        ended = classify(raw["facts"], limits)
        crashed = ended.status not in ("ok", "sandbox_failed", "error")
        if why == "ended" and ended.status == "error" or crashed:  # a limit or a crash ended it
            return Verdict(False, ended.reason, f"{detail}; {ended.detail}")
        if why == "ended":  # it left without answering (os._exit(0) and the like)
            return Verdict(False, "exit", f"{detail}; the process exited without answering")
    return Verdict(False, why or "assertion", detail)
