"""Evaluation history: every evaluation of a registered model, one row per metric, in DuckDB.

A scheduled evaluation of `models:/NAME@ALIAS` appends its figures here and compares them with
the latest earlier evaluation of the same alias with the same settings that did not regress
(evaluation/verdict.py), whichever version the alias pointed at then. The settings are kept in
`eval_settings`, one row per setting; an evaluation recorded before they were has none there, and
its settings are unknown. Each evaluation's verdict is kept in `eval_verdicts` (`ok`,
`regression`, `settings-differ`); one recorded before verdicts were has none there.
Connections are opened and closed within each call (see storage/store.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from storage.store import connect

SCHEMA = """
CREATE TABLE IF NOT EXISTS eval_history (
    evaluated_at    TIMESTAMP NOT NULL,
    model_name      VARCHAR NOT NULL,
    alias           VARCHAR NOT NULL,
    version         VARCHAR NOT NULL,
    model_digest    VARCHAR NOT NULL,
    mlflow_run_id   VARCHAR NOT NULL, -- the evaluation run
    source_run_id   VARCHAR NOT NULL, -- the run that produced the model
    metric          VARCHAR NOT NULL,
    value           DOUBLE NOT NULL
);
CREATE TABLE IF NOT EXISTS eval_settings (
    mlflow_run_id   VARCHAR NOT NULL, -- the evaluation run
    setting         VARCHAR NOT NULL,
    value           VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS eval_verdicts (
    mlflow_run_id   VARCHAR NOT NULL, -- the evaluation run
    verdict         VARCHAR NOT NULL  -- ok, regression or settings-differ
);
"""
TABLES = ("eval_history", "eval_settings", "eval_verdicts")  # each keyed by the evaluation run
REGRESSION = "regression"  # the verdict of an evaluation that fell below the one it was held to

# A drop larger than the allowance by less than this is rounding, not a regression.
TOLERANCE = 1e-9


@dataclass(frozen=True)
class Evaluation:
    """One recorded evaluation of a registered model version under an alias."""

    evaluated_at: datetime
    model_name: str
    alias: str
    version: str
    model_digest: str
    mlflow_run_id: str
    source_run_id: str
    metrics: dict[str, float]
    settings: dict[str, str] | None = None  # None: recorded before settings were (unknown)
    verdict: str | None = None  # None: recorded before verdicts were

    @property
    def regressed(self) -> bool:
        """Whether it fell below the evaluation it was held to: no baseline for later ones."""
        return self.verdict == REGRESSION


def append(
    db: Path,
    model_name: str,
    alias: str,
    version: str,
    model_digest: str,
    mlflow_run_id: str,
    source_run_id: str,
    metrics: dict[str, float],
    evaluated_at: datetime | None = None,
    settings: dict[str, str] | None = None,
    verdict: str | None = None,
) -> datetime:
    """Store one evaluation's metrics, settings and verdict; a retry of the same run replaces
    its rows, never doubles.

    Returns the time recorded (now, in UTC, unless `evaluated_at` is given).
    """
    when = evaluated_at or datetime.now(UTC).replace(tzinfo=None)
    rows = [
        [when, model_name, alias, version, model_digest, mlflow_run_id, source_run_id, k, float(v)]
        for k, v in metrics.items()
    ]
    with connect(db, SCHEMA) as con:
        con.execute("BEGIN")
        for table in TABLES:
            con.execute(f"DELETE FROM {table} WHERE mlflow_run_id = ?", [mlflow_run_id])
        if rows:
            con.executemany("INSERT INTO eval_history VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        if settings:
            con.executemany(
                "INSERT INTO eval_settings VALUES (?, ?, ?)",
                [[mlflow_run_id, name, value] for name, value in sorted(settings.items())],
            )
        if verdict is not None:
            con.execute("INSERT INTO eval_verdicts VALUES (?, ?)", [mlflow_run_id, verdict])
        con.execute("COMMIT")
    return when


def latest_before(
    db: Path, model_name: str, alias: str, before_run_id: str | None = None
) -> Evaluation | None:
    """The latest evaluation of `model_name@alias` recorded before the run `before_run_id`
    (before any time when that run is not recorded), or None when there is none."""
    with connect(db, SCHEMA) as con:
        found = con.execute(
            """
            WITH cutoff AS (
                SELECT min(evaluated_at) AS at FROM eval_history WHERE mlflow_run_id = ?
            )
            SELECT evaluated_at, version, model_digest, mlflow_run_id, source_run_id
            FROM eval_history, cutoff
            WHERE model_name = ? AND alias = ? AND mlflow_run_id IS DISTINCT FROM ?
              AND (cutoff.at IS NULL OR evaluated_at < cutoff.at)
            ORDER BY evaluated_at DESC
            LIMIT 1
            """,
            [before_run_id, model_name, alias, before_run_id],
        ).fetchone()
        if found is None:
            return None
        at, version, digest, run_id, source = found
        metrics = dict(
            con.execute(
                "SELECT metric, value FROM eval_history WHERE mlflow_run_id = ? ORDER BY metric",
                [run_id],
            ).fetchall()
        )
    return Evaluation(at, model_name, alias, version, digest, run_id, source, metrics)


def previous(
    db: Path, model_name: str, alias: str, before_run_id: str | None = None
) -> dict[str, float] | None:
    """The metrics of the latest earlier evaluation of `model_name@alias`, or None."""
    found = latest_before(db, model_name, alias, before_run_id)
    return None if found is None else found.metrics


def history(db: Path, model_name: str, alias: str | None = None) -> list[Evaluation]:
    """Every recorded evaluation of `model_name` (of one alias when given), oldest first, with
    its settings and verdict (None where none were recorded)."""
    with connect(db, SCHEMA) as con:
        rows = con.execute(
            """
            SELECT evaluated_at, alias, version, model_digest, mlflow_run_id, source_run_id,
                   metric, value
            FROM eval_history
            WHERE model_name = ? AND (? IS NULL OR alias = ?)
            ORDER BY evaluated_at, mlflow_run_id, metric
            """,
            [model_name, alias, alias],
        ).fetchall()
        settings = con.execute(
            """
            SELECT mlflow_run_id, setting, value FROM eval_settings
            WHERE mlflow_run_id IN (SELECT mlflow_run_id FROM eval_history WHERE model_name = ?)
            ORDER BY setting
            """,
            [model_name],
        ).fetchall()
        verdicts = dict(
            con.execute(
                """
                SELECT mlflow_run_id, verdict FROM eval_verdicts
                WHERE mlflow_run_id IN (
                    SELECT mlflow_run_id FROM eval_history WHERE model_name = ?
                )
                """,
                [model_name],
            ).fetchall()
        )
    recorded: dict[str, dict[str, str]] = {}
    for run_id, name, value in settings:
        recorded.setdefault(run_id, {})[name] = value
    runs: dict[str, Evaluation] = {}
    for *head, metric, value in rows:
        at, run_alias, version, digest, run_id, source = head
        found = runs.setdefault(
            run_id,
            Evaluation(
                at,
                model_name,
                run_alias,
                version,
                digest,
                run_id,
                source,
                {},
                recorded.get(run_id),
                verdicts.get(run_id),
            ),
        )
        found.metrics[metric] = value
    return list(runs.values())


def earlier(db: Path, model_name: str, alias: str, run_id: str) -> list[Evaluation]:
    """Every evaluation of `model_name@alias` recorded before the run `run_id` (all of them when
    that run is not recorded), newest first."""
    runs = history(db, model_name, alias)
    cutoff = next((e.evaluated_at for e in runs if e.mlflow_run_id == run_id), None)
    return [
        e
        for e in reversed(runs)
        if e.mlflow_run_id != run_id and (cutoff is None or e.evaluated_at < cutoff)
    ]


def regressions(
    previous: dict[str, float], current: dict[str, float], max_drop: dict[str, float]
) -> list[str]:
    """One line per watched metric that fell by more than its allowed drop; metrics missing on
    either side are not compared. A drop of exactly the allowance passes."""
    lines = []
    for metric, allowed in max_drop.items():
        if metric not in previous or metric not in current:
            continue
        before, now = previous[metric], current[metric]
        if before - now > allowed + TOLERANCE:
            lines.append(
                f"{metric} fell from {before:.3f} to {now:.3f} (allowed drop {allowed:.3f})"
            )
    return lines
