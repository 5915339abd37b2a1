"""Files forced to disk before they are taken for whole, so that they survive the machine going
down (a power cut, a kernel panic, a VM stopped by its host), not only the process.

A checkpoint is written beside the last one and swapped in by a rename: a process killed at any
moment leaves one whole checkpoint (training/checkpoints.py). The kernel, though, may put the
rename on disk before the data of the file renamed: after a crash of the machine the new
checkpoint can come back empty or cut short while the old one is gone, and a multi-day stage
restarts from nothing or fails to load. So the data of what is about to be swapped in (or
recorded as finished: a saved model, DeepSpeed's shards) is synced first, and the folder that
holds the rename after it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

# A folder that cannot be opened for syncing, or whose file system does not sync folders.
_FOLDER_UNSYNCABLE = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES})


def sync_file(path: Path) -> None:
    """Force `path`'s data and size to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(path: Path) -> None:
    """Force `path`'s entries (files made, renamed or removed in it) to disk, where its file
    system can."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as error:
        if error.errno in _FOLDER_UNSYNCABLE:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in _FOLDER_UNSYNCABLE:
            raise
    finally:
        os.close(fd)


def sync_tree(root: Path) -> None:
    """Force every file under `root` to disk, then every folder, deepest first."""
    walked = list(os.walk(root))
    for folder, _, files in walked:
        for name in files:
            sync_file(Path(folder) / name)
    for folder, _, _ in reversed(walked):
        sync_folder(Path(folder))
