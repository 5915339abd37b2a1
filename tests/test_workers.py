"""The room the suite's workers share (tests/workers.py): tests side by side, an `alone` one by
itself, and one waiting to be alone is not overtaken by a test that asks after it."""

import fcntl
import multiprocessing
import os
import time
from pathlib import Path

from tests.workers import Room

FORK = multiprocessing.get_context("fork")


def hold(folder: Path, alone: bool, name: str, events, release) -> None:
    """In a process of its own (its own open files: flock is per open file), enter the room,
    say so, stay until `release` is set, and say it left."""
    with Room(folder).enter(alone):
        events.put(f"{name} in")
        release.wait(30)
        events.put(f"{name} out")


def start(folder: Path, alone: bool, name: str, events):
    release = FORK.Event()
    process = FORK.Process(target=hold, args=(folder, alone, name, events, release))
    process.start()
    return process, release


def drained(events) -> list[str]:
    seen = []
    while not events.empty():
        seen.append(events.get())
    return seen


def turnstile_taken(folder: Path) -> bool:
    fd = os.open(folder / "turnstile", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_shared_tests_go_in_together_and_one_alone_goes_before_those_that_ask_after_it(tmp_path):
    events = FORK.Queue()
    first, release_first = start(tmp_path, False, "first", events)
    second, release_second = start(tmp_path, False, "second", events)
    assert sorted([events.get(timeout=30), events.get(timeout=30)]) == ["first in", "second in"]
    release_second.set()
    assert events.get(timeout=30) == "second out"

    alone, release_alone = start(tmp_path, True, "alone", events)
    deadline = time.monotonic() + 30
    while not turnstile_taken(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)  # `alone` waits for the room, the turnstile taken
    later, release_later = start(tmp_path, False, "later", events)
    time.sleep(0.5)
    assert drained(events) == []  # `first` still in: neither `alone` nor `later` got in
    release_first.set()
    assert events.get(timeout=30) == "first out"
    assert events.get(timeout=30) == "alone in"
    time.sleep(0.5)
    assert drained(events) == []  # `later` waits while `alone` is in
    release_alone.set()
    assert [events.get(timeout=30), events.get(timeout=30)] == ["alone out", "later in"]
    release_later.set()
    assert events.get(timeout=30) == "later out"
    for process in (first, second, alone, later):
        process.join(30)
        assert process.exitcode == 0
