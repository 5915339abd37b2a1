"""The stores out of reach: a DuckDB file another process holds is retried for a bounded time and
then refused naming the file and the holder; an MLflow store that cannot be used fails the
pre-flight check, naming the store's URI and what failed; the MLflow store in write-ahead-log
mode, so that a process reading it never holds up a stage's write, and a stage's write retried
while another process writes it, then refused naming that process."""

from __future__ import annotations

import pickle
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from mlflow import MlflowClient

from storage import rollout_store, store
from storage.paths import StatePaths
from storage.tracking import (
    LOCK_WAIT_ENV,
    TIMEOUT_ENV,
    MlflowTracker,
    TrackingStoreError,
    check_tracking_store,
    stage_run,
    start_pipeline_run,
)

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
con.execute("BEGIN EXCLUSIVE" if sys.argv[2] == "write" else "BEGIN")
if sys.argv[2] == "read":  # a reader in the middle of its transaction
    con.execute("SELECT count(*) FROM sqlite_master").fetchone()
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
    assert f"is locked by process {holder.pid} (" in message
    assert "and was still locked after 0.5 s" in message
    assert holder.poll() is None  # refused while the lock is held, not once it was let go


def test_a_usable_store_passes_and_is_left_as_it_was(tmp_path):
    paths = StatePaths(tmp_path / "state")
    check_tracking_store(paths)
    assert paths.mlflow_artifacts.is_dir() and in_write_ahead_log(paths.mlflow_db)
    with sqlite3.connect(paths.mlflow_db) as con:
        con.execute("CREATE TABLE notes (name TEXT)")
        con.execute("INSERT INTO notes VALUES ('r1-tiny')")
    con.close()
    check_tracking_store(paths)
    with sqlite3.connect(paths.mlflow_db) as con:
        assert con.execute("SELECT name FROM notes").fetchall() == [("r1-tiny",)]
    con.close()


# Opens the store as a pipeline run does (the check, then its experiment), once the clock
# reaches argv[2]: several at once on a new state folder.
OPENER = """
import sys, time
from pathlib import Path
from storage.paths import StatePaths
from storage.tracking import check_tracking_store, experiment_id, tracking_client
paths = StatePaths(Path(sys.argv[1]))
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
check_tracking_store(paths)
print(experiment_id(tracking_client(paths), "r1-test", paths))
"""


def test_runs_starting_together_on_a_new_state_folder_make_one_store(tmp_path):
    """Each opens the store and finds the one experiment: MLflow's migration of the new
    `mlflow.db` runs once, not in each process at once (where one died with an SQL error)."""
    root = tmp_path / "state"
    start = time.time() + 8  # every process has imported MLflow by then
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(root), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        for _ in range(3)
    ]
    results = [opener.communicate(timeout=120) for opener in openers]
    for opener, (_, err) in zip(openers, results, strict=True):
        assert opener.returncode == 0, err[-2000:]
    assert len({out.strip() for out, _ in results}) == 1


def in_write_ahead_log(db: Path) -> bool:
    """Asked of SQLite: reading the file outside it would drop this process's locks on it."""
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        con.close()


def stage_tracker(paths: StatePaths) -> tuple[MlflowClient, str]:
    """A client of the store and a pipeline run in it, as a pipeline run makes them."""
    client = MlflowClient(paths.tracking_uri)
    experiment = client.create_experiment("r1-test", artifact_location=paths.root.as_uri())
    return client, start_pipeline_run(client, experiment, "pipeline", "flow-run", {})


@pytest.mark.parametrize("made_by", ["preflight", "mlflow"])
def test_a_reader_in_the_middle_of_a_transaction_never_holds_up_a_stage_write(
    tmp_path, hold, made_by
):
    """The MLflow UI, `r1 lineage` or a script reading curves holds a read transaction open; a
    stage's write goes through meanwhile, on a store the pre-flight check made and on one that
    MLflow made before it (in rollback-journal mode, where such a reader makes every write wait
    out MLflow's 20 s busy timeout and then fail)."""
    paths = StatePaths(tmp_path / "state")
    if made_by == "mlflow":
        paths.root.mkdir()
        MlflowClient(paths.tracking_uri).search_experiments()
        assert not in_write_ahead_log(paths.mlflow_db)
    check_tracking_store(paths)
    assert in_write_ahead_log(paths.mlflow_db)
    client, parent = stage_tracker(paths)
    reader = hold(SQLITE_HOLDER, paths.mlflow_db, "read", 120.0)
    began = time.monotonic()
    with stage_run(client, parent, "reasoning_rl", {}) as tracker:
        tracker.log_metrics({"reward/mean": 0.5}, step=1)
    assert time.monotonic() - began < 10
    assert reader.poll() is None  # the reader still in its transaction
    (run,) = client.search_runs(
        [client.get_run(parent).info.experiment_id], "tags.`r1.stage` = 'reasoning_rl'"
    )
    assert run.info.status == "FINISHED" and run.data.metrics == {"reward/mean": 0.5}


@pytest.mark.slow  # MLflow waits 20 s for a locked store before each try
def test_a_stage_write_waits_for_another_writer_then_names_it(tmp_path, hold, monkeypatch):
    """Another process writes the store for 25 s: a stage's metrics wait for it (MLflow's busy
    wait of 20 s runs out once, the write is tried again) and are logged once. With no wait
    left, the write fails naming that process and the setting that waits longer."""
    paths = StatePaths(tmp_path / "state")
    check_tracking_store(paths)
    client, parent = stage_tracker(paths)
    run_id = client.create_run(client.get_run(parent).info.experiment_id).info.run_id
    tracker = MlflowTracker(client, run_id)

    hold(SQLITE_HOLDER, paths.mlflow_db, "write", 25.0)
    began = time.monotonic()
    tracker.log_metrics({"reward/mean": 0.5}, step=1)
    assert time.monotonic() - began >= 20
    assert [m.step for m in client.get_metric_history(run_id, "reward/mean")] == [1]

    monkeypatch.setenv(LOCK_WAIT_ENV, "0")
    holder = hold(SQLITE_HOLDER, paths.mlflow_db, "write", 120.0)
    with pytest.raises(TrackingStoreError) as info:
        tracker.log_metrics({"reward/mean": 0.7}, step=2)
    message = str(info.value)
    locked = f"metrics at step 2: the MLflow store {paths.mlflow_db} was locked by process "
    assert locked in message and f"process {holder.pid} (" in message, message
    assert LOCK_WAIT_ENV in message


@pytest.mark.slow  # MLflow waits 20 s for a locked store
def test_a_failed_stage_raises_its_own_error_when_the_store_is_locked(tmp_path, hold):
    """The stage fails while another process writes the store: its failure cannot be recorded
    (the run stays RUNNING, which the next attempt takes for killed), and the stage's own error
    is what the caller gets, after one busy wait, not the store's."""
    paths = StatePaths(tmp_path / "state")
    check_tracking_store(paths)
    client, parent = stage_tracker(paths)
    began = time.monotonic()
    with (
        pytest.raises(ValueError, match="the stage's own error"),
        stage_run(client, parent, "reasoning_rl", {}),
    ):
        holder = hold(SQLITE_HOLDER, paths.mlflow_db, "write", 120.0)
        raise ValueError("the stage's own error")
    assert time.monotonic() - began < 35  # one busy wait, not one per record
    holder.kill()
    holder.wait()
    (run,) = client.search_runs(
        [client.get_run(parent).info.experiment_id], "tags.`r1.stage` = 'reasoning_rl'"
    )
    assert run.info.status == "RUNNING"
