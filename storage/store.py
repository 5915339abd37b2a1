"""The DuckDB store: curated traces with their filter verdicts, filter counts, and lineage.

DuckDB allows one writing process per file, and while it writes no other process may even read
it. So every function opens, writes and closes within the call; nothing holds a connection.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import duckdb

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
    inputs          VARCHAR NOT NULL, -- JSON list of input digests
    created_at      TIMESTAMP NOT NULL
);
"""


@contextmanager
def connect(path: Path, schema: str = SCHEMA) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection that exists only for the block, with `schema`'s tables created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
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
    db: Path, artifact: str, kind: str, digest: str, stage: str, produced_by: str, inputs: list[str]
) -> None:
    with connect(db) as con:
        con.execute(
            "DELETE FROM lineage WHERE artifact = ? AND produced_by = ?", [artifact, produced_by]
        )
        con.execute(
            "INSERT INTO lineage VALUES (?, ?, ?, ?, ?, ?, ?)",
            [artifact, kind, digest, stage, produced_by, json.dumps(inputs), datetime.now(UTC)],
        )
