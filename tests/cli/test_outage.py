"""`r1 watch` waits for a Prefect server that went away (cli/outage.py): the waits between tries,
what it says, and what it does not take for an outage."""

from __future__ import annotations

from itertools import islice

import httpx
import pytest

from cli.outage import BACKOFF_ENV, Outage, is_unreachable, longest_wait, waits

URL = "http://127.0.0.1:4290/api"


def refused() -> httpx.ConnectError:
    return httpx.ConnectError("[Errno 111] Connection refused")


def status_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", URL)
    return httpx.HTTPStatusError(
        "", request=request, response=httpx.Response(code, request=request)
    )


class Server:
    """Refuses `down` requests, then answers each with its number."""

    def __init__(self, down: int, error: Exception | None = None):
        self.down, self.error, self.asked = down, error or refused(), 0

    def request(self) -> int:
        self.asked += 1
        if self.asked <= self.down:
            raise self.error
        return self.asked


class Clock:
    """A clock that moves only when the outage sleeps."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def outage(lines: list[str], clock: Clock, longest: float = 8.0) -> Outage:
    return Outage(URL, lines.append, longest, clock.sleep, lambda: clock.now)


def test_the_waits_double_up_to_the_longest():
    assert list(islice(waits(1.0, 8.0), 6)) == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert list(islice(waits(1.0, 0.5), 2)) == [0.5, 0.5]


def test_the_longest_wait_is_a_setting(monkeypatch):
    monkeypatch.delenv(BACKOFF_ENV, raising=False)
    assert longest_wait() == 30.0
    monkeypatch.setenv(BACKOFF_ENV, "4")
    assert longest_wait() == 4.0


def test_an_outage_is_said_once_waited_for_and_its_end_said():
    lines, clock, server = [], Clock(), Server(down=7)
    assert outage(lines, clock).call(server.request) == 8
    assert clock.slept == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert lines == [
        f"r1 watch: the Prefect server at {URL} is unreachable (ConnectError); trying again "
        "every 8 s at most (Ctrl-C stops the watch, not the run)",
        "r1 watch: the Prefect server is back after 39 s",
    ]


def test_a_server_that_answers_is_not_waited_for():
    lines, clock = [], Clock()
    assert outage(lines, clock).call(Server(down=0).request) == 1
    assert lines == [] and clock.slept == []


@pytest.mark.parametrize("error", [refused(), httpx.ReadTimeout("t"), status_error(503)])
def test_refused_timed_out_or_busy_is_an_outage(error):
    assert is_unreachable(error)
    lines, clock = [], Clock()
    assert outage(lines, clock).call(Server(down=1, error=error).request) == 2
    assert len(lines) == 2


@pytest.mark.parametrize("error", [status_error(404), status_error(500), ValueError("bad")])
def test_an_answer_that_refuses_the_request_is_raised_not_waited_for(error):
    assert not is_unreachable(error)
    with pytest.raises(type(error)):
        outage([], Clock()).call(Server(down=1, error=error).request)


NAP_UNDER_CTRL_C = """
import os, signal, sys, threading, time
from cli.outage import nap

def press():  # Ctrl-C to the process, received by this thread, not the sleeping one
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGINT)

signal.signal(signal.SIGINT, signal.default_int_handler)  # started in the background, Ctrl-C
# is ignored from the start and Python installs no handler of its own
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
threading.Thread(target=press).start()
began = time.monotonic()
try:
    nap(20)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - began:.1f} s")
"""


def test_a_nap_gives_way_to_ctrl_c_whichever_thread_the_kernel_handed_it_to():
    """The watch's waits between tries (up to 30 s): Ctrl-C delivered to another thread of the
    process still stops it within a slice, where `time.sleep` would sleep on to its end."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", NAP_UNDER_CTRL_C], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith("interrupted after"), done.stdout + done.stderr
    assert float(done.stdout.split()[2]) < 10, done.stdout
