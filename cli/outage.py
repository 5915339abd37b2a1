"""A Prefect server that stops answering while `r1 watch` follows a run: say so once, try again
at growing intervals (capped, so that the watch sees the server back soon after it is), say when
it is back, and go on.

Prefect's client retries a request itself, five times over about a minute, and then raises: a
watch ended with a 73-line `httpx.ConnectError` traceback 68 s into a server restart. The watch
turns those retries off (`CLIENT_RETRIES`) and waits here instead, for as long as it takes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from storage.paths import env_seconds

T = TypeVar("T")

BACKOFF_ENV = "R1_WATCH_BACKOFF_SECONDS"  # the longest wait between two tries
FIRST_WAIT = 1.0
LONGEST_WAIT = 30.0
CLIENT_RETRIES = 0  # PREFECT_CLIENT_MAX_RETRIES for the watch: it retries here
BUSY_CODES = frozenset({408, 429, 502, 503, 504})  # a server starting, stopping or overloaded


def nap(seconds: float, slice_s: float = 0.1) -> None:
    """`time.sleep(seconds)` in slices of at most `slice_s`: a sleep wakes only for a signal the
    kernel hands to its own thread, and Python runs a signal's handler (Ctrl-C's
    KeyboardInterrupt) in the main thread between slices, whichever thread received it."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, slice_s))


def longest_wait() -> float:
    """`R1_WATCH_BACKOFF_SECONDS`, else 30 s; under a second would ask a server that is down
    many times a second, so it is refused, named."""
    wait = env_seconds(BACKOFF_ENV, LONGEST_WAIT)
    if wait < 1:
        raise ValueError(f"{BACKOFF_ENV}={os.environ[BACKOFF_ENV]!r}: expected 1 second or more")
    return wait


def waits(first: float, longest: float) -> Iterator[float]:
    """1, 2, 4, ... seconds, none longer than `longest`."""
    wait = min(first, longest)
    while True:
        yield wait
        wait = min(wait * 2, longest)


def is_unreachable(error: BaseException) -> bool:
    """Whether `error` says the server is not there (refused, reset, timed out, starting or
    stopping), rather than that it refused the request."""
    import httpx

    if isinstance(error, httpx.TransportError):
        return True
    return isinstance(error, httpx.HTTPStatusError) and error.response.status_code in BUSY_CODES


@dataclass
class Outage:
    """Calls to a server that may be away for a while; `say` gets one line when it goes, one
    when it is back."""

    url: str
    say: Callable[[str], None]
    longest: float = field(default_factory=longest_wait)
    sleep: Callable[[float], None] = nap
    clock: Callable[[], float] = time.monotonic

    def call(self, request: Callable[[], T]) -> T:
        """`request()`, tried again until the server answers it."""
        gone_at = None
        pauses = waits(FIRST_WAIT, self.longest)
        while True:
            try:
                answer = request()
            except Exception as error:
                if not is_unreachable(error):
                    raise
                if gone_at is None:
                    gone_at = self.clock()
                    self.say(self.gone_line(error))
                self.sleep(next(pauses))
                continue
            if gone_at is not None:
                self.say(
                    f"r1 watch: the Prefect server is back after {self.clock() - gone_at:.0f} s"
                )
            return answer

    def gone_line(self, error: BaseException) -> str:
        return (
            f"r1 watch: the Prefect server at {self.url} is unreachable ({type(error).__name__}); "
            f"trying again every {self.longest:.0f} s at most (Ctrl-C stops the watch, not the run)"
        )
