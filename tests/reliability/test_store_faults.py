"""The stores out of reach: a DuckDB file another process holds is retried for a bounded time and
then refused naming the file and the holder; an MLflow store that cannot be used fails the
pre-flight check, naming the store's URI and what failed."""

from __future__ import annotations

import pickle
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from storage import rollout_store, store
from storage.paths import StatePaths
from storage.tracking import TIMEOUT_ENV, TrackingStoreError, check_tracking_store

# Holds a database file open in another process (argv = path, mode) until a line comes on its
# stdin, or until it is killed.
DUCKDB_HOLDER = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == "read_only")
print("held", flush=True)
sys.stdin.readline()
con.close()
print("released", flush=True)
sys.stdin.read()
"""
SQLITE_HOLDER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
time.sleep(float(sys.argv[3]))
"""

Holder = Callable[[str, Path, str, float], subprocess.Popen]


@pytest.fixture
def hold() -> Iterator[Holder]:
    """Start a process that holds a file (DuckDB or SQLite) and return once it holds it; every
    process started here is killed after the test."""
    started: list[subprocess.Popen] = []

    def start(program: str, path: Path, mode: str = "write", seconds: float = 60.0):
        proc = subprocess.Popen(
            [sys.executable, "-c", program, str(path), mode, str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def release(holder: subprocess.Popen) -> None:
    """Tell a DUCKDB_HOLDER to close the file, and return once it has."""
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("release\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"


@pytest.fixture
def attempts(monkeypatch) -> list[str]:
    """Each time DuckDB is asked to open a file from now on: "opened", or "refused" when another
    process holds it (the store retries those until its wait is over)."""
    outcomes: list[str] = []
    connect = duckdb.connect

    def recorded(*args, **kwargs):
        try:
            con = connect(*args, **kwargs)
        except duckdb.IOException:
            outcomes.append("refused")
            raise
        outcomes.append("opened")
        return con

    monkeypatch.setattr(duckdb, "connect", recorded)
    return outcomes


# ---- DuckDB ------------------------------------------------------------------------------------


def test_a_duckdb_file_held_by_another_process_is_refused_naming_file_and_pid(
    tmp_path, hold, attempts, monkeypatch
):
    db = tmp_path / "r1.duckdb"
    holder = hold(DUCKDB_HOLDER, db)
    monkeypatch.setenv(store.LOCK_WAIT_ENV, "1")
    for call in (
        lambda: store.record_lineage(db, "a", "model", "d", "stage", "run", []),
        lambda: rollout_store.existing_samples(db, "m"),  # the rollout store opens it the same way
    ):
        attempts.clear()
        with pytest.raises(store.StoreLockedError) as info:
            call()
        err = info.value
        # retried, not refused at the first try; given up while the holder still holds the file
        assert len(attempts) >= 2 and set(attempts) == {"refused"}
        assert holder.poll() is None and err.waited == 1.0 and err.holder_pid == holder.pid
        message = str(err)
        assert str(db) in message and f"locked by process {holder.pid} (" in message
        assert "still locked after 1 s" in message and store.LOCK_WAIT_ENV in message
        assert str(pickle.loads(pickle.dumps(err))) == message


def test_a_file_released_within_the_wait_is_used(tmp_path, hold, attempts, monkeypatch):
    db = tmp_path / "r1.duckdb"
    store.record_lineage(db, "a", "model", "d", "stage", "run", [])
    holder = hold(DUCKDB_HOLDER, db, "read_only")  # someone looking at the tables
    monkeypatch.setenv(store.LOCK_WAIT_ENV, "60")
    attempts.clear()
    connect = duckdb.connect

    def released_after_the_first_refusal(*args, **kwargs):
        if attempts == ["refused"]:
            release(holder)  # the holder lets go while the store waits
        return connect(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", released_after_the_first_refusal)
    store.record_lineage(db, "b", "model", "d", "stage", "run", [])
    assert attempts == ["refused", "opened"]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT artifact FROM lineage ORDER BY 1").fetchall() == [("a",), ("b",)]


# ---- MLflow ------------------------------------------------------------------------------------


def refused(paths: StatePaths) -> str:
    with pytest.raises(TrackingStoreError) as info:
        check_tracking_store(paths)
    message = str(info.value)
    assert message.startswith(f"MLflow store {paths.tracking_uri}: ")
    return message


def test_a_state_folder_that_cannot_be_created_fails_fast(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    message = refused(StatePaths(blocker / "state"))
    assert f"cannot create the state folder {blocker / 'state'}: Not a directory" in message


def test_an_mlflow_db_that_is_not_a_database_fails_fast(tmp_path):
    paths = StatePaths(tmp_path / "state")
    paths.root.mkdir()
    paths.mlflow_db.write_bytes(b"this is not an SQLite file\n" * 200)
    assert f"{paths.mlflow_db} is not an SQLite database" in refused(paths)
    paths.mlflow_db.unlink()
    paths.mlflow_db.mkdir()
    assert f"{paths.mlflow_db} is not a file" in refused(paths)


def test_an_mlflow_db_locked_by_another_process_fails_within_the_timeout(
    tmp_path, hold, monkeypatch
):
    paths = StatePaths(tmp_path / "state")
    paths.root.mkdir()
    holder = hold(SQLITE_HOLDER, paths.mlflow_db)
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    message = refused(paths)
    assert "is locked by another process and was still locked after 0.5 s" in message
    assert holder.poll() is None  # refused while the lock is held, not once it was let go


def test_a_usable_store_passes_and_is_left_as_it_was(tmp_path):
    paths = StatePaths(tmp_path / "state")
    check_tracking_store(paths)
    assert paths.mlflow_artifacts.is_dir() and not paths.mlflow_db.exists()  # MLflow makes it
    with sqlite3.connect(paths.mlflow_db) as con:
        con.execute("CREATE TABLE experiments (name TEXT)")
        con.execute("INSERT INTO experiments VALUES ('r1-tiny')")
    con.close()
    check_tracking_store(paths)
    with sqlite3.connect(paths.mlflow_db) as con:
        assert con.execute("SELECT name FROM experiments").fetchall() == [("r1-tiny",)]
    con.close()
