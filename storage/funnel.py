"""The rejection funnel: SQL filters over the stored rollouts (storage.rollout_store), each
counting the rows it removed, and the kept set exported as Parquet and a Hugging Face dataset."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from configs.schema import FunnelConfig
from problems.types import FAMILY_REWARDS
from storage.digests import rows_digest
from storage.rollout_store import (
    REWARD_PREFIX,
    TOTAL,
    MissingRewardColumn,
    connect,
    reward_column,
    reward_columns,
    transaction,
)

FILTERS = ("length", "correct", "well_formed", "single_language", "general_score", "dedup", "top_k")
# Best first: highest total reward, then the shorter completion, then the earlier sample.
_BEST_FIRST = "reward_total DESC NULLS LAST, completion_tokens ASC, sample_index ASC"
# Lowercase, every run of (ASCII) whitespace made one space, stripped. The pattern matches only
# runs of two or more and lone non-space characters, which gives the same text as '\s+' -> ' '
# but leaves ordinary single spaces alone, and is about three times faster in DuckDB.
_WHITESPACE = r"'[ \t\n\v\f\r]{2,}|[\t\n\v\f\r]'"
NORMALISED_COMPLETION = f"trim(regexp_replace(lower(completion), {_WHITESPACE}, ' ', 'g'))"


@dataclass(frozen=True)
class FilterCount:
    name: str
    rows_in: int
    rows_out: int

    @property
    def removed(self) -> int:
        return self.rows_in - self.rows_out


@dataclass(frozen=True)
class Funnel:
    run_id: str
    model_id: str
    filters: tuple[FilterCount, ...]
    kept: int


def correct_sql(families: Iterable[str]) -> tuple[str, list[str]]:
    """The SQL condition that a reasoning row is correct by its family's verifier (a NULL family
    is math), and the reward columns it reads."""
    columns = {f: reward_column(FAMILY_REWARDS[f]) for f in sorted(set(families))}
    if not columns:
        columns = {"math": reward_column(FAMILY_REWARDS["math"])}
    cases = " ".join(f"WHEN '{f}' THEN {c}" for f, c in columns.items())
    verdict = f"CASE coalesce(family, 'math') {cases} END"
    return f"kind <> 'reasoning' OR {verdict} >= 1", list(columns.values())


def row_filters(
    spec: FunnelConfig, families: Iterable[str] = ("math",)
) -> list[tuple[str, str, list[str]]]:
    """(filter, SQL condition a row must meet, reward columns it needs) for the enabled per-row
    filters, in funnel order. Thresholds are bound as $parameters, never formatted in; the
    `correct` filter reads the verifier of each reasoning family present (`families`)."""
    length = "completion_tokens BETWEEN $min_tokens AND $max_tokens AND finish_reason = 'stop'"
    correct, verifiers = correct_sql(families)
    general = "kind <> 'general' OR reward_preference >= $min_general_score"
    every = [
        ("length", True, length, []),
        ("correct", spec.require_correct, correct, verifiers),
        ("well_formed", spec.require_well_formed, "reward_format >= 1", ["reward_format"]),
        (
            "single_language",
            spec.min_language_share is not None,
            "reward_language >= $min_language_share",
            ["reward_language"],
        ),
        ("general_score", spec.min_general_score is not None, general, ["reward_preference"]),
    ]
    return [(name, cond, columns) for name, on, cond, columns in every if on]


def _check_columns(
    con: duckdb.DuckDBPyConnection, filters: list[tuple[str, str, list[str]]]
) -> None:
    present = reward_columns(con)
    for name, _, columns in filters:
        for column in columns:
            if column not in present:
                raise MissingRewardColumn(
                    f"filter {name!r} needs column {column!r}, but no stored rollout was scored "
                    f"with reward {column.removeprefix(REWARD_PREFIX)!r} (reward columns: "
                    f"{present}); score the rollouts with it or disable the filter in the "
                    "FunnelConfig"
                )


def _verdict_sql(spec: FunnelConfig, filters: list[tuple[str, str, list[str]]]) -> str:
    """One pass over the model's rollouts: each row gets the first filter that removed it
    (NULL: kept). NULL conditions (an unverified reward) count as failing."""
    whens = " ".join(f"WHEN NOT coalesce({cond}, false) THEN '{name}'" for name, cond, _ in filters)
    copy_key = NORMALISED_COMPLETION if spec.dedup else "CAST(sample_index AS VARCHAR)"
    return f"""
    CREATE OR REPLACE TEMP TABLE funnel_rows AS
    WITH verdict AS (
        SELECT prompt_id, sample_index, completion_tokens, reward_total,
               CASE {whens} END AS removed_by,
               CASE WHEN removed_by IS NULL THEN {copy_key} END AS copy_key
        FROM rollouts WHERE model_id = $model_id
    ), copies AS (
        SELECT *, row_number() OVER (PARTITION BY prompt_id, copy_key ORDER BY {_BEST_FIRST})
               AS copy_rank
        FROM verdict WHERE removed_by IS NULL
    ), ranked AS (
        SELECT *, row_number() OVER (PARTITION BY prompt_id ORDER BY {_BEST_FIRST}) AS rank
        FROM copies WHERE copy_rank = 1
    )
    SELECT prompt_id, sample_index, removed_by, NULL::INTEGER AS rank
        FROM verdict WHERE removed_by IS NOT NULL
    UNION ALL SELECT prompt_id, sample_index, 'dedup', NULL FROM copies WHERE copy_rank > 1
    UNION ALL SELECT prompt_id, sample_index,
                     CASE WHEN rank > CAST($top_k AS BIGINT) THEN 'top_k' END, rank
        FROM ranked
    """


def _chain(total: int, removed: dict[str | None, int]) -> tuple[FilterCount, ...]:
    counts, rows_in = [], total
    for name in FILTERS:
        rows_out = rows_in - removed.get(name, 0)
        counts.append(FilterCount(name, rows_in, rows_out))
        rows_in = rows_out
    return tuple(counts)


def run_funnel(db: Path, model_id: str, spec: FunnelConfig, run_id: str) -> Funnel:
    """Filter the rollouts of `model_id` and record the kept keys and the counts under `run_id`.

    A rerun with the same run_id replaces that run's rows, so a retried task never doubles them.
    """
    params = {
        "model_id": model_id,
        "min_tokens": spec.min_completion_tokens,
        "max_tokens": spec.max_completion_tokens,
        "min_language_share": spec.min_language_share,
        "min_general_score": spec.min_general_score,
        "top_k": spec.top_k,
    }
    with connect(db) as con, transaction(con):
        families = [
            f
            for (f,) in con.execute(
                "SELECT DISTINCT coalesce(family, 'math') FROM rollouts "
                "WHERE model_id = ? AND kind = 'reasoning'",
                [model_id],
            ).fetchall()
            if f in FAMILY_REWARDS
        ]
        filters = row_filters(spec, families)
        sql = _verdict_sql(spec, filters)
        _check_columns(con, filters)
        con.execute(sql, {k: v for k, v in params.items() if f"${k}" in sql})
        removed = dict(
            con.execute("SELECT removed_by, count(*) FROM funnel_rows GROUP BY 1").fetchall()
        )
        funnel = Funnel(
            run_id, model_id, _chain(sum(removed.values()), removed), removed.get(None, 0)
        )
        for table in ("rejection_kept", "rejection_funnel"):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        con.execute(
            "INSERT INTO rejection_kept SELECT ?, ?, prompt_id, sample_index, rank "
            "FROM funnel_rows WHERE removed_by IS NULL",
            [run_id, model_id],
        )
        now = datetime.now(UTC).replace(tzinfo=None)
        con.executemany(
            "INSERT INTO rejection_funnel VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                [run_id, model_id, i, f.name, f.rows_in, f.rows_out, now]
                for i, f in enumerate(funnel.filters)
            ],
        )
        con.execute("DROP TABLE funnel_rows")
    return funnel


# --- export --------------------------------------------------------------------------------------

EXPORT_COLUMNS = ("prompt_id", "sample_index", "kind", "family", "language", "prompt", "completion")


def kept_table(db: Path, run_id: str) -> pa.Table:
    """The kept rows of a funnel run, ordered by (prompt_id, sample_index); reward columns are
    all the store's, sorted by name, then reward_total, so the layout never depends on the order
    in which rewards first appeared."""
    with connect(db) as con:
        (runs,) = con.execute(
            "SELECT count(*) FROM rejection_funnel WHERE run_id = ?", [run_id]
        ).fetchone()
        if not runs:
            raise LookupError(f"no funnel run {run_id!r} in {db}; run_funnel first")
        columns = [*EXPORT_COLUMNS, "completion_tokens", *reward_columns(con), TOTAL]
        return con.sql(
            f"SELECT {', '.join(f'r.{c}' for c in columns)} FROM rejection_kept k "
            "JOIN rollouts r USING (prompt_id, sample_index, model_id) "
            "WHERE k.run_id = $run_id ORDER BY r.prompt_id, r.sample_index",
            params={"run_id": run_id},
        ).to_arrow_table()


def export_kept(db: Path, run_id: str, parquet_path: Path, hf_dir: Path) -> str:
    """Write the kept set as Parquet and as a `datasets` folder; return its content digest.

    The digest is storage.digests.rows_digest over the rows in export order, so it equals
    rows_digest(load_from_disk(hf_dir)) and does not depend on file metadata or library versions.
    """
    from datasets import Dataset  # heavy import, needed only here

    table = kept_table(db, run_id)
    parquet_path.parent.mkdir(parents=True, exist_ok=True)
    partial = parquet_path.with_name(parquet_path.name + ".partial")
    pq.write_table(table, partial)
    os.replace(partial, parquet_path)
    if (hf_dir / "state.json").exists():  # an earlier export: replace it, never merge into it
        shutil.rmtree(hf_dir)
    Dataset(table).save_to_disk(str(hf_dir))
    return rows_digest(row for batch in table.to_batches() for row in batch.to_pylist())
