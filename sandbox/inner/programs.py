"""Program jobs: the code once per input, each run on fresh stdin, stdout and stderr, in one
confined process while it keeps running normally (a process that ended is replaced)."""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import socket
import time
from typing import Any

from sandbox.inner import wire
from sandbox.inner.process import SETUP_SECONDS, Ended, Process, Refused, Reporter

DRAIN_SECONDS = 0.5  # outputs still read after the program has ended
HARNESS_REPLY_LIMIT = 1 << 16  # a run's end, as the harness says it: a few fields


def run_program(control: socket.socket, job: dict, report: Reporter) -> dict[str, Any]:
    """The program once per input, in one process while it keeps running normally; each run's
    facts reported as they come, and what else there is to say (a setup error) returned."""
    process: Process | None = None
    for stdin in job["inputs"]:
        if process is None or not process.alive:
            if process is not None:
                process.finish(kill=True)
            process = Process(control, job, report)
            if process.setup_error:
                return {"setup_error": process.setup_error}
            with contextlib.suppress(Ended):
                process.send({"code": job["code"], "files": job.get("files") or {}})
        report.item(_run_once(process, stdin.encode("utf-8", "surrogatepass")))
        if job["limits"]["spawn"] and process.alive:  # what it started ends with its process
            process.finish(kill=True)
    if process is not None:
        if process.alive:
            with contextlib.suppress(Ended):
                process.send({"op": "bye"})
        process.finish(kill=not process.alive)
    return {}


def _run_once(process: Process, stdin: bytes) -> dict[str, Any]:
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    nonce = secrets.token_hex(8)
    process.start_clock()
    try:
        process.send({"op": "run", "nonce": nonce}, [stdin_r, out_w, err_w])
    except Ended:
        pass
    finally:
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
    try:
        out, err, exceeded = _communicate(process, stdin_w, stdin, out_r, err_r)
    finally:
        os.close(out_r)
        os.close(err_r)
    status, end, refused, leaving = None, {}, "", False
    if not exceeded and process.alive:
        try:
            reply = process.read(process.deadline, HARNESS_REPLY_LIMIT)
            if reply.get("nonce") == nonce and type(reply.get("exit")) is int:
                status, end = reply["exit"], _end(reply.get("end"))
        except Ended:  # it closed the channel (exiting, or not): it has until its deadline
            leaving = not (process.timed_out or process.cpu_exceeded)
        except Refused as exc:  # the program wrote to the harness's channel itself
            refused = str(exc)
    if status is None:  # the process ended, or was ended: its exit report says how
        process.finish(kill=not leaving)
    return {
        **process.facts(status),
        "end": end,
        "refused": refused,
        "output_exceeded": exceeded,
        "stdout": out.decode("latin-1"),
        "stderr": err.decode("latin-1"),
    }


def _end(end: Any) -> dict[str, Any]:
    """How the harness says the run ended (`{"kind": "exception", "type": "MemoryError"}`),
    kept to plain fields: the harness runs in the program's process."""
    if not isinstance(end, dict):
        return {}
    kept = {k: end[k] for k in ("kind", "type") if type(end.get(k)) is str}
    if type(end.get("errno")) is int:
        kept["errno"] = end["errno"]
    return {k: v[:100] if isinstance(v, str) else v for k, v in kept.items()}


def _communicate(
    process: Process, stdin_fd: int, stdin: bytes, out_fd: int, err_fd: int
) -> tuple[bytes, bytes, bool]:
    """Feed stdin and read both outputs until they close, the deadline passes, an output goes
    over the cap, or the process has ended and they are drained."""
    cap = int(process.limits["output_bytes"])
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    selector = selectors.DefaultSelector()
    for fd in kept:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    feeder = _Feeder(stdin_fd, stdin, selector)
    selector.register(process.control, selectors.EVENT_READ)
    selector.register(process.channel, selectors.EVENT_READ)  # the harness reports the run's end
    deadline, exceeded, draining = process.deadline, False, False
    try:
        while not exceeded and any(key.fd in kept for key in selector.get_map().values()):
            left = deadline - time.monotonic()
            if left <= 0:
                process.timed_out = not draining
                break
            if process.over_cpu():  # its CPU limit, kept from outside
                break
            for key, _ in selector.select(min(left, wire.TICK_SECONDS)):
                if key.fd == stdin_fd:
                    feeder.write_some()
                elif key.fd == process.control.fileno():
                    selector.unregister(key.fd)
                    process.exit = process._control_message(time.monotonic() + SETUP_SECONDS)
                    deadline, draining = min(deadline, time.monotonic() + DRAIN_SECONDS), True
                elif key.fd == process.channel.fileno():  # what is left to read is drained
                    selector.unregister(key.fd)
                    deadline, draining = min(deadline, time.monotonic() + DRAIN_SECONDS), True
                elif not _read_some(selector, key.fd, kept[key.fd], cap):
                    exceeded = True
    finally:
        selector.close()
        feeder.close()
    return bytes(kept[out_fd]), bytes(kept[err_fd]), exceeded


class _Feeder:
    """Writes a program's stdin as the pipe takes it, then closes it."""

    def __init__(self, fd: int, data: bytes, selector: selectors.BaseSelector):
        self.fd, self.pending, self.selector = fd, memoryview(data), selector
        self.open = True
        if self.pending:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_WRITE)
        else:
            self.close()

    def write_some(self) -> None:
        try:
            self.pending = self.pending[os.write(self.fd, self.pending[:65536]) :]
        except BlockingIOError:
            return
        except OSError:  # the program closed its stdin
            self.pending = self.pending[:0]
        if not self.pending:
            self.selector.unregister(self.fd)
            self.close()

    def close(self) -> None:
        if self.open:
            self.open = False
            os.close(self.fd)


def _read_some(selector: selectors.BaseSelector, fd: int, kept: bytearray, cap: int) -> bool:
    """Read what is there; False when the output went over the cap."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return True
    if not chunk:
        selector.unregister(fd)
        return True
    room = cap - len(kept)
    kept += chunk[:room]
    return len(chunk) <= room
