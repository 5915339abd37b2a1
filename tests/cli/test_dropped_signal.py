"""`r1 run`'s stop on SIGTERM, SIGHUP and Ctrl-C holds where Python drops what a signal handler
raises: a finalizer. There the stop is printed and lost, and without the re-sent signal the run
went on as if none had come (a stopped run that trained to its end)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def signals_at_default() -> None:
    """The stops under test at their default action, as in a terminal, though the suite may run
    in the background (where Ctrl-C's SIGINT is ignored, and `r1 run` keeps it so)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


PROGRAM = """
import os, signal, sys, time
from cli.main import Terminated, stop_on_termination

stop_on_termination()


class Finalized:
    def __del__(self):  # the signal comes, and its handler runs, inside a finalizer
        os.kill(os.getpid(), signal.Signals[sys.argv[1]])
        time.sleep(0.05)


try:
    Finalized()
    for _ in range(100):  # five seconds of work after it
        time.sleep(0.05)
    print("went on")
except KeyboardInterrupt as stop:
    print("stopped by", stop.signum.name if isinstance(stop, Terminated) else "SIGINT")
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stop_dropped_in_a_finalizer_still_stops_the_program(name):
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, name],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        preexec_fn=signals_at_default,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"stopped by {name}", done.stdout + done.stderr
