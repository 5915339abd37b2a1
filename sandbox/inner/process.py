"""One confined process, seen from the judge: spawned through the zygote, told its program,
waited on with a deadline and a CPU limit, ended, and what came of it (`facts`).

The CPU limit of a run or test is kept here, outside the program's reach: the judge reads the
process's CPU clock (every thread of it) while it waits, and has the process killed once the run
has used `cpu_seconds`. The process's own RLIMIT_CPU (hard = soft, set before the program exists)
is the whole job's allowance, a backstop the program cannot lift."""

from __future__ import annotations

import json
import math
import secrets
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any

from sandbox.inner import wire

SETUP_SECONDS = 10.0  # a confined process must be ready within this (else the sandbox failed)
REPLY_LIMIT = 16 << 20
# How long past a run's or test's deadline the judge's supervisor lets a worker be busy before it
# kills it (sandbox/inner/judge.py); a worker that is not stuck is done well within this.
GRACE_SECONDS = 2.0


class Ended(BaseException):
    """The program's process ended (or was ended) while the judge waited on it.

    A BaseException, so that a test's `except Exception` cannot swallow it."""


class Refused(BaseException):
    """A reply of the program the judge refuses: over its bounds (size, depth, count, hash
    collisions: sandbox/inner/wire.py), not plain data, or not a message at all. The run or test
    fails with reason "reply". A BaseException for the same reason as Ended."""


class Reporter:
    """A worker's reports to the judge's supervisor (sandbox/inner/judge.py): until when it may
    be busy, and each run's or test's result as it comes. Without a descriptor, nothing is sent."""

    def __init__(self, fd: int | None = None):
        self.fd = fd
        self.told = -1.0  # the deadline last sent

    def until(self, deadline: float) -> None:
        """Tell the supervisor; a deadline within half a second of the one it has is not worth a
        message (GRACE_SECONDS covers the difference), so quick runs in a row send one."""
        if self.fd is not None and abs(deadline - self.told) > 0.5:
            wire.write_message(self.fd, {"deadline": deadline})
            self.told = deadline

    def item(self, item: dict[str, Any]) -> None:
        if self.fd is not None:
            wire.write_message(self.fd, {"item": item})


def cpu_clock(pid: int) -> int:
    """The clock id of a process's CPU time (the kernel's MAKE_PROCESS_CPUCLOCK, CPUCLOCK_SCHED):
    readable for any process of our PID namespace."""
    return ((~pid) << 3) | 2


class Process:
    """A confined process the zygote forked for one job, and the judge's end of its channel.

    `deadline` and the CPU limit are the current run's or test's (`start_clock` sets them)."""

    def __init__(self, control: socket.socket, job: dict, report: Reporter):
        self.control, self.report = control, report
        self.limits = job["limits"]
        self.setup = _run_setup(job)
        self.channel, theirs = socket.socketpair()
        self.started = time.monotonic()
        self.deadline = self.started + SETUP_SECONDS
        self.pid: int | None = None
        self.exit: dict[str, Any] | None = None
        self.setup_error: str | None = None
        self.timed_out = self.cpu_exceeded = self.killed = False
        self.cpu_start: float | None = None
        self.request = secrets.token_hex(8)  # unique to this spawn, whichever worker asks
        report.until(self.started + 2 * SETUP_SECONDS + 1)
        try:
            request = {"op": "spawn", "id": self.request, "setup": self.setup}
            socket.send_fds(control, [json.dumps(request).encode()], [theirs.fileno()])
            reply = self._control_message(time.monotonic() + SETUP_SECONDS)
        finally:
            theirs.close()
        if reply.get("op") != "spawned":
            self.setup_error = f"spawn failed: {reply.get('error', reply)}"
            return
        self.pid = reply["pid"]
        self._wait_ready()

    @property
    def alive(self) -> bool:
        return (
            self.exit is None and self.pid is not None and not self.setup_error and not self.killed
        )

    def start_clock(self) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + float(self.limits["wall_seconds"])
        self.timed_out = self.cpu_exceeded = False
        self.cpu_start = self.cpu_seconds()
        self.report.until(self.deadline)

    def cpu_seconds(self) -> float:
        """The process's CPU time so far, every thread of it (read from outside the process)."""
        if self.exit is not None:
            return float(self.exit.get("cpu", 0.0))
        try:
            return time.clock_gettime(cpu_clock(self.pid or 0))
        except OSError:  # ended, not yet reported
            return self.cpu_start or 0.0

    def over_cpu(self) -> bool:
        """Whether the current run or test has used its CPU limit (the process is then killed)."""
        if self.cpu_start is None or not self.alive:
            return False
        if self.cpu_seconds() - self.cpu_start < float(self.limits["cpu_seconds"]):
            return False
        self.cpu_exceeded = True
        self._kill()
        return True

    def _check_cpu(self) -> None:
        if self.over_cpu():
            raise Ended("cpu time limit")

    def _wait_ready(self) -> None:
        try:
            message = self.read(time.monotonic() + SETUP_SECONDS, REPLY_LIMIT)
        except (Ended, Refused) as exc:
            message = {"setup_failed": f"no ready message: {exc}"}
        if message.get("ready") is not True:
            self.setup_error = str(message.get("setup_failed", message))[:500]
            self.finish(kill=True)

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        self.channel.settimeout(max(0.001, self.deadline - time.monotonic()))
        try:
            data = wire.dumps(message)
            sent = socket.send_fds(self.channel, [data], list(fds)) if fds else 0
            self.channel.sendall(data[sent:])
        except TimeoutError:
            self.timed_out = True
            raise Ended("wall clock limit") from None
        except OSError as exc:
            raise Ended(f"channel closed: {exc}") from None

    def read(self, deadline: float, limit: int) -> dict[str, Any]:
        """The process's next message, a JSON object. Refused (the process killed) for anything
        else: the program may have written to its channel itself."""
        tick = self._check_cpu if self.cpu_start is not None else None
        try:
            message = wire.read_message(self.channel.fileno(), limit, deadline, tick)
        except TimeoutError:
            self.timed_out = True
            raise Ended("wall clock limit") from None
        except (EOFError, ConnectionError):
            raise Ended("the program's process ended") from None
        except (wire.WireError, MemoryError) as exc:
            self._kill()
            raise Refused(f"not a message the judge takes: {str(exc)[:300]}") from None
        if not isinstance(message, dict):
            self._kill()
            raise Refused(f"a message that is not an object: {str(message)[:80]}")
        return message

    def finish(self, kill: bool) -> None:
        """Wait for the exit report (killing the process first when told to, or once the
        deadline has passed) and close the channel."""
        if self.exit is None and self.pid is not None:
            self.report.until(time.monotonic() + 2 * SETUP_SECONDS + 2)
            if kill:
                self._kill()
            try:
                self.exit = self._control_message(max(self.deadline, time.monotonic() + 1.0))
            except TimeoutError:
                self.timed_out = True
                self._kill()
                self.exit = self._control_message(time.monotonic() + SETUP_SECONDS)
        self.channel.close()

    def _kill(self) -> None:
        if self.pid is not None and self.exit is None:
            self.killed = True
            self.control.send(json.dumps({"op": "kill", "pid": self.pid}).encode())

    def _control_message(self, deadline: float) -> dict[str, Any]:
        """The zygote's next message about this process: its spawn request's answer, then its
        exit report (messages about other processes of this worker's channel are dropped)."""
        while True:
            self.control.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                data = self.control.recv(1 << 16)
            finally:
                self.control.settimeout(None)
            if not data:
                raise RuntimeError("the zygote is gone")
            message = json.loads(data)
            if self.pid is None and message.get("id") == self.request:
                return message
            exit_ = message.get("op") == "exit"
            if self.pid is not None and exit_ and message.get("pid") == self.pid:
                return message

    def facts(self, status: int | None = None) -> dict[str, Any]:
        """What came of the current run: `status` from the harness, else from the exit report."""
        exit_ = self.exit or {}
        end = status if status is not None else exit_.get("status")
        used = exit_.get("cpu", 0.0)  # rusage at a SIGKILL from RLIMIT_CPU: within 10% of it
        at_rlimit = end == -signal.SIGKILL and used >= 0.9 * self.setup["cpu_total"]
        return {
            "setup_error": self.setup_error,
            "status": end,
            "cpu": max(0.0, self.cpu_seconds() - (self.cpu_start or 0.0)),
            "cpu_limit": self.cpu_exceeded or at_rlimit,
            "oom": exit_.get("oom", False),
            "timed_out": self.timed_out,
            "seconds": time.monotonic() - self.started,
        }


# CPU time a confined process spends on itself: its setup and the harness between runs
HARNESS_CPU_SECONDS = 1.0


def _run_setup(job: dict) -> dict[str, Any]:
    """What the zygote needs to confine the process. Its RLIMIT_CPU is the job's whole CPU
    allowance (each run's or test's, loading the program for a calls job, and the process's
    own start), hard = soft."""
    limits = job["limits"]
    runs = len(job.get("tests") or job.get("inputs") or [None])
    units = runs + 1 if job["kind"] == "calls" else runs
    cpu_total = math.ceil(float(limits["cpu_seconds"]) * units + HARNESS_CPU_SECONDS)
    return {
        "mode": job["kind"],
        "spawn": bool(limits["spawn"]),
        "rlimits": {**limits["rlimits"], "cpu": cpu_total},
        "cpu_total": cpu_total,
        "tmpfs_mb": limits["tmpfs_mb"],
    }
