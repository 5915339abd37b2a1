"""The disk under the state folder: its free space, and the failures a full disk or a folder that
cannot be written give, told in one line that names the folder and the space.

A full disk reaches a stage in many words: `OSError: [Errno 28]` from Python's own writes,
`database or disk is full` from SQLite (MLflow's store, Prefect's), `Could not write file ...:
No space left on device` from DuckDB, `I/O error: No space left on device (os error 28)` from
safetensors, and from `torch.save` only `unexpected pos 576 vs 534`, which says nothing of the
disk (training/checkpoints.py measures the space for those). `disk_error` reads the whole chain
of an error for them and gives a `StateDiskError` saying what to do: free space on that disk and
run the same command again, which takes the finished stages from the cache and resumes the
failed one from its last checkpoint.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
FULL_WORDS = (
    "no space left on device",
    "database or disk is full",
    "disk quota exceeded",
    "os error 28)",
    "os error 122)",
)
UNWRITABLE_ERRNOS = frozenset({errno.EROFS, errno.EACCES})
UNWRITABLE_WORDS = (
    "read-only file system",
    "attempt to write a readonly database",
    "os error 30)",
)
# Below this much free space a disk is taken for full whatever the error said: a write that
# failed with it left is very likely the one that ran out (SQLite and torch say nothing clear).
NEARLY_FULL = 1 << 20
# A disk with this much free is not the one that was full (a write elsewhere ran out of space).
ROOMY = 64 << 20


@dataclass(frozen=True)
class DiskSpace:
    """The free and total bytes of the file system holding a folder."""

    folder: Path
    free: int
    total: int

    def text(self) -> str:
        return f"{size_text(self.free)} free of {size_text(self.total)}"


def size_text(size: float) -> str:
    """`0 B`, `512 KiB`, `14.0 MiB`, `2.3 GiB`."""
    if size < 1024:
        return f"{int(size)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "KiB" else f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def disk_space(folder: Path) -> DiskSpace | None:
    """The space of the disk `folder` is on (or would be made on: its nearest existing parent);
    None where it cannot be read."""
    for place in (folder, *folder.parents):
        try:
            usage = shutil.disk_usage(place)
        except OSError:
            continue
        return DiskSpace(folder, usage.free, usage.total)
    return None


def chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what caused it or was being handled when it was raised, each once."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__  # type: ignore[assignment]


def _says(error: BaseException, errnos: frozenset[int], words: tuple[str, ...]) -> bool:
    if isinstance(error, OSError) and error.errno in errnos:
        return True
    text = str(error).lower()
    return any(word in text for word in words)


def _refused_file(error: BaseException) -> bool:
    """EPERM on a named file (an immutable one, a folder that takes no new entries); EPERM with no
    file (a signal, a limit) is no write refused."""
    return isinstance(error, OSError) and error.errno == errno.EPERM and bool(error.filename)


def write_failure(error: BaseException) -> tuple[str, BaseException] | None:
    """("full", the error in `error`'s chain that says so) for a disk that ran out of space,
    ("unwritable", ...) for a folder or file that cannot be written, else None (also for an
    error already told as a StateDiskError)."""
    for link in chain(error):
        if isinstance(link, StateDiskError):
            return None
        if _says(link, FULL_ERRNOS, FULL_WORDS):
            return "full", link
        if _says(link, UNWRITABLE_ERRNOS, UNWRITABLE_WORDS) or _refused_file(link):
            return "unwritable", link
    return None


class StateDiskError(RuntimeError):
    """A write to the state folder failed because its disk is full or the folder cannot be
    written; the message names the folder, the space and what to do."""

    def __init__(self, message: str):
        super().__init__(message)

    def __reduce__(self):  # keeps the error picklable (Prefect stores a failed task's error)
        return (type(self), (str(self),))


def full_disk_message(who: str, folder: Path, space: DiskSpace | None, needed: int = 0) -> str:
    """`reasoning_rl: the disk of /state is full (0 B free of 14.0 MiB; about 3.1 MiB more needed
    for ...): ...`, the one line a full disk is told in."""
    have = space.text() if space is not None else "its free space unknown"
    need = f"; about {size_text(needed)} needed" if needed else ""
    return (
        f"{_whose(who)}the disk of {folder} is full ({have}{need}): free space on that disk "
        "and run the same command again: finished stages come from the cache and the stage "
        "that failed resumes from what it saved last (its checkpoint, its stored chunks)"
    )


def unwritable_message(who: str, folder: Path, cause: str) -> str:
    return (
        f"{_whose(who)}cannot write in {folder} ({cause}): make the state folder writable (or name "
        "another with --state-dir or R1_STATE_DIR) and run the same command again"
    )


def full_disk_reading(error: BaseException, folder: Path, what: str) -> str | None:
    """The line for a read of `what` in `folder` that failed while the disk of `folder` is full
    (SQLite in write-ahead-log mode makes a shared-memory file beside a database to read it: on
    a full disk MLflow's store fails with `disk I/O error`); None while that disk has room, where
    the error is another's."""
    space = disk_space(folder)
    if space is None or space.free >= NEARLY_FULL:
        return None
    return (
        f"the disk of {folder} is full ({space.text()}) and {what} cannot be read without some "
        f"room on it ({cause_text(error)}): free space on that disk and run the command again"
    )


def _whose(who: str) -> str:
    return f"{who}: " if who else ""


def disk_error(
    error: BaseException, folder: Path, who: str, needed: int = 0
) -> StateDiskError | None:
    """The StateDiskError that tells `error` in one line, where it is a full disk or a folder
    that cannot be written while writing under `folder` (the state folder, or the part of it a
    write was for): the folder of the file it names, where it names one, else `folder`, with its
    disk's space. None for any other error, and for one already told."""
    found = write_failure(error)
    if found is None:
        return None
    kind, cause = found
    written = written_folder(cause)
    if kind == "unwritable":
        return StateDiskError(unwritable_message(who, written or folder, cause_text(cause)))
    space = disk_space(written or folder)
    if written is None and space is not None and space.free >= ROOMY:  # full elsewhere
        return StateDiskError(
            f"{_whose(who)}a disk it writes to is full ({cause_text(cause)}), though the state "
            f"folder's, {folder}, has {space.text()}: free space on the disk it wrote to and "
            "run the same command again"
        )
    message = full_disk_message(who, written or folder, space, needed)
    return StateDiskError(f"{message} ({cause_text(cause)})")


_WRITTEN = re.compile(r'Could not write file "(?P<path>[^"]+)"')  # DuckDB's words


def written_folder(error: BaseException) -> Path | None:
    """The folder of the file a failed write names (an OSError's destination, or DuckDB's
    file in its message), if it names one."""
    name = getattr(error, "filename2", None) or getattr(error, "filename", None)
    if not name:
        match = _WRITTEN.search(str(error))
        name = match.group("path") if match else None
    return Path(os.fsdecode(name)).parent if isinstance(name, str | bytes) and name else None


def cause_text(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
