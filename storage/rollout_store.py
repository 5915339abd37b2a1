"""Stage 4's rollout store: every sampled completion with its rewards (filtered by storage.funnel).

Rejection sampling draws G completions per prompt from model_2, scores them, and keeps the best
few per prompt. Sampling is the expensive part and may be killed at any time, so the store is
built to resume: inserts are idempotent on (prompt_id, sample_index, model_id), each chunk lands in
one transaction (all or nothing), and `existing_samples` tells a restarted sampler what it may skip.

Rewards are not a fixed set (a profile may add one), so each reward is a column `reward_<name>`
added on first sight. NULL in a reward column means the reward could not verify that sample, as in
the reward contract (None); a filter that needs the reward treats NULL as "not shown to pass".

DuckDB allows one writing process per file, so, as in storage.store, every function opens, works
and closes within the call; nothing holds a connection.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from storage import store

OPTIONAL_COLUMNS = frozenset({"created_at", "reward_total", "family"})
KEY = ("prompt_id", "sample_index", "model_id")
REWARD_PREFIX = "reward_"
TOTAL = "reward_total"

# Reward columns are interpolated into SQL as identifiers; this pattern is what makes that safe.
_REWARD_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    prompt_id         VARCHAR NOT NULL,
    sample_index      INTEGER NOT NULL,
    model_id          VARCHAR NOT NULL,
    kind              VARCHAR NOT NULL CHECK (kind IN ('reasoning', 'general')),
    family            VARCHAR,          -- reasoning: math, code or logic (NULL: math)
    language          VARCHAR,
    prompt            VARCHAR NOT NULL,
    completion        VARCHAR NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER NOT NULL,
    finish_reason     VARCHAR NOT NULL CHECK (finish_reason IN ('stop', 'length')),
    created_at        TIMESTAMP NOT NULL,
    reward_total      DOUBLE,
    PRIMARY KEY (prompt_id, sample_index, model_id)
);
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS family VARCHAR;
CREATE TABLE IF NOT EXISTS rejection_kept (
    run_id        VARCHAR NOT NULL,
    model_id      VARCHAR NOT NULL,
    prompt_id     VARCHAR NOT NULL,
    sample_index  INTEGER NOT NULL,
    rank          INTEGER NOT NULL  -- 1 = best kept sample of its prompt
);
CREATE TABLE IF NOT EXISTS rejection_funnel (
    run_id     VARCHAR NOT NULL,
    model_id   VARCHAR NOT NULL,
    position   INTEGER NOT NULL,    -- order in which the filter ran
    filter     VARCHAR NOT NULL,
    rows_in    BIGINT NOT NULL,
    rows_out   BIGINT NOT NULL,
    created_at TIMESTAMP NOT NULL
);
"""


class MissingRewardColumn(LookupError):
    """A filter needs a reward that no stored rollout was scored with."""


@contextmanager
def connect(db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with store.connect(db, SCHEMA) as con:
        yield con


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """All or nothing: a killed process leaves no commit in the WAL, so DuckDB drops the work."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def reward_column(name: str) -> str:
    """The column of reward `name`, refusing anything that is not a plain identifier."""
    if not _REWARD_NAME.fullmatch(name) or name == "total":
        raise ValueError(
            f"bad reward name {name!r}: use lowercase letters, digits and '_', starting with a "
            "letter, at most 48 characters, and not 'total'"
        )
    return REWARD_PREFIX + name


def table_columns(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The rollouts table's columns and their types: the table, not a copy of it, is the schema."""
    return dict(
        con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'rollouts' "
            "AND database_name = current_database() AND schema_name = 'main' ORDER BY column_index"
        ).fetchall()
    )


def reward_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The per-reward columns (reward_total excluded), sorted by name."""
    return sorted(c for c in table_columns(con) if c.startswith(REWARD_PREFIX) and c != TOTAL)


def _incoming_columns(columns: list[str], stored: dict[str, str]) -> dict[str, str]:
    """The incoming columns with their types; a missing required column, an unknown column or a
    bad reward name is refused rather than dropped."""
    base = [c for c in stored if not c.startswith(REWARD_PREFIX) or c == TOTAL]
    missing = set(base) - OPTIONAL_COLUMNS - set(columns)
    if missing:
        raise ValueError(f"rollouts lack required columns {sorted(missing)}")
    unknown = [c for c in columns if c not in base and not c.startswith(REWARD_PREFIX)]
    if unknown:
        raise ValueError(f"unknown rollout columns {unknown}; rewards are named reward_<name>")
    for column in columns:
        if column not in base:
            reward_column(column.removeprefix(REWARD_PREFIX))
    return {c: stored.get(c, "DOUBLE") for c in columns}


def first_of_each_key(rows: pa.Table) -> pa.Table:
    """A chunk may repeat a key (a resent sample); the first occurrence wins, as if the rows went
    in one at a time. Cheap in Arrow, and it lets the insert skip a costly ON CONFLICT check."""
    keys = rows.select(list(KEY)).append_column("row", pa.array(np.arange(rows.num_rows)))
    first = keys.group_by(list(KEY), use_threads=False).aggregate([("row", "min")])
    if first.num_rows == rows.num_rows:
        return rows
    return rows.take(np.sort(first["row_min"].to_numpy()))


def insert_rollouts(db: Path, rows: pa.Table) -> int:
    """Insert a chunk of rollouts from Arrow and return how many were new.

    A row whose key is already stored is skipped (so a resumed sampler may resend a chunk),
    and the chunk commits as one transaction. `created_at` defaults to now (UTC), a missing
    `reward_total` or reward column to NULL; a new reward column is added to the table.
    Skipping is an anti-join rather than ON CONFLICT DO NOTHING, which is twice as slow here.
    """
    same = " AND ".join(f"r.{k} = i.{k}" for k in KEY)
    with connect(db) as con, transaction(con):
        stored = table_columns(con)
        typed = _incoming_columns(rows.column_names, stored)
        for column in typed.keys() - stored.keys():
            con.execute(f"ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS {column} DOUBLE")
        values = {c: f"CAST(i.{c} AS {t})" for c, t in typed.items()}
        # created_at defaults to (and a NULL one becomes) the time of this insert
        values["created_at"] = f"coalesce({values.get('created_at', 'NULL')}, $now::TIMESTAMP)"
        con.register("incoming_rollouts", first_of_each_key(rows))
        (inserted,) = con.execute(
            f"INSERT INTO rollouts ({', '.join(values)}) SELECT {', '.join(values.values())} "
            f"FROM incoming_rollouts i WHERE NOT EXISTS (SELECT 1 FROM rollouts r WHERE {same})",
            {"now": datetime.now(UTC).replace(tzinfo=None)},
        ).fetchone()
        con.unregister("incoming_rollouts")
    return int(inserted)


def existing_samples(db: Path, model_id: str) -> dict[str, set[int]]:
    """Which sample indices are already stored per prompt for `model_id`: what a resumed
    sampler must not generate again."""
    with connect(db) as con:
        rows = con.execute(
            "SELECT prompt_id, list(sample_index) FROM rollouts WHERE model_id = ? "
            "GROUP BY prompt_id",
            [model_id],
        ).fetchall()
    return {prompt_id: set(indices) for prompt_id, indices in rows}


def missing_samples(
    existing: dict[str, set[int]], prompt_ids: Iterable[str], n: int
) -> dict[str, list[int]]:
    """The sample indices 0..n-1 still to draw per prompt; prompts already complete are left out."""
    todo = {p: [i for i in range(n) if i not in existing.get(p, ())] for p in prompt_ids}
    return {p: indices for p, indices in todo.items() if indices}


def count_rollouts(db: Path, model_id: str) -> int:
    with connect(db) as con:
        (n,) = con.execute(
            "SELECT count(*) FROM rollouts WHERE model_id = ?", [model_id]
        ).fetchone()
    return int(n)


# --- the filter funnel ---------------------------------------------------------------------------
