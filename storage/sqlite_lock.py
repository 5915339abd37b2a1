"""The MLflow store's SQLite file under several processes: write-ahead logging, so that a reader
(the MLflow UI, `r1 lineage`, a script reading curves) never blocks a stage's write; the
processes that hold the lock a write waits for, named from the kernel's lock table; and a write
retried while another writer holds the file.

SQLite locks bytes of the database file (rollback journal: a reader's SHARED range, a writer's
RESERVED, PENDING and EXCLUSIVE bytes) or, under write-ahead logging, bytes of its `-shm` file
(the writer's byte 120, the checkpointer's 121, recovery's 122). Linux lists them in
`/proc/locks`; elsewhere no holder is named. Nothing here opens the database file other than
through SQLite: closing any descriptor of a file drops every POSIX lock this process holds on
it, those of its SQLite connections included.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mlflow.exceptions import MlflowException

log = logging.getLogger(__name__)

T = TypeVar("T")

PENDING_BYTE = 0x40000000  # SQLite's lock bytes in the database file: PENDING, RESERVED, SHARED
LOCK_BYTES = (PENDING_BYTE, PENDING_BYTE + 511)
WAL_WRITER_BYTES = (120, 122)  # in the -shm file: write, checkpoint, recover
PROC_LOCKS = Path("/proc/locks")


def write_ahead_log(db: Path, wait: float) -> str:
    """Put `db` (created if missing) in write-ahead-log mode, which the file keeps for every
    later connection; returns the journal mode it is in (a filesystem without shared memory
    keeps its rollback journal: 'delete')."""
    con = sqlite3.connect(db, timeout=wait, isolation_level=None)
    try:
        (mode,) = con.execute("PRAGMA journal_mode=WAL").fetchone()
    finally:
        con.close()
    if mode != "wal":
        log.warning("%s stays in journal mode %s: readers will block writers", db, mode)
    return mode


def lock_holders(db: Path) -> list[int]:
    """The processes, other than this one, holding a lock that a write to `db` waits for: under
    a rollback journal any lock on its lock bytes (a reader's too), under write-ahead logging a
    writer's, checkpointer's or recoverer's lock on its -shm file. Empty where `/proc/locks`
    does not exist."""
    shm = db.with_name(db.name + "-shm")
    wal = shm.exists()  # SQLite keeps it while a connection is open in write-ahead-log mode
    watched = {}
    for path, span, writes_only in (
        (db, LOCK_BYTES, wal),
        (shm, WAL_WRITER_BYTES, True),
    ):
        try:
            stat = path.stat()
        except OSError:
            continue
        watched[(os.major(stat.st_dev), os.minor(stat.st_dev), stat.st_ino)] = span, writes_only
    try:
        table = PROC_LOCKS.read_text().splitlines()
    except OSError:
        return []
    holders: list[int] = []
    for line in table:
        fields = line.split()
        if "->" in fields or len(fields) < 8:  # a lock waited for, not held
            continue
        kind, pid, device, start, end = fields[3], int(fields[4]), fields[5], fields[6], fields[7]
        major, minor, inode = device.split(":")
        found = watched.get((int(major, 16), int(minor, 16), int(inode)))
        if found is None or pid == os.getpid() or pid in holders:
            continue
        (low, high), writes_only = found
        last = high if end == "EOF" else int(end)
        if int(start) <= high and last >= low and (kind == "WRITE" or not writes_only):
            holders.append(pid)
    return holders


def describe_holders(pids: list[int]) -> str:
    """'process 123 (mlflow server ...)' for each, or 'another process' when none is known."""
    if not pids:
        return "another process"
    return ", ".join(f"process {pid} ({command_line(pid)})" for pid in pids)


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "ended"
    words = raw.replace(b"\0", b" ").decode(errors="replace").split()  # one line, however written
    return " ".join(words)[:200] or "unknown"


def is_locked(err: BaseException) -> bool:
    """An MLflow call that failed because SQLite's busy wait ran out."""
    return isinstance(err, MlflowException) and "database is locked" in str(err)


class StoreLockedTooLong(RuntimeError):
    """A write to the MLflow store waited longer than its wait allows."""


def while_locked(write: Callable[[], T], db: Path, wait: float, what: str) -> T:
    """`write()`, tried again while it fails because another process holds `db` (each try
    waits out MLflow's own busy timeout first), until `wait` seconds have passed; then
    StoreLockedTooLong naming the holders."""
    deadline, pause = time.monotonic() + wait, 0.5
    while True:
        try:
            return write()
        except MlflowException as err:
            if not is_locked(err):
                raise
            holders = describe_holders(lock_holders(db))
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreLockedTooLong(
                    f"{what}: the MLflow store {db} was locked by {holders} for longer than "
                    f"{wait:g} s"
                ) from err
            log.warning("%s: %s is locked by %s; trying again", what, db, holders)
            time.sleep(min(pause, left))
            pause = min(2 * pause, 5.0)
