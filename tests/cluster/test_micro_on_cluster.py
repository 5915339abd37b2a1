"""The micro pipeline end to end on a local two-node Ray cluster: every evaluation (after each
stage), the rejection sampling, the distillation traces and every GRPO stage's rollouts
(synchronous, max_staleness 0) on two sampling actors, and mixed SFT under DeepSpeed with its
two ranks on two nodes. Against the same profile in one process, every stored rollout and
every figure of the stage table is the same; and the one-process profile run in the cluster
run's state folder takes every stage from its cache, because the cluster settings are no part
of a stage's key."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from flows.r1_pipeline import r1_pipeline
from tasks.result import PipelineResult

pytestmark = [pytest.mark.cluster, pytest.mark.heavy]

# mixed SFT under DeepSpeed in both runs: two processes on this machine, or one on each node
PROFILE = ["mixed_sft.engine.kind=deepspeed", "mixed_sft.engine.processes=2"]


def cluster_overrides(address: str) -> list[str]:
    return [
        f"cluster.address={address}",
        "cluster.workers=2",
        "cluster.chunk_prompts=2",  # several chunks per evaluation, so both actors sample
        "cluster.nodes=2",
        "cluster.rollouts=workers",  # every GRPO stage draws its groups on the actors
    ]


def run(state: Path, overrides: list[str]) -> PipelineResult:
    mp = pytest.MonkeyPatch()
    mp.setenv("R1_STATE_DIR", str(state))
    try:
        return r1_pipeline(profile="micro", overrides=overrides)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def runs(prefect_server, ray_cluster, tmp_path_factory):
    one = tmp_path_factory.mktemp("one-process")
    spread = tmp_path_factory.mktemp("on-cluster")
    local = run(one, PROFILE)
    on_cluster = run(spread, PROFILE + cluster_overrides(ray_cluster))
    return {"one": (one, local), "cluster": (spread, on_cluster)}


def rollouts(state: Path) -> list[tuple]:
    """Every stored rollout, its columns by name (reward columns are added in the order a
    process first meets them, which need not be the same in two runs)."""
    with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
        names = con.execute("SELECT * EXCLUDE (created_at) FROM rollouts LIMIT 0").description
        columns = ", ".join(sorted(name for name, *_ in names))
        return con.execute(
            f"SELECT {columns} FROM rollouts ORDER BY model_id, prompt_id, sample_index"
        ).fetchall()


def test_every_stored_rollout_is_the_one_process_rollout(runs):
    (one, _), (spread, _) = runs["one"], runs["cluster"]
    ours, theirs = rollouts(spread), rollouts(one)
    assert len(ours) == len(theirs) > 0
    assert ours == theirs


def test_every_figure_of_the_stage_table_is_the_one_process_figure(runs):
    """An RL-only twin trains for the wall time its student's distillation took, so how many
    steps it gets depends on the machine's speed at that moment, on a cluster or not: its
    figures are left out of the comparison (it ran, with a model)."""
    (_, local), (_, spread) = runs["one"], runs["cluster"]
    assert [r.stage for r in spread.rows] == [r.stage for r in local.rows]
    for ours, theirs in zip(spread.rows, local.rows, strict=True):
        if ours.stage.startswith("rl_only_"):
            assert ours.metrics.keys() == theirs.metrics.keys() and "model v" in ours.note
            continue
        assert ours.metrics == theirs.metrics, ours.stage
        assert ours.note == theirs.note, ours.stage


def test_the_one_process_run_takes_every_stage_from_the_cluster_runs_cache(runs):
    spread_state, _ = runs["cluster"]
    again = run(spread_state, PROFILE)
    cached = [r.stage for r in again.rows if "cached from run" in r.note]
    assert cached == [r.stage for r in again.rows]


def test_the_nightly_evaluation_on_the_cluster_gives_the_final_stages_figures(runs, ray_cluster):
    from flows.evaluate_registered import evaluate_registered

    state, spread = runs["cluster"]
    mp = pytest.MonkeyPatch()
    mp.setenv("R1_STATE_DIR", str(state))
    try:
        verdict = evaluate_registered(
            model="models:/r1-micro@final",
            profile="micro",
            overrides=PROFILE + cluster_overrides(ray_cluster),
        )
    finally:
        mp.undo()
    final = {row.stage: row for row in spread.rows}["all_scenarios_rl"]
    assert verdict["metrics"] == final.metrics
