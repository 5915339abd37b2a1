"""Lineage chains: from an artifact back through the inputs each stage run recorded.

Reads the DuckDB `lineage` table that `store.record_lineage` writes (one row per artifact a stage
run produced, with its inputs). An input names its digest and the run that produced it, so a chain
follows runs, not content: two stages that produce identical bytes (a GRPO stage that changed no
weight) are still two links. Rows written before inputs named their run hold bare digests; those
take the digest's latest row. The file is opened read-only and only for the call, so a chain can be
read while no pipeline writes, and never blocks one that starts afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

UNKNOWN = "unknown"

_COLUMNS = "artifact, kind, digest, stage, produced_by, inputs, created_at"


@dataclass(frozen=True)
class InputRef:
    """An input of a stage run: its content digest and the run that produced it (None: not known,
    the digest's latest row stands in)."""

    digest: str
    run: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"digest": self.digest, "run": self.run}

    @classmethod
    def from_json(cls, value: str | dict[str, Any]) -> InputRef:
        if isinstance(value, str):  # rows written before inputs named their run
            return cls(value)
        return cls(value["digest"], value.get("run"))


class LineageError(Exception):
    """The lineage table cannot be read: no DuckDB file, no table, or a pipeline writing it."""


class LineageGone(LineageError):
    """No DuckDB file, or no lineage table in it: none was made, or it was deleted."""


@dataclass(frozen=True)
class LineageRow:
    """One row of the lineage table: an artifact, the stage run that produced it, its inputs."""

    artifact: str
    kind: str
    digest: str
    stage: str
    produced_by: str
    inputs: tuple[InputRef, ...]
    created_at: datetime


@dataclass(frozen=True)
class LineageNode:
    """An artifact in a chain; `children` are the artifacts its stage read, recursively.

    An input no stage recorded is a leaf of kind `unknown`; an input that leads back to a row
    already on the path from the root is a leaf with `cycle` set.
    """

    digest: str
    kind: str = UNKNOWN
    stage: str = ""
    artifact: str = ""
    produced_by: str = ""
    children: tuple[LineageNode, ...] = field(default=())
    cycle: bool = False

    @property
    def known(self) -> bool:
        return self.kind != UNKNOWN

    def walk(self) -> Iterator[LineageNode]:
        """This node and every node below it, depth first (shared inputs once per path)."""
        yield self
        for child in self.children:
            yield from child.walk()

    def leaves(self) -> list[LineageNode]:
        return [node for node in self.walk() if not node.children]

    def run_ids(self) -> set[str]:
        return {node.produced_by for node in self.walk() if node.produced_by}

    def to_dict(self, run_names: dict[str, str] | None = None) -> dict[str, Any]:
        """The chain as plain JSON values; `run_names` adds each producing run's name."""
        names = run_names or {}
        out: dict[str, Any] = {
            "digest": self.digest,
            "kind": self.kind,
            "stage": self.stage or None,
            "artifact": self.artifact or None,
            "run_id": self.produced_by or None,
            "run_name": names.get(self.produced_by),
            "known": self.known,
        }
        if self.cycle:
            out["cycle"] = True
        out["inputs"] = [child.to_dict(names) for child in self.children]
        return out


@contextmanager
def read_only(db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the state's DuckDB file that exists only for the block."""
    if not db.is_file():
        raise LineageGone(f"no DuckDB file at {db}")
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.IOException as err:
        raise LineageError(f"cannot open {db} (is a pipeline writing it?): {err}") from err
    try:
        yield con
    finally:
        con.close()


def _row(values: tuple) -> LineageRow:
    artifact, kind, digest, stage, produced_by, inputs, created_at = values
    refs = tuple(InputRef.from_json(value) for value in json.loads(inputs))
    return LineageRow(artifact, kind, digest, stage, produced_by, refs, created_at)


def _query(db: Path, sql: str, params: list[Any] | None = None) -> list[LineageRow]:
    with read_only(db) as con:
        try:
            found = con.execute(sql, params or []).fetchall()
        except duckdb.CatalogException as err:
            raise LineageGone(f"{db} has no lineage table") from err
    return [_row(values) for values in found]


class Rows:
    """The lineage table, indexed for lookups: an input names (digest, run), a bare digest takes
    that digest's latest row."""

    def __init__(self, rows: list[LineageRow]):
        rows = sorted(rows, key=lambda row: row.created_at)
        self.by_run = {(row.digest, row.produced_by): row for row in rows}
        self.latest = {row.digest: row for row in rows}

    def find(self, ref: InputRef) -> LineageRow | None:
        if ref.run is not None:
            return self.by_run.get((ref.digest, ref.run))
        return self.latest.get(ref.digest)


def all_rows(db: Path) -> Rows:
    return Rows(_query(db, f"SELECT {_COLUMNS} FROM lineage"))


def latest_rows(db: Path) -> dict[str, LineageRow]:
    """Each digest's most recent row: repeated runs record the same content more than once."""
    return all_rows(db).latest


def produced_by(db: Path, run_id: str, kind: str = "model") -> LineageRow | None:
    """The latest `kind` row a stage run recorded (a stage run registers one model)."""
    rows = _query(
        db,
        f"SELECT {_COLUMNS} FROM lineage WHERE produced_by = ? AND kind = ? "
        "ORDER BY created_at DESC LIMIT 1",
        [run_id, kind],
    )
    return rows[0] if rows else None


def build_tree(
    ref: InputRef,
    rows: Rows,
    ancestors: frozenset[tuple[str, str]] = frozenset(),
) -> LineageNode:
    """The chain below the artifact `ref` names; a row already on the path is a cycle leaf."""
    row = rows.find(ref)
    if row is None:
        return LineageNode(ref.digest, produced_by=ref.run or "")
    key = (row.digest, row.produced_by)
    if key in ancestors:
        return LineageNode(ref.digest, cycle=True, **_fields(row))
    below = ancestors | {key}
    children = tuple(build_tree(child, rows, below) for child in row.inputs)
    return LineageNode(ref.digest, children=children, **_fields(row))


def _fields(row: LineageRow) -> dict[str, str]:
    return {
        "kind": row.kind,
        "stage": row.stage,
        "artifact": row.artifact,
        "produced_by": row.produced_by,
    }


def chain(db: Path, digest: str, run_id: str | None = None) -> LineageNode:
    """The chain from the artifact with `digest` back to the raw problems.

    With `run_id`, the root is the row that stage run recorded (the same content may come from
    several runs); without, the digest's latest row.
    """
    return build_tree(InputRef(digest, run_id), all_rows(db))
