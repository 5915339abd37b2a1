"""The room the suite's workers share (tests/workers.py): tests side by side, an `alone` one by
itself, and one waiting to be alone is not overtaken by a test that asks after it."""

import fcntl
import multiprocessing
import os
import time
from pathlib import Path

from tests.workers import Room

SPAWN = multiprocessing.get_context("spawn")  # a fresh process: no state of the worker forked


def hold(folder: Path, alone: bool, name: str, release) -> None:
    """In a process of its own (its own open files: flock is per open file), enter the room,
    say so, stay until `release` is set, and say it left, each line written before the next
    step (a file, in the order written)."""
    with Room(folder).enter(alone):
        say(folder, f"{name} in")
        release.wait(30)
        say(folder, f"{name} out")


def say(folder: Path, event: str) -> None:
    fd = os.open(folder / "events", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{event}\n".encode())
    finally:
        os.close(fd)


class Events:
    """The lines the processes wrote, read in order."""

    def __init__(self, folder: Path):
        self.path, self.read = folder / "events", 0

    def new(self) -> list[str]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        fresh, self.read = lines[self.read :], len(lines)
        return fresh

    def next(self, count: int = 1) -> list[str]:
        """The next `count` lines, waiting up to 30 s for them."""
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while len(seen) < count and time.monotonic() < deadline:
            seen += self.new()
            time.sleep(0.02)
        return seen


def start(folder: Path, alone: bool, name: str):
    release = SPAWN.Event()
    process = SPAWN.Process(target=hold, args=(folder, alone, name, release))
    process.start()
    return process, release


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
    events = Events(tmp_path)
    first, release_first = start(tmp_path, False, "first")
    second, release_second = start(tmp_path, False, "second")
    assert sorted(events.next(2)) == ["first in", "second in"]
    release_second.set()
    assert events.next() == ["second out"]

    alone, release_alone = start(tmp_path, True, "alone")
    deadline = time.monotonic() + 30
    while not turnstile_taken(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)  # `alone` waits for the room, the turnstile taken
    later, release_later = start(tmp_path, False, "later")
    time.sleep(0.5)
    assert events.new() == []  # `first` still in: neither `alone` nor `later` got in
    release_first.set()
    assert events.next(2) == ["first out", "alone in"]
    time.sleep(0.5)
    assert events.new() == []  # `later` waits while `alone` is in
    release_alone.set()
    assert events.next(2) == ["alone out", "later in"]
    release_later.set()
    assert events.next() == ["later out"]
    for process in (first, second, alone, later):
        process.join(30)
        assert process.exitcode == 0


def test_a_test_goes_to_a_worker_with_its_module_or_its_grouped_folder_whole():
    from tests.conftest import scope_of

    assert scope_of("tests/rl/test_grpo.py::test_a[x::y]") == "tests/rl/test_grpo.py"
    assert scope_of("tests/rl/test_grpo.py::TestA::test_b") == "tests/rl/test_grpo.py"
    assert scope_of("tests/cluster/test_training_nodes.py::test_a") == "tests/cluster"
    assert scope_of("tests/clusters/test_a.py::test_b") == "tests/clusters/test_a.py"
