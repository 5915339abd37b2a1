"""Sampling workers as processes on this machine: each a fresh Python interpreter (not a fork of
the trainer, which may hold threads and a Prefect engine) that opens a RolloutWorker and answers
jobs over a socket, one after another.

A worker that dies (killed, out of memory) is seen at once: its end of the socket closes. It is
replaced by a new process, which is sent the jobs the dead one held, in order, up to
`max_restarts` times. A worker whose trainer died sees its socket close and exits. Every wait is
bounded by the sampler's time limits (`start_timeout_s + generate_timeout_s`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from configs.reinforcement import SamplerConfig
from host.threads import child_env
from sampling.workers import DrawJob, DrawResult, RolloutWorkerError

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class _Process:
    popen: subprocess.Popen
    conn: Connection
    jobs: deque[DrawJob] = field(default_factory=deque)  # sent, not yet answered, in order


class ProcessWorkers:
    """`workers` sampler processes over the model at `model_path` (`Workers`), their models on
    `device` ("cpu" or "cuda"; by default this process's, models/loading.py `use_device`): a
    trainer on a GPU has its sampler processes sample on the same GPU."""

    def __init__(
        self,
        config: SamplerConfig,
        model_path: Path,
        batch_size: int,
        workers: int = 1,
        threads: int = 1,
        max_restarts: int = 3,
        device: str | None = None,
    ):
        from models.loading import model_device

        self.size = workers
        device = device or model_device().type
        self.spec = (
            config.model_dump(mode="json"), str(Path(model_path).resolve()), batch_size, device
        )  # fmt: skip
        self.threads, self.max_restarts, self.restarts = threads, max_restarts, 0
        self.limit = config.start_timeout_s + config.generate_timeout_s
        # The trainer keeps its own thread count beside them: a stage's arithmetic must not
        # depend on where its rollouts are drawn (on actors elsewhere it keeps them too). Its
        # threads sleep after a short spin, so the extra thread costs a share, not a collapse.
        self.processes = [self._start() for _ in range(workers)]

    def _start(self) -> _Process:
        mine, theirs = socket.socketpair()
        env = child_env(self.threads) | {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "TQDM_DISABLE": "1",  # progress is the trainer's
        }
        popen = subprocess.Popen(
            [sys.executable, "-m", "sampling.workers.process", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        conn = Connection(mine.detach())
        conn.send(("open", *self.spec, self.threads))
        return _Process(popen, conn)

    def submit(self, job: DrawJob) -> None:
        index = min(range(self.size), key=lambda i: len(self.processes[i].jobs))
        self._send(index, job)

    def _send(self, index: int, job: DrawJob) -> None:
        """Send `job` to process `index`; one found dead is replaced, and sent its jobs and this
        one again."""
        process = self.processes[index]
        process.jobs.append(job)
        try:
            process.conn.send(("draw", job))
        except OSError:
            self._replace(index)

    def result(self) -> DrawResult:
        deadline = time.monotonic() + self.limit
        while True:
            left = deadline - time.monotonic()
            ready = wait([p.conn for p in self.processes], timeout=max(0.0, left))
            if not ready:
                raise RolloutWorkerError(
                    f"no rollouts came back from the sampling processes within {self.limit:g} s "
                    "(sampler.start_timeout_s + sampler.generate_timeout_s)"
                )
            index = next(i for i, p in enumerate(self.processes) if p.conn is ready[0])
            answer = self._receive(index)  # one at a time: a replaced process's socket is gone
            if answer is not None:
                return answer

    def _receive(self, index: int) -> DrawResult | None:
        process = self.processes[index]
        try:
            kind, *payload = process.conn.recv()
        except (EOFError, OSError):
            self._replace(index)
            return None
        if kind == "ready":
            return None
        if kind == "error":
            raise RolloutWorkerError(f"sampling process {process.popen.pid}: {payload[0]}")
        result: DrawResult = payload[0]
        job = process.jobs.popleft()
        assert (job.step, job.chunk) == (result.step, result.chunk), "answers come in order"
        return result

    def _replace(self, index: int) -> None:
        """A new process in place of the dead one, sent the jobs it held."""
        dead = self.processes[index]
        try:
            code = dead.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its socket failed, yet it lives: end it
            dead.popen.kill()
            code = dead.popen.wait()
        dead.conn.close()
        if self.restarts >= self.max_restarts:
            raise RolloutWorkerError(
                f"sampling process {dead.popen.pid} died (exit {code}) and "
                f"{self.restarts} were replaced already (cluster.max_restarts)"
            )
        self.restarts += 1
        fresh = self._start()
        log.warning(
            "sampling process %d died (exit %s); replaced by %d, which draws its %d jobs again",
            dead.popen.pid,
            code,
            fresh.popen.pid,
            len(dead.jobs),
        )
        self.processes[index] = fresh
        for job in dead.jobs:
            self._send(index, job)

    @property
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.processes]

    def close(self) -> None:
        """Ask each process to end (it closes its sampler), then wait; kill one that hangs."""
        for process in self.processes:
            with contextlib.suppress(OSError):  # it is gone already
                process.conn.send(("close",))
        for process in self.processes:
            try:
                process.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
            process.conn.close()
        self.processes = []


# ---- inside a worker process ------------------------------------------------------------------


def serve(conn: Connection) -> None:
    """Open the worker, then answer each job until told to close or the trainer is gone."""
    from models.loading import use_device
    from sampling.workers.worker import RolloutWorker

    worker = None
    try:
        _, config, model_path, batch_size, device, threads = conn.recv()
        use_device(device)  # the trainer's: its models, and so this sampler's, live there
        worker = RolloutWorker.open(
            SamplerConfig.model_validate(config), Path(model_path), batch_size, threads
        )
        conn.send(("ready",))
        while True:
            kind, *payload = conn.recv()
            if kind == "close":
                break
            conn.send(("result", worker.draw(payload[0])))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the trainer is gone
    except Exception:
        _send_error(conn, traceback.format_exc())
    finally:
        if worker is not None:
            worker.close()


def _send_error(conn: Connection, text: str) -> None:
    with contextlib.suppress(OSError):
        conn.send(("error", text))


def main(argv: list[str]) -> Any:
    logging.basicConfig(level=logging.WARNING)
    serve(Connection(int(argv[1])))


if __name__ == "__main__":
    main(sys.argv)
