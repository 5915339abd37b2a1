"""The tiny pipeline end to end on the micro profile: a real Prefect run (test harness server),
a real MLflow SQLite store and a real DuckDB file, checked for what they recorded."""

import json
from pathlib import Path

import duckdb
import pytest
from datasets import load_from_disk
from mlflow import MlflowClient

from configs import load_profile
from evaluation.report import LINE_WIDTH
from storage.tracking import ATTEMPTS_TAG, STAGE_KEY_TAG, alias_for

# Heavy: the whole micro pipeline on a Prefect test server.
pytestmark = pytest.mark.heavy

ROW_STAGES = [
    "bootstrap",
    "reward_model",
    "r1_zero_rl",
    "cold_start_curation",
    "cold_start_sft",
    "reasoning_rl",
    "rejection_sampling",
    "mixed_sft",
    "all_scenarios_rl",
    "distill_traces",
    "student_base_qwen",
    "student_qwen",
    "rl_only_qwen",
    "student_base_llama",
    "student_llama",
    "rl_only_llama",
]
STAGES = set(ROW_STAGES)
MODEL_STAGES = (
    "bootstrap",
    "r1_zero_rl",
    "cold_start_sft",
    "reasoning_rl",
    "mixed_sft",
    "all_scenarios_rl",
    "student_qwen",
    "rl_only_qwen",
    "student_llama",
    "rl_only_llama",
)


@pytest.fixture(scope="module")
def micro_run(prefect_server, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    mp = pytest.MonkeyPatch()
    mp.setenv("R1_STATE_DIR", str(state))
    from flows.r1_pipeline import r1_pipeline

    result = r1_pipeline(profile="micro")
    yield state, result
    mp.undo()


def test_prefect_recorded_a_completed_flow_run_with_every_task(micro_run):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    _, result = micro_run
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(result.flow_run_id)
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
    assert flow_run.state.is_completed()
    names = [t.name for t in task_runs]
    # each task run is named after its stage, each evaluation after the stage it judges
    assert STAGES | {f"evaluate: {stage}" for stage in MODEL_STAGES} <= set(names)
    assert {"prepare-problems", "open-pipeline-run", "close-pipeline-run"} <= set(names)
    assert len(names) == len(set(names)) == len(STAGES) + len(MODEL_STAGES) + 4, names
    assert all(t.state.is_completed() for t in task_runs)


def test_the_plan_names_the_stages_the_flow_ran(micro_run):
    """What "stage i of n" counts is what the flow ran."""
    from tasks.plan import planned_stages

    _, result = micro_run
    assert list(planned_stages(load_profile("micro"), "r1_pipeline")) == ROW_STAGES
    assert [r.stage for r in result.rows] == ROW_STAGES


def test_mlflow_holds_the_parent_and_one_nested_run_per_stage(micro_run):
    state, result = micro_run
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["prefect.flow_run_id"] == result.flow_run_id
    assert {i.dataset.name for i in parent.inputs.dataset_inputs} == {
        "problems-train",
        "problems-heldout",
        "general-sft",
        "general-pairs_train",
        "general-pairs_heldout",
        "general-rl_prompts",
        "general-eval_prompts",
    }
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    by_stage = {r.data.tags["r1.stage"]: r for r in children}
    assert set(by_stage) == STAGES and len(children) == len(STAGES)
    for run in by_stage.values():
        assert run.info.status == "FINISHED"
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert "config.json" in artifacts
        assert "stage/seconds" in run.data.metrics  # what the stage table's time column reads
        assert run.data.tags.get(ATTEMPTS_TAG, "1") == "1"  # started once: nothing retried
        assert len(run.data.tags[STAGE_KEY_TAG]) == 64  # found again by its stage key
    for stage in MODEL_STAGES:
        metrics = by_stage[stage].data.metrics
        assert {
            "eval/pass_at_1",
            "eval/pass_at_2",
            "eval/cons_at_2",
            "eval/format_rate",
            "eval/language_consistency_rate",
            "eval/general_score",
        } <= set(metrics)
        assert 0.0 <= metrics["eval/pass_at_1"] <= metrics["eval/pass_at_2"] <= 1.0
        assert parent.data.metrics[f"{stage}/format_rate"] == metrics["eval/format_rate"]
        version = client.get_model_version_by_alias("r1-micro", alias_for(stage))
        assert version.run_id == by_stage[stage].info.run_id
    curation = by_stage["cold_start_curation"]
    sft_inputs = by_stage["cold_start_sft"].inputs.dataset_inputs
    assert [i.dataset.digest for i in sft_inputs if i.dataset.name == "cold-start-curated"] == [
        curation.data.tags["dataset.digest"][:36]
    ]


def test_duckdb_holds_the_curated_set_and_the_filter_counts(micro_run):
    state, result = micro_run
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    parent = client.get_run(result.parent_run_id)
    (curation,) = client.search_runs(
        [parent.info.experiment_id], filter_string="tags.`r1.stage` = 'cold_start_curation'"
    )
    with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
        counts = dict(
            con.execute(
                "SELECT filter, removed FROM curation_filters WHERE stage_run_id = ? "
                "ORDER BY position",
                [curation.info.run_id],
            ).fetchall()
        )
        kept, removed = con.execute(
            "SELECT count(*) FILTER (WHERE kept), count(*) FILTER (WHERE NOT kept) "
            "FROM curated_traces"
        ).fetchone()
        by_filter = dict(
            con.execute(
                "SELECT removed_by, count(*) FROM curated_traces WHERE NOT kept GROUP BY removed_by"
            ).fetchall()
        )
        lineage = con.execute(
            "SELECT kind, stage, inputs, artifact FROM lineage ORDER BY created_at"
        ).fetchall()
    assert list(counts) == [
        "format",
        "language",
        "length",
        "readability",
        "correctness",
        "duplicates",
    ]
    assert {k: v for k, v in counts.items() if v} == by_filter
    assert removed == sum(counts.values())
    assert counts == {
        k.split("/")[1].removesuffix("_removed"): int(v)
        for k, v in curation.data.metrics.items()
        if k.startswith("filter/")
    }
    dataset_path = next(a for k, s, _, a in lineage if s == "cold_start_curation")
    assert dataset_path.startswith(f"{state}/runs/cold_start_curation/")
    assert len(load_from_disk(dataset_path)) == kept > 0
    kinds = [(kind, stage) for kind, stage, _, _ in lineage]
    assert ("dataset", "cold_start_curation") in kinds and ("model", "cold_start_sft") in kinds
    sft_inputs = json.loads(next(i for k, s, i, _ in lineage if s == "cold_start_sft"))
    curated = {"digest": curation.data.tags["dataset.digest"], "run": curation.info.run_id}
    assert curated in sft_inputs


def test_the_stage_table_has_a_row_per_stage(micro_run):
    _, result = micro_run
    assert [r.stage for r in result.rows] == ROW_STAGES
    by_stage = {r.stage: r for r in result.rows}
    for stage in MODEL_STAGES:
        assert {"format_rate", "general_score"} <= set(by_stage[stage].metrics)
    assert by_stage["cold_start_curation"].note.startswith("kept ")
    assert by_stage["rejection_sampling"].note.startswith("kept ")


def test_the_report_is_logged_to_mlflow_and_prefect(micro_run):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    state, result = micro_run
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    artifacts = {a.path for a in client.list_artifacts(result.parent_run_id, "report")}
    assert {"report/stages.json", "report/stages.html", "report/stages.png"} <= artifacts
    local = client.download_artifacts(result.parent_run_id, "report/stages.json")
    table = json.loads(Path(local).read_text(encoding="utf-8"))
    stage_column = table["columns"].index("stage")
    assert [row[stage_column] for row in table["data"]] == ROW_STAGES
    with get_client(sync_client=True) as prefect:
        found = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[result.flow_run_id])
            )
        )
    (report,) = [a for a in found if a.key == "r1-stage-report"]
    assert "| mixed_sft |" in report.data and "general score" in report.data
    assert "?workflowType=machine_learning)" in report.data  # the MLflow UI opens on runs
    parent = client.get_run(result.parent_run_id)
    description = parent.data.tags["mlflow.note.content"]  # what the run's page shows first
    assert "| mixed_sft |" in description
    first_line = description.splitlines()[0]  # within the 100 pixels MLflow shows unfolded
    table_view = f"/runs/{result.parent_run_id}/artifacts/report/stages.html?"
    assert "[the table](#/experiments/" in first_line and table_view in first_line
    assert "final model (all_scenarios_rl): pass@1 " in first_line
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # opens on runs
    messages = flow_run_messages(result.flow_run_id)
    (report,) = [m for m in messages if "held-out, after each stage:" in m]
    assert [line.split()[0] for line in report.splitlines()[1:-1]] == ROW_STAGES  # a line each
    assert all(len(line) <= LINE_WIDTH for line in report.splitlines()[1:])
    # every task run's line says which stage it is about, and long stages say how far along
    words = [" ".join(m.split()) for m in messages]  # a line past LINE_WIDTH wraps
    assert "reasoning_rl: Finished in state Completed()" in words
    assert "evaluate: reasoning_rl: Finished in state Completed()" in words
    unnamed = [m for m in words if m.startswith("Finished in state")]
    assert unnamed == ["Finished in state Completed()"]  # the flow run's own, and no task's
    assert "reasoning_rl: step 2 of 2 (100%)" in messages
    assert any(m.startswith("reasoning_rl: stage 6 of 16 starts\nMLflow run ") for m in messages)


def flow_run_messages(flow_run_id: str) -> list[str]:
    """The flow run's log messages as the server holds them (what `--watch` and `r1 watch`
    print), in order."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # the run's logs reach the server from a background worker
    logs, page = [], [None]
    with get_client(sync_client=True) as prefect:
        while page:  # the server answers 200 logs at a time
            page = prefect.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                sort=LogSort.TIMESTAMP_ASC,
                limit=200,
                offset=len(logs),
            )
            logs += page
    return [log.message for log in logs]


def test_every_log_line_fits_80_columns_under_watch(micro_run):
    """`prefect deployment run --watch` puts 28 characters before each line of a message and
    `r1 watch` 9: a line of the run's log wraps at 80 columns past LINE_WIDTH characters. A
    single word may be longer (a path, an address): it cannot be cut."""
    _, result = micro_run
    lines = [line for m in flow_run_messages(result.flow_run_id) for line in m.splitlines()]
    assert len(lines) > 100
    wide = [line for line in lines if len(line) > LINE_WIDTH and len(line.split()) > 1]
    assert not wide, f"{len(wide)} of {len(lines)} lines wider than {LINE_WIDTH}:\n" + "\n".join(
        wide
    )


def test_rejection_sampling_filled_duckdb_and_fed_mixed_sft(micro_run):
    state, result = micro_run
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    experiment = client.get_run(result.parent_run_id).info.experiment_id
    (rejection,) = client.search_runs(
        [experiment], filter_string="tags.`r1.stage` = 'rejection_sampling'"
    )
    (mixed,) = client.search_runs([experiment], filter_string="tags.`r1.stage` = 'mixed_sft'")
    with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
        stored, keys = con.execute(
            "SELECT count(*), count(DISTINCT (prompt_id, sample_index, model_id)) FROM rollouts"
        ).fetchone()
        funnel = con.execute(
            "SELECT filter, rows_in, rows_out FROM rejection_funnel WHERE run_id = ? "
            "ORDER BY position",
            [rejection.info.run_id],
        ).fetchall()
        kept = con.execute(
            "SELECT count(*) FROM rejection_kept WHERE run_id = ?", [rejection.info.run_id]
        ).fetchone()[0]
        kinds = dict(con.execute("SELECT kind, count(*) FROM rollouts GROUP BY kind").fetchall())
    assert stored == keys > 0
    assert {"reasoning", "general"} <= set(kinds)
    assert funnel[0][1] == (16 + 4) * 2  # micro: 16 reasoning + 4 general prompts, 2 samples each
    assert all(a[2] == b[1] for a, b in zip(funnel, funnel[1:], strict=False))
    assert funnel[-1][2] == kept > 0
    names = {i.dataset.name for i in mixed.inputs.dataset_inputs}
    assert "mixed-sft" in names
    assert mixed.data.metrics["data/general"] >= 24  # the non-reasoning set, and kept general rows


def test_a_failing_stage_marks_the_mlflow_runs_failed(prefect_server, tmp_path, monkeypatch):
    monkeypatch.setenv("R1_STATE_DIR", str(tmp_path / "state"))
    from flows.r1_pipeline import r1_pipeline

    bad = tmp_path / "bad.jsonl"  # there, so the preflight passes; no row loads in the stage
    bad.write_text("not json\n")
    config = load_profile(
        "micro",
        ["data.source=files", f"data.files={{train_path: {bad}, heldout_path: {bad}}}"],
    )
    with pytest.raises(Exception, match="no usable rows"):
        r1_pipeline(config=config)
    client = MlflowClient(f"sqlite:///{tmp_path}/state/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "r1-micro"]
    (parent,) = client.search_runs([experiment.experiment_id])
    assert parent.info.status == "FAILED"


def test_training_stages_log_their_curves(micro_run):
    state, result = micro_run
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    runs = client.search_runs(
        [client.get_run(result.parent_run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{result.parent_run_id}'",
    )
    by_stage = {r.data.tags["r1.stage"]: r for r in runs}
    assert "train/loss" in by_stage["bootstrap"].data.metrics
    assert "train/loss" in by_stage["cold_start_sft"].data.metrics
    for stage in ("bootstrap", "cold_start_sft", "mixed_sft", "student_qwen", "student_llama"):
        assert "data/truncated_examples" in by_stage[stage].data.metrics, stage
    # curation's length filter bounds the whole example by the SFT stage's max_length
    assert by_stage["cold_start_sft"].data.metrics["data/truncated_examples"] == 0


def test_reasoning_rl_logs_grpo_signals_samples_and_a_reward_curve(micro_run):
    state, result = micro_run
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    parent = client.get_run(result.parent_run_id)
    (rl,) = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' "
        "AND tags.`r1.stage` = 'reasoning_rl'",
    )
    history = client.get_metric_history(rl.info.run_id, "reward/mean")
    assert [m.step for m in history] == [1, 2]
    assert {
        "reward/accuracy/mean",
        "groups/zero_spread_fraction",
        "completion/mean_tokens",
        "time/tokens_per_second",
    } <= set(rl.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(rl.info.run_id)}
    assert {"reward_curve.png", "samples", "model", "config.json"} <= artifacts
    assert "training_curves.png" in artifacts  # reward and its families, length, KL
    description = rl.data.tags["mlflow.note.content"]
    assert description.startswith("**Training curves**: [reward, per family and term; length; KL](")
    assert "2 steps: reward " in description and " · length " in description
    assert f"get-artifact?path=training_curves.png&run_uuid={rl.info.run_id}" in description
    assert len(client.list_artifacts(rl.info.run_id, "samples")) == 2
    assert client.get_model_version_by_alias("r1-micro", "reasoning-rl").run_id == rl.info.run_id
    (sft,) = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' "
        "AND tags.`r1.stage` = 'cold_start_sft'",
    )
    with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
        rows = con.execute(
            "SELECT produced_by, digest FROM lineage WHERE kind = 'model'"
        ).fetchall()
        (inputs,) = con.execute(
            "SELECT inputs FROM lineage WHERE stage = 'reasoning_rl'"
        ).fetchone()
    sft_digest = dict(rows)[sft.info.run_id]
    assert json.loads(inputs)[0] == {"digest": sft_digest, "run": sft.info.run_id}
    assert sft_digest == rl.data.tags["policy.digest"]


def test_every_training_stage_changes_its_model(micro_run):
    """Each model a stage trained differs, byte for byte, from every model it started from: the
    micro run exercises each update, GRPO's included."""
    state, _ = micro_run
    with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
        rows = con.execute(
            "SELECT stage, digest, inputs FROM lineage WHERE kind = 'model'"
        ).fetchall()
    models = {digest for _, digest, _ in rows}
    trained = {stage for stage, _, _ in rows} - {
        "bootstrap",
        "student_base_qwen",
        "student_base_llama",
    }
    assert trained == set(MODEL_STAGES) - {"bootstrap"} | {"reward_model"}
    for stage, digest, inputs in rows:
        started_from = {i["digest"] for i in json.loads(inputs)} & models
        assert digest not in started_from, f"{stage} left its model unchanged"


def test_the_final_models_lineage_reaches_every_stage_before_it(micro_run):
    state, _ = micro_run
    from storage.lineage import chain

    with duckdb.connect(str(state / "r1.duckdb"), read_only=True) as con:
        digest, run = con.execute(
            "SELECT digest, produced_by FROM lineage WHERE stage = 'all_scenarios_rl'"
        ).fetchone()
    root = chain(state / "r1.duckdb", digest, run)
    reached = {node.stage for node in root.walk()}
    assert not any(node.cycle for node in root.walk())
    assert {
        "all_scenarios_rl",
        "mixed_sft",
        "rejection_sampling",
        "reasoning_rl",
        "cold_start_sft",
        "cold_start_curation",
        "bootstrap",
        "reward_model",
        "problems",
        "general",
    } == reached
    assert all(node.known for node in root.walk())


def test_r1_zero_probes_heldout_pass_at_1_and_length_and_every_stage_reports_each_family(
    micro_run,
):
    state, result = micro_run
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    parent = client.get_run(result.parent_run_id)
    (zero,) = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' "
        "AND tags.`r1.stage` = 'r1_zero_rl'",
    )
    probed = client.get_metric_history(zero.info.run_id, "heldout/pass_at_1_lenient")
    assert [m.step for m in probed] == [0, 1, 2]  # before training and after every step
    assert "heldout/mean_tokens" in zero.data.metrics
    assert "heldout_curve.png" in {a.path for a in client.list_artifacts(zero.info.run_id)}
    for family in ("math", "code", "logic"):
        assert f"eval/{family}/pass_at_1_lenient" in zero.data.metrics
        assert f"all_scenarios_rl/{family}/pass_at_1" in parent.data.metrics


def test_the_probe_keeps_each_problems_verdicts_for_the_guards_paired_readings(micro_run):
    """In the trainer's history (and so its checkpoints), never as metrics: at every probe, each
    held-out problem's share of samples found right, in each reading the guard pairs, whose
    mean is the family's pass@1 the probe logged."""
    from benchmarks.guard import stage_history
    from guard.paired import item_values, items_key
    from guard.watch import skill_pairs

    state, _ = micro_run
    stages = [d for d in (state / "runs" / "r1_zero_rl").iterdir() if (d / "checkpoints").is_dir()]
    probes = [h for d in stages for h in stage_history(d) if "heldout/pass_at_1" in h]
    assert probes and {h["step"] for h in probes} == {0, 1, 2}
    pairs = skill_pairs(load_profile("micro").r1_zero.rewards)
    read = [(e, p) for e in probes for p in pairs if p.probe_key in e]  # families in the probe
    assert read
    for entry, pair in read:
        items = item_values(entry, items_key(pair.probe_key))
        assert items and sum(items.values()) / len(items) == pytest.approx(entry[pair.probe_key])


def test_r1_zero_flow_runs_grpo_on_the_base(prefect_server, tmp_path, monkeypatch):
    monkeypatch.setenv("R1_STATE_DIR", str(tmp_path / "state"))
    from flows.r1_zero import r1_zero

    result = r1_zero(profile="micro")
    # micro's R1-Zero rewards include the reward model's score, so the flow trains one
    assert [r.stage for r in result.rows] == ["bootstrap", "reward_model", "r1_zero_rl"]
    from tasks.plan import planned_stages

    assert list(planned_stages(load_profile("micro"), "r1_zero")) == [r.stage for r in result.rows]
    client = MlflowClient(f"sqlite:///{tmp_path}/state/mlflow.db")
    parent = client.get_run(result.parent_run_id)
    assert parent.data.tags["r1.flow"] == "r1_zero" and parent.info.status == "FINISHED"
    assert "r1_zero_rl/pass_at_1" in parent.data.metrics


def test_the_distill_flow_distils_the_registered_final_model(micro_run):
    """Stage 7 alone, on the pipeline's state: the teacher comes from the registry by alias, the
    students' bases from the cache, and their distilled models get the students' aliases."""
    state, pipeline = micro_run
    from flows.distill import distill

    result = distill(profile="micro", teacher="models:/r1-micro@final")
    stages = [r.stage for r in result.rows]
    assert stages[0] == "distill_traces" and {"student_qwen", "student_llama"} <= set(stages)
    from tasks.plan import planned_stages

    assert list(planned_stages(load_profile("micro"), "distill")) == stages
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    final = client.get_model_version_by_alias("r1-micro", "final")
    student = client.get_model_version_by_alias("r1-micro", "student-qwen")
    assert client.get_run(student.run_id).data.tags["mlflow.parentRunId"] == result.parent_run_id
    (traces,) = client.search_runs(
        [client.get_run(result.parent_run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{result.parent_run_id}' "
        "AND tags.`r1.stage` = 'distill_traces'",
    )
    assert (
        traces.data.tags["policy.digest"] == client.get_run(final.run_id).data.tags["model.digest"]
    )
    notes = {r.stage: r.note for r in result.rows}
    assert notes["student_base_qwen"].startswith("cached from run " + pipeline.parent_run_id[:8])


def test_a_fault_named_for_a_cached_stage_still_fires(micro_run):
    """The README's fault demo on a state folder where every stage is cached: the named stage
    runs under a key of its own and fails as asked; the stages before it come from the cache."""
    state, _ = micro_run
    from flows.r1_pipeline import r1_pipeline
    from tasks.context import InjectedFailure

    client = MlflowClient(f"sqlite:///{state}/mlflow.db")

    def runs(stage: str) -> int:
        experiments = [e.experiment_id for e in client.search_experiments()]
        return len(client.search_runs(experiments, filter_string=f"tags.`r1.stage` = '{stage}'"))

    before = {stage: runs(stage) for stage in ("cold_start_sft", "reasoning_rl")}
    with pytest.raises(InjectedFailure, match="reasoning_rl: injected failure at step 1"):
        r1_pipeline(profile="micro", overrides=["faults.fail_once_at=reasoning_rl@1"])
    assert runs("cold_start_sft") == before["cold_start_sft"]
    assert runs("reasoning_rl") == before["reasoning_rl"] + 1


def test_after_a_code_change_keep_finished_keeps_every_stage_and_says_so(micro_run, code_version):
    """The code changed since the run (as a fix does): with `cache.keep_finished` every stage
    that finished comes from the cache, computed nothing, and the report, the log and the
    parent run's tags say from which run and which code."""
    state, pipeline = micro_run
    from flows.r1_pipeline import r1_pipeline

    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments()]
    stage_runs = len(client.search_runs(experiments, filter_string="tags.`r1.stage` != 'pipeline'"))
    earlier = client.get_run(pipeline.parent_run_id).data.tags["r1.code"]
    code_version("edited")
    result = r1_pipeline(profile="micro", overrides=["cache.keep_finished=true"])
    assert [row.stage for row in result.rows] == ROW_STAGES
    kept = f"kept from run {pipeline.parent_run_id[:8]}, code {earlier[:8]}"
    assert all(row.note.startswith(kept) for row in result.rows), [r.note for r in result.rows]
    tags = client.get_run(result.parent_run_id).data.tags
    assert {tags[f"r1.kept.{stage}"] for stage in ROW_STAGES} == {earlier}
    assert tags["r1.code"] == "edited"
    messages = [" ".join(m.split()) for m in flow_run_messages(result.flow_run_id)]
    said = "reasoning_rl: kept, finished under earlier code (cache.keep_finished)"
    assert any(said in m for m in messages), messages
    after = len(client.search_runs(experiments, filter_string="tags.`r1.stage` != 'pipeline'"))
    assert after == stage_runs


def test_a_run_from_the_cache_puts_the_aliases_back_on_its_own_models(micro_run):
    """A run with other settings moves `r1-micro@final` (and the students' aliases) to its own
    models; the first settings run again, all from the cache, and the aliases name what that run
    reports, which `r1 lineage` and the nightly evaluation follow."""
    state, _ = micro_run
    from flows.r1_pipeline import r1_pipeline

    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    aliases = ("final", "student-qwen", "cold-start")

    def versions() -> dict[str, str]:
        return {a: client.get_model_version_by_alias("r1-micro", a).version for a in aliases}

    first = versions()
    steps = load_profile("micro").all_scenarios_rl.steps
    r1_pipeline(profile="micro", overrides=[f"all_scenarios_rl.steps={steps + 1}"])
    moved = versions()
    assert moved["final"] != first["final"] and moved["student-qwen"] != first["student-qwen"]
    assert moved["cold-start"] == first["cold-start"]  # before the change: not registered again
    r1_pipeline(profile="micro")
    assert versions() == first


def test_how_stages_run_computes_nothing_again_and_rl_twin_settings_only_the_twins(micro_run):
    """A run again with other logging and checkpoint intervals, time limits and micro-batches,
    and other RL-twin settings: only the twins are computed again; every other stage, the
    students' distillation among them, comes from the cache."""
    state, _ = micro_run
    from flows.r1_pipeline import r1_pipeline

    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments()]

    def runs() -> dict[str, int]:
        found = client.search_runs(experiments, filter_string="tags.`r1.stage` != 'pipeline'")
        stages = [run.data.tags["r1.stage"] for run in found]
        return {stage: stages.count(stage) for stage in STAGES}

    r1_pipeline(profile="micro")  # whatever settings the module's tests ran last: these first
    before = runs()
    twin_steps = load_profile("micro").distillation.rl_twin.steps + 1
    r1_pipeline(
        profile="micro",
        overrides=[
            "cold_start_sft.train.log_every=3",
            "mixed_sft.train.checkpoint_every=2",
            "mixed_sft.engine.micro_batch_tokens=256",
            "reasoning_rl.engine.timeout_s=600",
            "reasoning_rl.samples_every=2",
            "distillation.sft.log_every=1",
            f"distillation.rl_twin.steps={twin_steps}",
        ],
    )
    twins = {"rl_only_qwen", "rl_only_llama"}
    assert runs() == {stage: n + (stage in twins) for stage, n in before.items()}
