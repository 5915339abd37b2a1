"""The engine thread (sampling/watchdog.py) holds nothing of a call once it is over, even what a
call returned after its caller gave up on it."""

import gc
import threading
import time
import weakref

import pytest

from sampling.watchdog import EngineThread, SamplerTimeoutError


class Held:
    """Something an engine call makes or holds (an engine, its weights), watched by weakref."""

    made: list = []  # noqa: RUF012 - weak references to every instance

    def __init__(self):
        Held.made.append(weakref.ref(self))


def freed(ref: weakref.ref, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while ref() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return ref() is None


def test_an_engine_that_starts_after_its_call_timed_out_is_not_kept_by_the_thread():
    """A start that outlives its limit: the caller has its SamplerTimeoutError; when the start
    finally returns, the thread, waiting for a next call that never comes (the engine refuses
    them), must not keep what it returned alive (a whole engine, its GPU memory)."""
    thread, release = EngineThread(), threading.Event()

    def late_start() -> Held:
        release.wait(5)
        return Held()

    Held.made.clear()
    with pytest.raises(SamplerTimeoutError):
        thread.call(late_start, 0.1, "start", "start_timeout_s")
    release.set()
    deadline = time.monotonic() + 5
    while not Held.made and time.monotonic() < deadline:
        time.sleep(0.02)
    (engine,) = Held.made
    assert freed(engine)
    thread.close()
