"""The DuckDB store: curated traces with their filter verdicts, filter counts, and lineage.

DuckDB allows one writing process per file, and while it writes no other process may even read
it. So every function opens, writes and closes within the call; nothing holds a connection. A file
that another process holds is waited for (`R1_DUCKDB_LOCK_WAIT` seconds, default 5), then refused
with StoreLockedError, which names the file and the holding process.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from storage.lineage import InputRef
from storage.paths import env_seconds

SCHEMA = """
CREATE TABLE IF NOT EXISTS curated_traces (
    pipeline_run_id VARCHAR NOT NULL,
    stage_run_id    VARCHAR NOT NULL,
    problem_id      VARCHAR NOT NULL,
    question        VARCHAR NOT NULL,
    answer          VARCHAR NOT NULL,
    language        VARCHAR NOT NULL,
    completion      VARCHAR NOT NULL,
    teacher_fault   VARCHAR,
    removed_by      VARCHAR,          -- NULL: kept
    kept            BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS curation_filters (
    pipeline_run_id VARCHAR NOT NULL,
    stage_run_id    VARCHAR NOT NULL,
    position        INTEGER NOT NULL, -- order in which the filter ran
    filter          VARCHAR NOT NULL,
    removed         INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS lineage (
    artifact        VARCHAR NOT NULL, -- a path or registered name
    kind            VARCHAR NOT NULL, -- problems | dataset | model | eval
    digest          VARCHAR NOT NULL,
    stage           VARCHAR NOT NULL,
    produced_by     VARCHAR NOT NULL, -- MLflow run id of the stage
    inputs          VARCHAR NOT NULL, -- JSON list of {digest, run}: each input and its producer
    created_at      TIMESTAMP NOT NULL
);
"""


LOCK_WAIT_ENV = "R1_DUCKDB_LOCK_WAIT"
DEFAULT_LOCK_WAIT = 5.0  # seconds: longer than a store call of the pipeline or a quick look
_HOLDER = re.compile(r"Conflicting lock is held in (?P<program>.*?) \(PID (?P<pid>\d+)\)")


class StoreLockedError(RuntimeError):
    """Another process held the DuckDB file for longer than the wait allows."""

    def __init__(self, path: Path, waited: float, holder_pid: int | None, holder: str):
        self.path, self.waited, self.holder_pid, self.holder = path, waited, holder_pid, holder
        who = f"process {holder_pid} ({holder})" if holder_pid is not None else "another process"
        super().__init__(
            f"DuckDB file {path} is locked by {who} and was still locked after {waited:g} s. "
            "DuckDB lets one process at a time write a file (and no other process read it "
            f"meanwhile): stop or close that process, or set {LOCK_WAIT_ENV} to wait longer"
        )

    def __reduce__(self):  # keeps the error picklable (Prefect stores a failed task's error)
        return (type(self), (self.path, self.waited, self.holder_pid, self.holder))


def lock_wait_seconds() -> float:
    """How long `connect` waits for a file another process holds: `R1_DUCKDB_LOCK_WAIT`."""
    return env_seconds(LOCK_WAIT_ENV, DEFAULT_LOCK_WAIT)


def _lock_holder(err: duckdb.Error) -> tuple[int | None, str] | None:
    """(PID, program) of the process holding the file, from DuckDB's message; None when the error
    is not a lock conflict. The PID is None when DuckDB does not name one."""
    message = str(err)
    if "Could not set lock on file" not in message:
        return None
    found = _HOLDER.search(message)
    if found is None:
        return None, "unknown"
    return int(found["pid"]), found["program"]


def open_database(path: Path, wait: float | None = None) -> duckdb.DuckDBPyConnection:
    """Open `path` for writing, retrying while another process holds it, for at most `wait`
    seconds (default `lock_wait_seconds()`); then StoreLockedError."""
    wait = lock_wait_seconds() if wait is None else wait
    deadline, pause = time.monotonic() + wait, 0.05
    while True:
        try:
            return duckdb.connect(str(path))
        except duckdb.IOException as err:
            holder = _lock_holder(err)
            left = deadline - time.monotonic()
            if holder is None:
                raise
            if left <= 0:
                raise StoreLockedError(path, wait, *holder) from None
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.5)


@contextmanager
def connect(path: Path, schema: str = SCHEMA) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection that exists only for the block, with `schema`'s tables created. A file held
    by another process is waited for, then refused with StoreLockedError (see `open_database`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = open_database(path)
    try:
        con.execute(schema)
        yield con
    finally:
        con.close()


def write_curation(
    db: Path,
    pipeline_run_id: str,
    stage_run_id: str,
    candidates_parquet: Path,
    filter_counts: dict[str, int],
) -> None:
    """Store every candidate trace and the per-filter counts; a retry replaces, never doubles."""
    with connect(db) as con:
        con.execute("BEGIN")
        for table in ("curated_traces", "curation_filters"):
            con.execute(f"DELETE FROM {table} WHERE stage_run_id = ?", [stage_run_id])
        con.execute(
            """
            INSERT INTO curated_traces
            SELECT ?, ?, problem_id, question, answer, language, completion,
                   teacher_fault, removed_by, removed_by IS NULL
            FROM read_parquet(?)
            """,
            [pipeline_run_id, stage_run_id, str(candidates_parquet)],
        )
        con.executemany(
            "INSERT INTO curation_filters VALUES (?, ?, ?, ?, ?)",
            [
                [pipeline_run_id, stage_run_id, i, name, n]
                for i, (name, n) in enumerate(filter_counts.items())
            ],
        )
        con.execute("COMMIT")


def record_lineage(
    db: Path,
    artifact: str,
    kind: str,
    digest: str,
    stage: str,
    produced_by: str,
    inputs: Sequence[str | InputRef],
) -> None:
    """Record that the run `produced_by` made `artifact` from `inputs`.

    An input given as a bare digest (a problem file) is pinned now to the run of its latest row;
    a model or dataset another stage made is given with its run (`InputRef`), so identical bytes
    from two stages stay two links of the chain.
    """
    with connect(db) as con:
        refs = [_pinned(con, ref) for ref in inputs]
        con.execute(
            "DELETE FROM lineage WHERE artifact = ? AND produced_by = ?", [artifact, produced_by]
        )
        con.execute(
            "INSERT INTO lineage VALUES (?, ?, ?, ?, ?, ?, ?)",
            [artifact, kind, digest, stage, produced_by, json.dumps(refs), datetime.now(UTC)],
        )


def _pinned(con: duckdb.DuckDBPyConnection, ref: str | InputRef) -> dict[str, str | None]:
    if isinstance(ref, InputRef):
        return ref.to_json()
    found = con.execute(
        "SELECT produced_by FROM lineage WHERE digest = ? ORDER BY created_at DESC LIMIT 1", [ref]
    ).fetchone()
    return InputRef(ref, found[0] if found else None).to_json()
