"""The suite on several workers (pytest-xdist, as `scripts/test.sh` runs it): the room they share.

Most tests run beside another one: on 2 cores much of a test's time is a process starting, a
server answering or a heartbeat waited out, and the other core does the next test meanwhile. A
test marked `alone` reads what another test beside it would change (the CPU time an idle thread
burns, programs timed against a wall clock) and runs with no other test beside it: ordinary tests
hold the room shared, an `alone` one holds it to itself. A test waiting to be alone goes in before
any test that asks after it (the turnstile), so it is never starved by the other workers' tests.

The locks are `flock`s on two files in a folder that the controlling process makes for the run
and names to its workers; the kernel lets go of them when a worker dies.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOM_KEY = "r1_room"  # the workers' input that names the folder


class Room:
    """A readers-writer lock across the processes of one test run, the writer preferred."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self._turnstile = os.open(folder / "turnstile", os.O_CREAT | os.O_RDWR, 0o600)
        self._room = os.open(folder / "room", os.O_CREAT | os.O_RDWR, 0o600)

    @contextmanager
    def enter(self, alone: bool) -> Iterator[None]:
        """Hold the room, shared or (`alone`) to this process only, while the block runs."""
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        except BaseException:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            raise
        if not alone:  # the next one through: shared holders go in side by side
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)


def new_room_folder() -> str:
    return tempfile.mkdtemp(prefix="r1-tests-room-")


def remove_room_folder(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
