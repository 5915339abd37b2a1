"""The judge: runs a session's jobs through the zygote, a few at a time, and reports each result.

It reads jobs from the runner (`{"job": id, "kind": "program" | "calls", ...}` messages, then
`{"end": true}`) and writes a message per run or test as it ends (`{"job": id, "item": ...}`),
then one when the job is done (`{"job": id, "done": {...}}`, with a setup or judge error if
any). It is the only process of the session that sees tests: they reach it on its own pipe,
after the zygote was forked, and no program is ever forked from it; it runs under its own uid
when the sandbox is root.

- A program job (sandbox/inner/programs.py) runs the code once per input and reports what each
  run did (`facts`: exit status, CPU seconds, OOM, time and output limits, stdout and stderr):
  the runner classifies them.
- A calls job (sandbox/inner/calls.py) loads the code as a module in a confined process and runs
  each assert-style test here, in the judge, with the program's names bound to proxies.
A job's runs or tests share one confined process (sandbox/inner/process.py) while it keeps
running normally.

The judge's main process, the supervisor, runs no job itself. It hands each job to one of its
workers, a process per channel to the zygote, forwards their results and keeps their deadlines.
A worker says before each run or test until when it may be busy (that run's or test's wall
clock), and reports each result as it comes. The judge's work on what a program sends back
(parsing it, decoding it, and what a test then does with the values) happens in the worker, and
some of it is C code holding the interpreter that no deadline inside the worker can stop. So a
worker still busy GRACE_SECONDS past its deadline is killed from outside: that run or test fails
at the wall clock, the zygote kills the worker's program processes, and a fresh worker takes the
job's remaining runs or tests. Its siblings never wait on it: each worker is a process of its
own, its memory bounded too (WORKER_MEMORY). A worker that dies otherwise (the judge's own
failure) leaves the rest of its job unscorable; the batch goes on with a fresh worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import selectors
import signal
import socket
import time
from collections import deque
from typing import Any, NoReturn

from sandbox.inner import wire
from sandbox.inner.calls import run_calls
from sandbox.inner.process import GRACE_SECONDS, SETUP_SECONDS, Reporter
from sandbox.inner.programs import run_program

JOB_LIMIT = 256 << 20
ITEM_LIMIT = 64 << 20
# A worker's address space: about 25 MB of its own, and room for the largest reply it takes
# (16 MB of JSON, a few hundred MB once decoded) and the test's work on it; past it, MemoryError.
WORKER_MEMORY = 1 << 30
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def serve(job_fd: int, result_fd: int, controls: list[socket.socket]) -> NoReturn:
    Supervisor(job_fd, result_fd, controls).run()
    os._exit(0)


def _items_key(job: dict) -> str:
    return "tests" if job["kind"] == "calls" else "inputs"


class _Slot:
    """A worker process, its channel to the zygote, and the job it is on."""

    def __init__(self, control: socket.socket):
        self.control = control
        self.pid = 0
        self.to_worker = self.from_worker = -1
        self.frames = wire.Frames(ITEM_LIMIT)
        self.job: dict[str, Any] | None = None  # the job as the runner sent it
        self.items: list[dict[str, Any]] = []  # its runs' facts or tests' verdicts so far
        self.deadline = 0.0


class Supervisor:
    def __init__(self, job_fd: int, result_fd: int, controls: list[socket.socket]):
        self.job_fd, self.result_fd = job_fd, result_fd
        self.slots = [_Slot(control) for control in controls]
        self.queue: deque[dict[str, Any]] = deque()
        self.jobs = wire.Frames(JOB_LIMIT)
        self.reading = True
        self.selector = selectors.DefaultSelector()

    def run(self) -> None:
        os.set_blocking(self.job_fd, False)
        self.selector.register(self.job_fd, selectors.EVENT_READ, None)
        for slot in self.slots:
            self._start(slot)
        while self.reading or self.queue or any(slot.job for slot in self.slots):
            self._dispatch()
            for key, _ in self.selector.select(self._timeout()):
                if key.data is None:
                    self._read_jobs()
                else:
                    self._read_worker(key.data)
            for slot in self.slots:
                if slot.job is not None and time.monotonic() > slot.deadline + GRACE_SECONDS:
                    self._overdue(slot)
        for slot in self.slots:
            self._stop(slot)

    def _timeout(self) -> float | None:
        busy = [slot.deadline for slot in self.slots if slot.job is not None]
        if not busy:
            return None
        return max(0.0, min(busy) + GRACE_SECONDS - time.monotonic()) + 0.01

    def _read_jobs(self) -> None:
        try:
            chunk = os.read(self.job_fd, 1 << 20)
        except BlockingIOError:
            return
        messages = self.jobs.feed(chunk) if chunk else [{"end": True}]
        for message in messages:
            if message.get("end"):
                self.reading = False
                self.selector.unregister(self.job_fd)
                return
            self.queue.append(message)

    def _dispatch(self) -> None:
        for slot in self.slots:
            if slot.job is None and self.queue:
                slot.job, slot.items = self.queue.popleft(), []
                self._send(slot, slot.job)

    def _send(self, slot: _Slot, job: dict[str, Any]) -> None:
        slot.deadline = time.monotonic() + 2 * SETUP_SECONDS + 1  # it spawns a process first
        try:
            wire.write_message(slot.to_worker, job)
        except OSError:
            self._died(slot)

    def _read_worker(self, slot: _Slot) -> None:
        try:
            chunk = os.read(slot.from_worker, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            self._died(slot)
            return
        for message in slot.frames.feed(chunk):
            if "deadline" in message:
                slot.deadline = float(message["deadline"])
            elif "item" in message:
                self._item(slot, message["item"])
            elif "done" in message:
                self._finish(slot, message["done"])

    def _item(self, slot: _Slot, item: dict[str, Any]) -> None:
        """A run's or test's result, passed on to the runner as it comes: what a program did
        is kept whatever happens to the rest of its job or session."""
        assert slot.job is not None
        slot.items.append(item)
        wire.write_message(self.result_fd, {"job": slot.job["job"], "item": item})

    def _finish(self, slot: _Slot, extra: dict[str, Any]) -> None:
        assert slot.job is not None
        wire.write_message(self.result_fd, {"job": slot.job["job"], "done": extra})
        slot.job, slot.items = None, []

    def _overdue(self, slot: _Slot) -> None:
        """The worker is past its deadline: its run or test fails at the wall clock, and a fresh
        worker goes on with the rest of the job."""
        assert slot.job is not None
        self._stop(slot, kill=True)
        self._item(slot, _overdue_item(slot.job, slot.deadline))
        self._start(slot)
        remaining = slot.job[_items_key(slot.job)][len(slot.items) :]
        if remaining:
            self._send(slot, {**slot.job, _items_key(slot.job): remaining})
        else:
            self._finish(slot, {})

    def _died(self, slot: _Slot) -> None:
        status = self._stop(slot, kill=True)
        if slot.job is not None:
            self._finish(slot, {"judge_error": f"the judge's worker ended ({status})"})
        self._start(slot)

    def _start(self, slot: _Slot) -> None:
        """A fresh worker for the slot; the programs of the one before it are killed first."""
        with contextlib.suppress(OSError):
            slot.control.send(b'{"op": "kill_all"}')
        jobs_r, jobs_w = os.pipe()
        items_r, items_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(jobs_w)
            os.close(items_r)
            keep = (jobs_r, items_w, slot.control.fileno())
            _worker(slot.control, jobs_r, items_w, keep)
        os.close(jobs_r)
        os.close(items_w)
        slot.pid, slot.to_worker, slot.from_worker = pid, jobs_w, items_r
        slot.frames = wire.Frames(ITEM_LIMIT)
        os.set_blocking(items_r, False)
        self.selector.register(items_r, selectors.EVENT_READ, slot)

    def _stop(self, slot: _Slot, kill: bool = False) -> str:
        """End the slot's worker (EOF on its jobs, or SIGKILL) and reap it; its exit in words."""
        if not slot.pid:
            return "not started"
        self.selector.unregister(slot.from_worker)
        os.close(slot.to_worker)
        os.close(slot.from_worker)
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.pid, signal.SIGKILL)
        _, status = os.waitpid(slot.pid, 0)
        slot.pid = 0
        code = os.waitstatus_to_exitcode(status)
        return f"exit status {code}" if code >= 0 else f"signal {-code}"


def _overdue_item(job: dict[str, Any], deadline: float) -> dict[str, Any]:
    detail = (
        f"the judge's work on what the program sent back ran {GRACE_SECONDS:g}s past the wall "
        f"clock ({job['limits']['wall_seconds']:g}s)"
    )
    if job["kind"] == "calls":
        return {"passed": False, "why": "wall_time", "detail": detail}
    seconds = float(job["limits"]["wall_seconds"]) + GRACE_SECONDS
    return {"status": None, "timed_out": True, "seconds": seconds, "stdout": "", "stderr": ""}


def _worker(control: socket.socket, jobs_fd: int, out_fd: int, keep: tuple[int, ...]) -> NoReturn:
    """A worker: each job it is given, run to its end, its results reported as they come."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
        low = 3
        for fd in sorted(keep):  # every other descriptor is the supervisor's
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 16)
        report = Reporter(out_fd)
        while True:
            try:
                job = wire.read_message(jobs_fd, JOB_LIMIT)
            except EOFError:
                break
            try:
                run = run_calls if job["kind"] == "calls" else run_program
                extra = run(control, job, report)
            except Exception as exc:  # noqa: BLE001 - the judge's own failure: unscorable
                extra = {"judge_error": f"{type(exc).__name__}: {exc}"[:500]}
            wire.write_message(out_fd, {"done": extra})
    except BaseException:  # noqa: BLE001, S110 - the supervisor sees the worker end
        pass
    os._exit(0)
