"""`r1 run`'s stop on SIGTERM holds where Python drops what a signal handler raises: a
finalizer. There the handler's `Terminated` is printed and lost, and without the re-sent signal
the run went on as if none had come (a stopped run that trained to its end)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import os, signal, time
from cli.main import Terminated, stop_on_termination

stop_on_termination()


class Finalized:
    def __del__(self):  # the signal comes, and its handler runs, inside a finalizer
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)


try:
    Finalized()
    for _ in range(100):  # five seconds of work after it
        time.sleep(0.05)
    print("went on")
except Terminated as stop:
    print("stopped by", stop.signum.name)
"""


def test_a_termination_dropped_in_a_finalizer_still_stops_the_program():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped by SIGTERM", done.stdout + done.stderr
