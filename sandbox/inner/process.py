"""One confined process, seen from the judge: spawned through the zygote, told its program,
waited on with a deadline, ended, and what came of it (`facts`)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Sequence
from typing import Any

from sandbox.inner import wire

SETUP_SECONDS = 10.0  # a confined process must be ready within this (else the sandbox failed)
REPLY_LIMIT = 16 << 20


class Ended(BaseException):
    """The program's process ended (or was ended) while the judge waited on it.

    A BaseException, so that a test's `except Exception` cannot swallow it."""


class Process:
    """A confined process the zygote forked for one job, and the judge's end of its channel.

    `deadline` is the current run's or test's (`start_clock` sets it)."""

    def __init__(self, control: socket.socket, job: dict):
        self.control = control
        self.limits = job["limits"]
        self.channel, theirs = socket.socketpair()
        self.started = time.monotonic()
        self.deadline = self.started + SETUP_SECONDS
        self.pid: int | None = None
        self.exit: dict[str, Any] | None = None
        self.setup_error: str | None = None
        self.timed_out = False
        try:
            request = {"op": "spawn", "setup": _run_setup(job)}
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
        return self.exit is None and self.pid is not None and not self.setup_error

    def start_clock(self) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + float(self.limits["wall_seconds"])
        self.timed_out = False

    def _wait_ready(self) -> None:
        try:
            message = self.read(time.monotonic() + SETUP_SECONDS, REPLY_LIMIT)
        except (Ended, wire.WireError) as exc:
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
        """The process's next message: a JSON object, else WireError (the program may have
        written to its channel itself)."""
        try:
            message = wire.read_message(self.channel.fileno(), limit, deadline)
            if not isinstance(message, dict):
                raise wire.WireError(f"a message that is not an object: {str(message)[:80]}")
            return message
        except TimeoutError:
            self.timed_out = True
            raise Ended("wall clock limit") from None
        except (EOFError, ConnectionError):
            raise Ended("the program's process ended") from None

    def finish(self, kill: bool) -> None:
        """Wait for the exit report (killing the process first when told to, or once the
        deadline has passed) and close the channel."""
        if self.exit is None and self.pid is not None:
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
        self.control.send(json.dumps({"op": "kill", "pid": self.pid}).encode())

    def _control_message(self, deadline: float) -> dict[str, Any]:
        """The zygote's next message about this process (a report about an earlier process of
        this worker, left behind by a job that failed in the judge, is dropped)."""
        while True:
            self.control.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                data = self.control.recv(1 << 16)
            finally:
                self.control.settimeout(None)
            if not data:
                raise RuntimeError("the zygote is gone")
            message = json.loads(data)
            if self.pid is None and message.get("op") in ("spawned", "spawn_failed"):
                return message
            if self.pid is not None and message.get("pid") == self.pid:
                return message

    def facts(self, status: int | None = None) -> dict[str, Any]:
        """What came of the current run: `status` from the harness, else from the exit report."""
        exit_ = self.exit or {}
        return {
            "setup_error": self.setup_error,
            "status": status if status is not None else exit_.get("status"),
            "cpu": exit_.get("cpu", 0.0),
            "oom": exit_.get("oom", False),
            "timed_out": self.timed_out,
            "seconds": time.monotonic() - self.started,
        }


def _run_setup(job: dict) -> dict[str, Any]:
    limits = job["limits"]
    runs = len(job.get("tests") or job.get("inputs") or [None])
    cpu = int(limits["rlimits"]["cpu"])
    return {
        "mode": job["kind"],
        "spawn": bool(limits["spawn"]),
        "rlimits": {**limits["rlimits"], "cpu_total": (cpu + 2) * runs},
        "tmpfs_mb": limits["tmpfs_mb"],
    }
