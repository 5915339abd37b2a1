"""The judge: runs a session's jobs through the zygote, a few at a time, and reports each result.

It reads jobs from the runner (`{"job": id, "kind": "program" | "calls", ...}` messages, then
`{"end": true}`) and writes one result message per job. It is the only process of the session that
sees tests: they reach it on its own pipe, after the zygote was forked, and no program is ever
forked from it; it runs under its own uid when the sandbox is root.

- A program job (sandbox/inner/programs.py) runs the code once per input and reports what each
  run did (`facts`: exit status, CPU seconds, OOM, time and output limits, stdout and stderr):
  the runner classifies them.
- A calls job (sandbox/inner/calls.py) loads the code as a module in a confined process and runs
  each assert-style test here, in the judge, with the program's names bound to proxies.
A job's runs or tests share one confined process (sandbox/inner/process.py) while it keeps
running normally.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from sandbox.inner import wire
from sandbox.inner.calls import run_calls
from sandbox.inner.programs import run_program

JOB_LIMIT = 256 << 20

Emit = Callable[[dict[str, Any]], None]


def serve(job_fd: int, result_fd: int, controls: list[socket.socket]) -> NoReturn:
    jobs: queue.Queue[dict | None] = queue.Queue()
    lock = threading.Lock()

    def emit(message: dict[str, Any]) -> None:
        with lock:
            wire.write_message(result_fd, message)

    workers = [threading.Thread(target=_work, args=(c, jobs, emit), daemon=True) for c in controls]
    for worker in workers:
        worker.start()
    try:
        while True:
            message = wire.read_message(job_fd, JOB_LIMIT)
            if message.get("end"):
                break
            jobs.put(message)
    except EOFError:
        pass
    for _ in workers:
        jobs.put(None)
    for worker in workers:
        worker.join()
    os._exit(0)


def _work(control: socket.socket, jobs: queue.Queue, emit: Emit) -> None:
    while (job := jobs.get()) is not None:
        try:
            result = (
                run_calls(control, job) if job["kind"] == "calls" else run_program(control, job)
            )
        except Exception as exc:  # noqa: BLE001 - the judge's own failure: the job is unscorable
            result = {"judge_error": f"{type(exc).__name__}: {exc}"[:500]}
        emit({"job": job["job"], **result})
