"""The stores out of reach: a DuckDB file another process holds is waited for a bounded time and
then refused naming the file and the holder; an MLflow store that cannot be used fails the
pre-flight check within seconds, naming the store's URI and what failed."""

from __future__ import annotations

import pickle
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import rollout_store, store
from storage.paths import StatePaths
from storage.tracking import TIMEOUT_ENV, TrackingStoreError, check_tracking_store

# Holds a database file open in another process: argv = path, mode, seconds to hold.
DUCKDB_HOLDER = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == "read_only")
print("held", flush=True)
time.sleep(float(sys.argv[3]))
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


def elapsed(call: Callable[[], object]) -> tuple[float, BaseException | None]:
    began = time.monotonic()
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the test inspects it
        return time.monotonic() - began, err
    return time.monotonic() - began, None


# ---- DuckDB ------------------------------------------------------------------------------------


def test_a_duckdb_file_held_by_another_process_is_refused_naming_file_and_pid(
    tmp_path, hold, monkeypatch
):
    db = tmp_path / "r1.duckdb"
    holder = hold(DUCKDB_HOLDER, db)
    monkeypatch.setenv(store.LOCK_WAIT_ENV, "1")
    for call in (
        lambda: store.record_lineage(db, "a", "model", "d", "stage", "run", []),
        lambda: rollout_store.existing_samples(db, "m"),  # the rollout store opens it the same way
    ):
        seconds, err = elapsed(call)
        assert isinstance(err, store.StoreLockedError), err
        assert 1.0 <= seconds < 3.0  # waited the bounded time, neither at once nor forever
        message = str(err)
        assert str(db) in message and f"locked by process {holder.pid} (" in message
        assert "still locked after 1 s" in message and store.LOCK_WAIT_ENV in message
        assert str(pickle.loads(pickle.dumps(err))) == message


def test_a_file_released_within_the_wait_is_used(tmp_path, hold, monkeypatch):
    db = tmp_path / "r1.duckdb"
    store.record_lineage(db, "a", "model", "d", "stage", "run", [])
    holder = hold(DUCKDB_HOLDER, db, "read_only", 0.5)  # someone looking at the tables
    monkeypatch.setenv(store.LOCK_WAIT_ENV, "10")
    seconds, err = elapsed(lambda: store.record_lineage(db, "b", "model", "d", "stage", "run", []))
    assert err is None and 0.2 <= seconds < 5.0
    assert holder.stdout is not None and holder.stdout.readline().strip() == "released"


# ---- MLflow ------------------------------------------------------------------------------------


def refused(paths: StatePaths) -> str:
    seconds, err = elapsed(lambda: check_tracking_store(paths))
    assert isinstance(err, TrackingStoreError), err
    assert seconds < 3.0
    message = str(err)
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
    hold(SQLITE_HOLDER, paths.mlflow_db)
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    message = refused(paths)
    assert "is locked by another process and was still locked after 0.5 s" in message


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
