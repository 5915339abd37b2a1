"""An exclusive `flock` on a file, held for a block by one process of those sharing a state
folder; the file names its holder (`pid N`) for the one refused. The kernel lets go of it when
its process ends, however it ends, so a killed run never leaves it held."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POLL_S = 0.1


class FileBusy(RuntimeError):
    """Another process holds the lock; `holder` names it (`pid N`, or `another process`)."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by {holder}")
        self.path = path
        self.holder = holder


@contextmanager
def held(path: Path, wait: float = 0.0) -> Iterator[None]:
    """Hold `path` (made, with its folder, if missing) for the block, waiting at most `wait`
    seconds for another holder to let go; then FileBusy naming it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    raise FileBusy(path, handle.read().strip() or "another process") from None
                time.sleep(POLL_S)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
