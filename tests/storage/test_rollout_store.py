"""The stage-4 rollout store on real DuckDB files: idempotent resumable inserts, each funnel
filter on a hand-made table whose survivors are known, and a stable export digest."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from configs.schema import FunnelConfig
from storage.digests import rows_digest
from storage.funnel import FILTERS, NORMALISED_COMPLETION, export_kept, run_funnel
from storage.rollout_store import (
    MissingRewardColumn,
    count_rollouts,
    existing_samples,
    insert_rollouts,
    missing_samples,
)

REPO = Path(__file__).resolve().parents[2]
MODEL = "model_2"
# Every filter off: a test switches on the one it is about.
OFF = dict(
    min_completion_tokens=0,
    max_completion_tokens=10**6,
    require_correct=False,
    require_well_formed=False,
    min_language_share=None,
    min_general_score=None,
    dedup=False,
    top_k=None,
)


def rollout(prompt_id: str, sample_index: int, **overrides: object) -> dict:
    row = {
        "prompt_id": prompt_id,
        "sample_index": sample_index,
        "model_id": MODEL,
        "kind": "reasoning",
        "language": "en",
        "prompt": f"question {prompt_id}",
        "completion": f"<think>{prompt_id} {sample_index}</think><answer>4</answer>",
        "prompt_tokens": 8,
        "completion_tokens": 30,
        "finish_reason": "stop",
        "reward_accuracy": 1.0,
        "reward_format": 1.0,
        "reward_language": 1.0,
        "reward_preference": None,
        "reward_total": 2.0,
    }
    return row | overrides


def table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def spec(**on: object) -> FunnelConfig:
    return FunnelConfig(**(OFF | on))


def kept_after(tmp_path: Path, rows: list[dict], **on: object) -> set[tuple[str, int]]:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table(rows))
    run_funnel(db, MODEL, spec(**on), "run")
    with duckdb.connect(str(db)) as con:
        keys = con.execute("SELECT prompt_id, sample_index FROM rejection_kept").fetchall()
    return set(keys)


def stored_keys(db: Path) -> list[tuple]:
    with duckdb.connect(str(db)) as con:
        return con.execute("SELECT prompt_id, sample_index, model_id FROM rollouts").fetchall()


# --- inserts and resume ---------------------------------------------------------------------------


def test_same_chunk_twice_inserts_once(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    chunk = table([rollout("p1", i) for i in range(3)])
    assert insert_rollouts(db, chunk) == 3
    assert insert_rollouts(db, chunk) == 0
    assert count_rollouts(db, MODEL) == 3


def test_overlapping_chunks_and_in_chunk_duplicates(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    assert insert_rollouts(db, table([rollout("p1", i) for i in range(5)])) == 5
    assert insert_rollouts(db, table([rollout("p1", i) for i in range(3, 8)])) == 3
    chunk = [rollout("p2", 0, completion="first"), rollout("p2", 0, completion="second")]
    assert insert_rollouts(db, table(chunk)) == 1
    assert sorted(k[1] for k in stored_keys(db) if k[0] == "p1") == list(range(8))
    with duckdb.connect(str(db)) as con:
        got = con.execute("SELECT completion FROM rollouts WHERE prompt_id = 'p2'").fetchall()
    assert got == [("first",)]  # the first occurrence wins, as in a row-by-row insert
    assert count_rollouts(db, MODEL) == 9
    assert count_rollouts(db, "another_model") == 0


def test_same_key_under_another_model_is_a_new_row(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table([rollout("p1", 0)]))
    assert insert_rollouts(db, table([rollout("p1", 0, model_id="model_3")])) == 1
    assert existing_samples(db, "model_3") == {"p1": {0}}


def test_restart_inserts_exactly_the_union(tmp_path: Path) -> None:
    """The sampler wrote chunk 1 and was killed; the restart resends chunks 1..3."""
    db = tmp_path / "r.duckdb"
    chunks = [[rollout(f"p{c}{j}", i) for j in range(2) for i in range(4)] for c in range(3)]
    insert_rollouts(db, table(chunks[0]))
    existing = existing_samples(db, MODEL)
    todo = missing_samples(existing, [r["prompt_id"] for c in chunks for r in c], n=4)
    assert set(todo) == {f"p{c}{j}" for c in (1, 2) for j in range(2)}
    assert all(indices == [0, 1, 2, 3] for indices in todo.values())
    inserted = [insert_rollouts(db, table(chunk)) for chunk in chunks]
    assert inserted == [0, 8, 8]
    keys = stored_keys(db)
    assert len(keys) == len(set(keys)) == 24
    assert set(keys) == {(r["prompt_id"], r["sample_index"], MODEL) for c in chunks for r in c}


def test_missing_samples_fills_gaps() -> None:
    existing = {"a": {0, 2}, "b": {0, 1, 2}}
    assert missing_samples(existing, ["a", "b", "c"], n=3) == {"a": [1], "c": [0, 1, 2]}


def test_a_failing_chunk_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    bad = table([rollout("p1", 0), rollout("p1", 1, kind="poetry")])
    with pytest.raises(duckdb.ConstraintException):
        insert_rollouts(db, bad)
    assert count_rollouts(db, MODEL) == 0


def test_a_process_killed_mid_chunk_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table([rollout("p0", 0)]))
    killed = textwrap.dedent(
        f"""
        import datetime, os, pyarrow as pa
        from pathlib import Path
        from storage.rollout_store import connect, transaction
        rows = pa.Table.from_pylist({[rollout("p1", i) for i in range(4)]!r})
        rows = rows.append_column("created_at", pa.array([datetime.datetime(2025, 1, 1)] * 4))
        with connect(Path({str(db)!r})) as con, transaction(con):
            con.register("incoming", rows)
            con.execute("INSERT INTO rollouts BY NAME SELECT * FROM incoming")
            assert con.execute("SELECT count(*) FROM rollouts").fetchone() == (5,)
            os._exit(9)  # killed after the write, before the commit
        """
    )
    done = subprocess.run([sys.executable, "-c", killed], cwd=REPO)
    assert done.returncode == 9
    assert stored_keys(db) == [("p0", 0, MODEL)]


def test_a_new_reward_adds_its_column(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table([rollout("p1", 0)]))
    assert insert_rollouts(db, table([rollout("p1", 1, reward_brevity=0.25)])) == 1
    with duckdb.connect(str(db)) as con:
        got = con.execute("SELECT sample_index, reward_brevity FROM rollouts ORDER BY 1").fetchall()
    assert got == [(0, None), (1, 0.25)]


@pytest.mark.parametrize(
    "column",
    ['reward_x" DOUBLE); DROP TABLE rollouts; --', "reward_Total", "reward_total2;", "foo"],
)
def test_unsafe_or_unknown_columns_are_refused(tmp_path: Path, column: str) -> None:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table([rollout("p1", 0)]))
    with pytest.raises(ValueError, match="reward"):
        insert_rollouts(db, table([rollout("p1", 1) | {column: 1.0}]))
    assert count_rollouts(db, MODEL) == 1


# --- each filter ----------------------------------------------------------------------------------


def test_length_filter(tmp_path: Path) -> None:
    rows = [
        rollout("p", 0, completion_tokens=9),
        rollout("p", 1, completion_tokens=10),
        rollout("p", 2, completion_tokens=20),
        rollout("p", 3, completion_tokens=21),
        rollout("p", 4, completion_tokens=15, finish_reason="length"),
    ]
    got = kept_after(tmp_path, rows, min_completion_tokens=10, max_completion_tokens=20)
    assert got == {("p", 1), ("p", 2)}


def test_correct_filter_applies_to_reasoning_rows_only(tmp_path: Path) -> None:
    rows = [
        rollout("p", 0, reward_accuracy=1.0),
        rollout("p", 1, reward_accuracy=0.0),
        rollout("p", 2, reward_accuracy=None),  # unverified is not correct
        rollout("g", 0, kind="general", reward_accuracy=None),
    ]
    assert kept_after(tmp_path, rows, require_correct=True) == {("p", 0), ("g", 0)}


def test_correct_reads_each_family_by_its_verifier(tmp_path: Path) -> None:
    rows = [
        rollout(
            "m", 0, family="math", reward_accuracy=1.0, reward_code=None, reward_countdown=None
        ),
        rollout(
            "c", 0, family="code", reward_accuracy=None, reward_code=1.0, reward_countdown=None
        ),
        rollout("c", 1, family="code", reward_accuracy=1.0, reward_code=0.5, reward_countdown=None),
        rollout(
            "l", 0, family="logic", reward_accuracy=None, reward_code=None, reward_countdown=1.0
        ),
        rollout(
            "l", 1, family="logic", reward_accuracy=1.0, reward_code=None, reward_countdown=0.0
        ),
    ]
    # a code row passes on all its tests only; another family's reward never stands in
    assert kept_after(tmp_path, rows, require_correct=True) == {("m", 0), ("c", 0), ("l", 0)}


def test_a_family_without_its_verifier_column_is_named(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table([rollout("c", 0, family="code")]))
    with pytest.raises(MissingRewardColumn, match="reward_code"):
        run_funnel(db, MODEL, spec(require_correct=True), "run")


def test_well_formed_filter(tmp_path: Path) -> None:
    rows = [rollout("p", i, reward_format=f) for i, f in enumerate([1.0, 0.0, None, 0.5])]
    assert kept_after(tmp_path, rows, require_well_formed=True) == {("p", 0)}


def test_single_language_filter(tmp_path: Path) -> None:
    rows = [rollout("p", i, reward_language=s) for i, s in enumerate([0.99, 0.95, 0.5, None])]
    assert kept_after(tmp_path, rows, min_language_share=0.95) == {("p", 0), ("p", 1)}


def test_general_score_filter_applies_to_general_rows_only(tmp_path: Path) -> None:
    rows = [
        rollout("g", 0, kind="general", reward_preference=0.7),
        rollout("g", 1, kind="general", reward_preference=0.2),
        rollout("g", 2, kind="general", reward_preference=None),
        rollout("p", 0, reward_preference=None),
    ]
    assert kept_after(tmp_path, rows, min_general_score=0.5) == {("g", 0), ("p", 0)}


def test_normalisation_matches_the_obvious_python() -> None:
    texts = ["A  b", " a\tB\n", "a\r\n\n b ", "a\x0bb", "ab", "A B\fc  ", "", "  ", "x y"]
    with duckdb.connect() as con:
        got = con.execute(
            f"SELECT {NORMALISED_COMPLETION} FROM unnest(?) AS t(completion)", [texts]
        ).fetchall()
    assert [g for (g,) in got] == [" ".join(t.lower().split()) for t in texts]


def test_dedup_keeps_the_best_copy_within_a_prompt(tmp_path: Path) -> None:
    rows = [
        rollout("p", 0, completion="The answer is 4", reward_total=0.5),
        rollout("p", 1, completion="  the   ANSWER is\n4 ", reward_total=0.9),
        rollout("p", 2, completion="The answer is 5", reward_total=0.1),
        rollout("q", 0, completion="The answer is 4", reward_total=0.5),  # another prompt
    ]
    assert kept_after(tmp_path, rows, dedup=True) == {("p", 1), ("p", 2), ("q", 0)}


def test_top_k_orders_by_reward_then_length_then_index(tmp_path: Path) -> None:
    rows = [
        rollout("p", 0, reward_total=None),
        rollout("p", 1, reward_total=0.5, completion_tokens=10),
        rollout("p", 2, reward_total=0.5, completion_tokens=5),
        rollout("p", 3, reward_total=1.0),
        rollout("q", 0, reward_total=0.5, completion_tokens=5),
        rollout("q", 1, reward_total=0.5, completion_tokens=5),
    ]
    assert kept_after(tmp_path, rows, top_k=2) == {("p", 3), ("p", 2), ("q", 0), ("q", 1)}
    assert kept_after(tmp_path / "k1", rows, top_k=1) == {("p", 3), ("q", 0)}


def test_a_missing_reward_column_is_named(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    rows = [{k: v for k, v in rollout("p", 0).items() if k != "reward_preference"}]
    insert_rollouts(db, table(rows))
    with pytest.raises(MissingRewardColumn, match="reward_preference"):
        run_funnel(db, MODEL, spec(min_general_score=0.5), "run")


def test_spec_is_validated() -> None:
    with pytest.raises(ValidationError, match="exceeds"):
        FunnelConfig(min_completion_tokens=10, max_completion_tokens=5)
    with pytest.raises(ValidationError):
        FunnelConfig(topk=3)


# --- the whole funnel -----------------------------------------------------------------------------


def mixed_rows() -> list[dict]:
    """Each row is removed by a known filter, in funnel order (the first failing one counts)."""
    return [
        rollout("a", 0, completion_tokens=2, reward_accuracy=0.0),  # length (and correct)
        rollout("a", 1, finish_reason="length"),  # length
        rollout("a", 2, reward_accuracy=0.0, reward_format=0.0),  # correct (and well_formed)
        rollout("a", 3, reward_format=None),  # well_formed
        rollout("a", 4, reward_language=0.4),  # single_language
        rollout("g", 0, kind="general", reward_accuracy=None, reward_preference=0.1),  # general
        rollout("g", 1, kind="general", reward_accuracy=None, reward_preference=0.9),
        rollout("a", 5, completion="same text", reward_total=3.0),
        rollout("a", 6, completion="SAME  text", reward_total=1.0),  # dedup
        rollout("a", 7, reward_total=2.5),
        rollout("a", 8, reward_total=1.5),  # top_k
    ]


FULL = FunnelConfig(
    min_completion_tokens=5, max_completion_tokens=100, min_general_score=0.5, top_k=2
)


def test_funnel_counts_chain(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table(mixed_rows()))
    funnel = run_funnel(db, MODEL, FULL, "run-1")
    assert [f.name for f in funnel.filters] == list(FILTERS)
    assert [f.removed for f in funnel.filters] == [2, 1, 1, 1, 1, 1, 1]
    assert funnel.filters[0].rows_in == 11
    for before, after in zip(funnel.filters, funnel.filters[1:], strict=False):
        assert after.rows_in == before.rows_out
    assert funnel.filters[-1].rows_out == funnel.kept == 3
    with duckdb.connect(str(db)) as con:
        stored = con.execute(
            "SELECT filter, rows_in, rows_out FROM rejection_funnel ORDER BY position"
        ).fetchall()
        kept = con.execute("SELECT prompt_id, sample_index, rank FROM rejection_kept").fetchall()
    assert stored == [(f.name, f.rows_in, f.rows_out) for f in funnel.filters]
    assert sorted(kept) == [("a", 5, 1), ("a", 7, 2), ("g", 1, 1)]


def test_rerunning_a_funnel_replaces_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table(mixed_rows()))
    first = run_funnel(db, MODEL, FULL, "run-1")
    assert run_funnel(db, MODEL, FULL, "run-1") == first
    run_funnel(db, MODEL, FULL, "run-2")
    with duckdb.connect(str(db)) as con:
        kept = con.execute("SELECT run_id, count(*) FROM rejection_kept GROUP BY 1 ORDER BY 1")
        assert kept.fetchall() == [("run-1", 3), ("run-2", 3)]
        counts = con.execute("SELECT count(*) FROM rejection_funnel WHERE run_id = 'run-1'")
        assert counts.fetchone() == (len(FILTERS),)


# --- export -------------------------------------------------------------------------------------


def export(tmp_path: Path, rows: list[dict], name: str) -> tuple[str, Path, Path]:
    db = tmp_path / f"{name}.duckdb"
    insert_rollouts(db, table(rows))
    run_funnel(db, MODEL, FULL, "run")
    parquet, hf = tmp_path / name / "kept.parquet", tmp_path / name / "hf"
    return export_kept(db, "run", parquet, hf), parquet, hf


def test_export_digest_is_stable_and_follows_content(tmp_path: Path) -> None:
    from datasets import load_from_disk

    digest, parquet, hf = export(tmp_path, mixed_rows(), "one")
    again, _, _ = export(tmp_path, list(reversed(mixed_rows())), "two")
    assert digest == again
    saved = load_from_disk(str(hf))
    assert rows_digest(saved) == digest
    assert pq.read_table(parquet).to_pylist() == saved.to_list()
    assert [(r["prompt_id"], r["sample_index"]) for r in saved] == [("a", 5), ("a", 7), ("g", 1)]
    assert "created_at" not in saved.column_names and "reward_total" in saved.column_names

    changed = [r | {"completion": "edited"} if r["sample_index"] == 7 else r for r in mixed_rows()]
    assert export(tmp_path, changed, "three")[0] != digest


def test_export_again_into_the_same_place(tmp_path: Path) -> None:
    digest, parquet, hf = export(tmp_path, mixed_rows(), "one")
    assert export_kept(tmp_path / "one.duckdb", "run", parquet, hf) == digest


def test_export_of_an_unknown_run_fails(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    insert_rollouts(db, table(mixed_rows()))
    with pytest.raises(LookupError, match="run_funnel"):
        export_kept(db, "nope", tmp_path / "k.parquet", tmp_path / "hf")
