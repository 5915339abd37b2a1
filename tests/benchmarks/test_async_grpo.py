"""The asynchronous GRPO benchmark counts its own sampler processes' CPU time, not another
run's on the same machine."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import psutil

from benchmarks.async_grpo import worker_pids


def test_only_this_processs_own_samplers_are_its_workers():
    tag = uuid.uuid4().hex  # this test's processes alone
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)", "sampling.workers.process", tag]
    mine = subprocess.Popen(sleeper)
    # another run's sampler: started by a shell that exits, so it is nobody's child here
    subprocess.run(["bash", "-c", " ".join(f"'{a}'" for a in sleeper) + " & echo $! > /dev/null"])
    deadline = time.monotonic() + 10
    others: list[int] = []
    while not others and time.monotonic() < deadline:
        others = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if tag in (p.info["cmdline"] or []) and p.pid != mine.pid
        ]
        time.sleep(0.1)
    try:
        assert others, "the other run's sampler did not start"
        assert worker_pids() == {mine.pid}
    finally:
        mine.kill()
        for pid in others:
            psutil.Process(pid).kill()
