"""Scheduled evaluation of `models:/NAME@ALIAS`: a real Prefect run (test harness server), a real
MLflow SQLite registry and a real DuckDB history in a temporary state folder.

The registry holds two tiny models the test builds itself: one fine-tuned by the SFT stage until
it answers every held-out problem (all of them have the answer 7, so a constant, well-formed
answer is right), and the same model untrained, which cannot answer. The alias first points at
the good model, is evaluated twice (no regression), then is moved to the untrained one.
"""

from datetime import datetime

import duckdb
import pytest
import torch
from datasets import Dataset
from mlflow import MlflowClient

from configs.supervised import ModelConfig, SFTConfig, TrainConfig
from evaluation.verdict import artifact_key
from models.saved import save_model
from preference.model import build_reward_model
from problems.loader import write_problems
from problems.types import Problem
from stages import sft
from stages.tracker import NullTracker
from storage import eval_history
from storage.eval_history import regressions
from storage.model_registry import ModelSpec, RegistryError, fetch, parse_alias_uri
from storage.paths import StatePaths
from storage.tracking import experiment_id, finish_run, register_model, tracking_client
from tests.tiny_models import make_tokenizer, tiny_model

NAME = "r1-micro"
URI = f"models:/{NAME}@final"
ANSWER = "<think>x</think><answer>7</answer>"  # each token follows from the one before it


# ---- regressions: worked examples -------------------------------------------------------------


def test_a_drop_beyond_the_allowance_is_a_regression():
    assert regressions({"pass_at_1": 0.7}, {"pass_at_1": 0.6}, {"pass_at_1": 0.02}) == [
        "pass_at_1 fell from 0.700 to 0.600 (allowed drop 0.020)"
    ]


def test_a_drop_within_or_at_the_allowance_passes():
    allowed = {"pass_at_1": 0.02}
    assert regressions({"pass_at_1": 0.7}, {"pass_at_1": 0.69}, allowed) == []
    assert regressions({"pass_at_1": 0.7}, {"pass_at_1": 0.68}, allowed) == []  # exactly 0.02
    assert regressions({"pass_at_1": 0.7}, {"pass_at_1": 0.9}, allowed) == []


def test_each_watched_metric_is_judged_and_missing_ones_are_skipped():
    before = {"pass_at_1": 0.5, "general_score": 1.50, "format_rate": 1.0}
    after = {"pass_at_1": 0.5, "general_score": 1.25, "format_rate": 0.0}
    watched = {"pass_at_1": 0.0, "general_score": 0.1, "cons_at_4": 0.0}
    assert regressions(before, after, watched) == [
        "general_score fell from 1.500 to 1.250 (allowed drop 0.100)"
    ]
    assert regressions({}, after, watched) == []
    assert regressions(before, {"pass_at_1": 0.1}, {"pass_at_1": 0.3, "general_score": 0.0}) == [
        "pass_at_1 fell from 0.500 to 0.100 (allowed drop 0.300)"
    ]


# ---- the model URI and the registry ---------------------------------------------------------


def test_a_model_uri_names_a_registered_model_and_an_alias():
    assert parse_alias_uri("models:/r1-tiny@final") == ModelSpec("r1-tiny", alias="final")
    assert parse_alias_uri("models:/r1-tiny@student-qwen") == ModelSpec("r1-tiny", "student-qwen")


@pytest.mark.parametrize(
    "uri",
    [
        "r1-tiny@final",
        "models:/r1-tiny",
        "models:/r1-tiny/3",
        "models:/r1-tiny@",
        "models:/@final",
        "models:/r1-tiny@final@cold-start",
        "models:/r1 tiny@final",
        "runs:/0123abcd/model",
        "/state/registry/r1-tiny/3",
        "",
    ],
)
def test_anything_but_models_name_at_alias_is_refused(uri):
    with pytest.raises(ValueError, match=r"not of the form models:/NAME@ALIAS"):
        parse_alias_uri(uri)


def test_artifact_keys_are_what_prefect_accepts():
    assert artifact_key("final") == "evaluation-final"
    assert artifact_key("Student_Qwen") == "evaluation-student-qwen"


# ---- the history table ----------------------------------------------------------------------


def test_the_history_gives_the_latest_earlier_evaluation_of_the_alias(tmp_path):
    db = tmp_path / "r1.duckdb"

    def add(run_id, alias, day, pass_at_1):
        at = datetime(2025, 1, day)
        eval_history.append(
            db, NAME, alias, "1", "d", run_id, "src", {"pass_at_1": pass_at_1}, evaluated_at=at
        )

    add("a", "final", 1, 0.5)
    add("b", "final", 2, 0.6)
    add("x", "cold-start", 3, 0.9)
    add("c", "final", 4, 0.7)
    assert eval_history.previous(db, NAME, "final", "c") == {"pass_at_1": 0.6}
    assert eval_history.previous(db, NAME, "final", "b") == {"pass_at_1": 0.5}
    assert eval_history.previous(db, NAME, "final", "a") is None
    assert eval_history.previous(db, NAME, "final", "not-yet-recorded") == {"pass_at_1": 0.7}
    assert eval_history.previous(db, "other-model", "final") is None
    add("c", "final", 4, 0.8)  # a retried run replaces its rows
    assert [e.metrics for e in eval_history.history(db, NAME, "final")] == [
        {"pass_at_1": 0.5},
        {"pass_at_1": 0.6},
        {"pass_at_1": 0.8},
    ]


def test_the_history_keeps_each_evaluations_settings_and_none_for_older_ones(tmp_path):
    db = tmp_path / "r1.duckdb"

    def add(run_id, day, settings):
        at = datetime(2025, 1, day)
        eval_history.append(
            db, NAME, "final", "1", "d", run_id, "src", {"pass_at_1": 0.5}, at, settings
        )

    add("old", 1, None)  # recorded before settings were
    add("cool", 2, {"temperature": "0.7", "seed": "0"})
    add("hot", 3, {"temperature": "3.0", "seed": "0"})
    add("hot", 3, {"temperature": "2.0", "seed": "0"})  # a retried run replaces its settings
    assert [
        (e.mlflow_run_id, e.settings) for e in eval_history.earlier(db, NAME, "final", "hot")
    ] == [
        ("cool", {"seed": "0", "temperature": "0.7"}),
        ("old", None),
    ]
    latest = eval_history.earlier(db, NAME, "final", "not-yet-recorded")[0]
    assert latest.settings == {"seed": "0", "temperature": "2.0"}


# ---- the flow, end to end -------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Problem files (every held-out answer is 7), an untrained tiny model, the same model
    fine-tuned on the constant answer, and an untrained reward model."""
    root = tmp_path_factory.mktemp("models")
    sums = [(a, 7 - a) for a in range(8)]
    train = [
        Problem(f"t{i}", f"What is {a} plus {b}? Give the sum.", "7")
        for i, (a, b) in enumerate(sums)
    ]
    heldout = [
        Problem(f"h{i}", f"Tom has {a} apples and gets {b} more. How many now?", "7")
        for i, (a, b) in enumerate(sums)
    ]
    tokenizer = make_tokenizer()
    untrained = save_model(tiny_model(tokenizer), tokenizer, root / "untrained")
    rows = {"question": [p.question for p in train] * 4, "completion": [ANSWER] * 32}
    Dataset.from_dict(rows).save_to_disk(str(root / "sft"))
    config = SFTConfig(
        train=TrainConfig(
            epochs=20, batch_size=8, learning_rate=1e-2, warmup_steps=2, checkpoint_every=1000
        )
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        good = sft.run(config, untrained, root / "sft", root / "good", NullTracker())
    finally:
        torch.set_num_threads(threads)
    spec = ModelConfig(
        hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32
    )
    judge = build_reward_model(spec, len(tokenizer), tokenizer.pad_token_id, seed=0)
    judge.save_pretrained(root / "judge")
    tokenizer.save_pretrained(root / "judge")
    return {
        "train": write_problems(root / "train.jsonl", train),
        "heldout": write_problems(root / "heldout.jsonl", heldout),
        "good": good.path,
        "untrained": untrained.path,
        "judge": root / "judge",
    }


def overrides(models) -> list[str]:
    files = f"{{train_path: {models['train']}, heldout_path: {models['heldout']}}}"
    return [
        "data.source=files",
        f"data.files={files}",
        "evaluation.max_problems=8",
        "evaluation.n_samples=2",
        "evaluation.k=2",
        "evaluation.temperature=0",
        "evaluation.max_new_tokens=16",
        "evaluation.general_prompts=4",
    ]


def register(paths: StatePaths, model_dir, alias: str) -> str:
    """Log and register a model folder from a run of its own, as the pipeline's stages do."""
    client = tracking_client(paths)
    run = client.create_run(experiment_id(client, NAME, paths), run_name=alias)
    version = register_model(client, run.info.run_id, model_dir, NAME, alias)
    finish_run(client, run.info.run_id)
    return str(version)


@pytest.fixture(scope="module")
def evaluations(prefect_server, models, tmp_path_factory):
    """Three evaluations of `r1-micro@final`: the good model twice, then the untrained one."""
    from flows.evaluate_registered import evaluate_registered

    state = tmp_path_factory.mktemp("state")
    mp = pytest.MonkeyPatch()
    mp.setenv("R1_STATE_DIR", str(state))
    mp.setenv("PREFECT_HOME", str(state / "prefect"))
    paths = StatePaths(state).ensure()
    versions = {"good": register(paths, models["good"], "final")}
    register(paths, models["judge"], "reward-model")
    kwargs = {"model": URI, "profile": "micro", "overrides": overrides(models), "max_drop": 0.02}
    first = evaluate_registered(**kwargs)
    second = evaluate_registered(**kwargs)
    versions["untrained"] = register(paths, models["untrained"], "final")
    third = evaluate_registered(**kwargs, return_state=True)
    yield {
        "paths": paths,
        "versions": versions,
        "first": first,
        "second": second,
        "third": third,
        "kwargs": kwargs,
    }
    mp.undo()


def history_rows(paths: StatePaths) -> list[tuple]:
    with duckdb.connect(str(paths.duckdb), read_only=True) as con:
        return con.execute(
            "SELECT mlflow_run_id, version, metric, value FROM eval_history ORDER BY evaluated_at"
        ).fetchall()


@pytest.mark.heavy
def test_an_evaluation_records_a_run_linked_to_the_registered_version(evaluations):
    paths, first = evaluations["paths"], evaluations["first"]
    client = MlflowClient(paths.tracking_uri)
    version = client.get_model_version(NAME, evaluations["versions"]["good"])
    run = client.get_run(first["mlflow_run_id"])
    assert client.get_experiment(run.info.experiment_id).name == f"{NAME}-evaluation"
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["model.name"] == NAME and tags["model.alias"] == "final"
    assert tags["model.version"] == str(version.version)
    assert tags["model.source_run_id"] == version.run_id
    assert tags["model.digest"] == first["model_digest"]
    assert tags["prefect.flow_run_id"] and tags["verdict"] == "ok"
    assert run.data.metrics["eval/pass_at_1"] == first["metrics"]["pass_at_1"] == 1.0
    assert {"eval/pass_at_2", "eval/format_rate", "eval/general_score"} <= set(run.data.metrics)
    assert {i.dataset.name for i in run.inputs.dataset_inputs} == {
        "problems-heldout",
        "general-eval_prompts",
    }
    assert first["previous"] is None
    rows = [r for r in history_rows(paths) if r[0] == first["mlflow_run_id"]]
    assert {(metric, value) for _, _, metric, value in rows} == set(first["metrics"].items())
    assert {v for _, v, _, _ in rows} == {str(version.version)}


@pytest.mark.heavy
def test_the_same_model_again_shows_no_regression(evaluations):
    first, second = evaluations["first"], evaluations["second"]
    assert second["previous_run_id"] == first["mlflow_run_id"]
    assert second["previous"] == first["metrics"] == second["metrics"]
    assert second["regressions"] == []


@pytest.mark.heavy
def test_a_worse_version_fails_the_flow_run_and_is_still_recorded(evaluations):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    paths, third = evaluations["paths"], evaluations["third"]
    assert third.is_failed()
    assert "pass_at_1 fell from 1.000 to 0.000 (allowed drop 0.020)" in third.message
    client = MlflowClient(paths.tracking_uri)
    runs = client.search_runs(
        [client.get_experiment_by_name(f"{NAME}-evaluation").experiment_id],
        filter_string=f"tags.`prefect.flow_run_id` = '{third.state_details.flow_run_id}'",
    )
    (run,) = runs
    assert run.info.status == "FAILED"
    assert run.data.tags["model.version"] == evaluations["versions"]["untrained"]
    assert "pass_at_1 fell from 1.000" in run.data.tags["regression"]
    assert run.data.tags["previous.run_id"] == evaluations["second"]["mlflow_run_id"]
    recorded = {(r[0], r[1]) for r in history_rows(paths)}
    assert (run.info.run_id, evaluations["versions"]["untrained"]) in recorded
    assert len({r[0] for r in history_rows(paths)}) == 3
    with get_client(sync_client=True) as prefect:
        found = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[third.state_details.flow_run_id])
            )
        )
    (report,) = [a for a in found if a.key == "evaluation-final"]
    assert "**Regression**" in report.data and "| pass_at_1 | 0.000 | 1.000 |" in report.data


@pytest.mark.heavy
def test_an_unknown_alias_or_model_is_a_clear_error(evaluations):
    paths = evaluations["paths"]
    client = tracking_client(paths)
    with pytest.raises(RegistryError, match=r"no alias 'nope' \(aliases: final, reward-model\)"):
        fetch(client, ModelSpec(NAME, alias="nope"), paths.root / "registry")
    with pytest.raises(RegistryError, match=r"no registered model 'r1-other'"):
        fetch(client, ModelSpec("r1-other", alias="final"), paths.root / "registry")


@pytest.mark.heavy
def test_the_flow_refuses_a_bad_uri_before_touching_the_stores(evaluations):
    from flows.evaluate_registered import evaluate_registered

    kwargs = evaluations["kwargs"] | {"model": f"models:/{NAME}/1"}
    state = evaluate_registered(**kwargs, return_state=True)
    assert state.is_failed() and "models:/NAME@ALIAS" in state.message


@pytest.mark.heavy
def test_a_version_without_a_model_is_refused(evaluations, tmp_path):
    from flows.evaluate_registered import evaluate_registered

    paths = evaluations["paths"]
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "not-a-model" / "README.md").write_text("no weights here\n", encoding="utf-8")
    register(paths, tmp_path / "not-a-model", "broken")
    kwargs = evaluations["kwargs"] | {"model": f"models:/{NAME}@broken"}
    state = evaluate_registered(**kwargs, return_state=True)
    assert state.is_failed() and "holds no saved model (no config.json" in state.message


@pytest.mark.heavy
def test_an_evaluation_that_breaks_leaves_a_failed_mlflow_run(evaluations, tmp_path):
    from flows.evaluate_registered import evaluate_registered

    paths = evaluations["paths"]
    bad = tmp_path / "bad.jsonl"  # there, so the preflight passes; no row loads in the flow
    bad.write_text("not json\n")
    files = f"{{train_path: {bad}, heldout_path: {bad}}}"
    kwargs = evaluations["kwargs"] | {"overrides": ["data.source=files", f"data.files={files}"]}
    state = evaluate_registered(**kwargs, return_state=True)
    assert state.is_failed() and "no usable rows" in state.message
    client = MlflowClient(paths.tracking_uri)
    (run,) = client.search_runs(
        [client.get_experiment_by_name(f"{NAME}-evaluation").experiment_id],
        filter_string=f"tags.`prefect.flow_run_id` = '{state.state_details.flow_run_id}'",
    )
    assert run.info.status == "FAILED"
    assert len({r[0] for r in history_rows(paths)}) == 3  # nothing recorded


@pytest.mark.heavy
def test_missing_data_files_stop_the_evaluation_before_it_starts(evaluations, tmp_path):
    from flows.evaluate_registered import evaluate_registered

    paths = evaluations["paths"]
    files = f"{{train_path: {tmp_path}/no.jsonl, heldout_path: {tmp_path}/no.jsonl}}"
    kwargs = evaluations["kwargs"] | {"overrides": ["data.source=files", f"data.files={files}"]}
    state = evaluate_registered(**kwargs, return_state=True)
    assert state.is_failed() and "2 local input(s) missing" in state.message
    assert f"data.files.heldout_path = {tmp_path}/no.jsonl" in state.message
    client = MlflowClient(paths.tracking_uri)
    runs = client.search_runs(
        [client.get_experiment_by_name(f"{NAME}-evaluation").experiment_id],
        filter_string=f"tags.`prefect.flow_run_id` = '{state.state_details.flow_run_id}'",
    )
    assert runs == []  # no MLflow run was opened


def test_the_regression_message_names_each_evaluations_own_run(tmp_path):
    from datetime import UTC, datetime

    from evaluation.verdict import EvaluationVerdict, regression_message
    from storage.eval_history import Evaluation
    from storage.model_registry import RegisteredModel

    model = RegisteredModel("r1-tiny", "final", "3", "source-run", tmp_path, "d" * 64)
    earlier = Evaluation(
        datetime.now(UTC), "r1-tiny", "final", "2", "c" * 64, "old-eval-run", "src", {}
    )
    verdict = EvaluationVerdict(model, "new-eval-run", {}, earlier, ["pass_at_1 0.70 -> 0.60"])
    message = regression_message(verdict)
    assert "version 3 (this evaluation: MLflow run new-eval-run)" in message
    assert "against version 2 (its evaluation: MLflow run old-eval-run)" in message


def test_the_verdict_line_says_held_regressed_or_first():
    from datetime import UTC, datetime

    from evaluation.verdict import EvaluationVerdict, verdict_line
    from storage.eval_history import Evaluation
    from storage.model_registry import RegisteredModel

    model = RegisteredModel("r1-micro", "final", "3", "source-run", None, "d" * 64)
    earlier = Evaluation(
        datetime.now(UTC), "r1-micro", "final", "2", "c", "old", "src", {"pass_at_1": 0.65}
    )
    now = {"pass_at_1": 0.64, "general_score": 1.2, "format_rate": 1.0}
    watched = {"pass_at_1": 0.02, "general_score": 0.02}
    held = verdict_line(EvaluationVerdict(model, "new", now, earlier), watched)
    assert held == (
        "models:/r1-micro@final v3 held against v2: pass_at_1 0.640 (was 0.650), "
        "general_score 1.200 (was -); a drop over 0.020 fails"
    )
    worse = EvaluationVerdict(model, "new", now, earlier, ["pass_at_1 fell"])
    assert " v3 regressed against v2: " in verdict_line(worse, watched)
    first = verdict_line(EvaluationVerdict(model, "new", now, None), watched)
    assert first == (
        "models:/r1-micro@final v3: first evaluation, nothing to compare "
        "(pass_at_1 0.640, general_score 1.200)"
    )


def flow_run_logs(mlflow_run_id: str, paths: StatePaths) -> list[str]:
    """The log lines of the flow run that recorded the evaluation `mlflow_run_id`."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    flow_run = MlflowClient(paths.tracking_uri).get_run(mlflow_run_id).data.tags
    with get_client(sync_client=True) as prefect:
        logs = prefect.read_logs(
            log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[flow_run["prefect.flow_run_id"]])
            )
        )
    # the copy sent to the server is wrapped to fit a terminal (tasks/progress.py): read it whole
    return [" ".join(log.message.split()) for log in logs]


@pytest.mark.heavy
def test_the_flow_runs_log_says_whether_the_model_held(evaluations):
    """What `--watch` and `r1 watch` print: the verdict, not only the artifact."""
    second = evaluations["second"]
    lines = flow_run_logs(second["mlflow_run_id"], evaluations["paths"])
    held = f"{URI} v{second['version']} held against v{second['previous_version']}: pass_at_1"
    assert any(line.startswith(f"record-evaluation: {held}") for line in lines), lines


@pytest.mark.heavy
def test_a_missing_model_is_an_error_that_names_the_command_for_a_registered_one(evaluations):
    """The nightly deployment on profile tiny, in a store where only micro's models exist: the
    error says which command evaluates them."""
    from flows.evaluate_registered import evaluate_registered

    kwargs = {k: v for k, v in evaluations["kwargs"].items() if k != "model"}
    state = evaluate_registered(**kwargs | {"profile": "tiny"}, return_state=True)
    assert state.is_failed()
    assert "no registered model 'r1-tiny' (registered: r1-micro)" in state.message
    assert (
        "prefect deployment run 'evaluate-model/final-nightly' --param profile=micro"
        in state.message
    )
    assert "--param model=models:/r1-micro@ALIAS" in state.message


def test_a_missing_alias_of_the_profiles_own_model_is_not_told_to_name_that_profile(tmp_path):
    """`--param profile=micro --param model=models:/r1-micro@nowhere` in a store that holds
    r1-micro (and r1-tiny): the hint says what evaluating profile micro does, not to name the
    profile the command already named, nor tiny's."""
    from tasks.scheduled_eval import retarget_hint

    paths = StatePaths(tmp_path / "state").ensure()
    client = tracking_client(paths)
    for name in ("r1-tiny", NAME):
        client.create_registered_model(name)
    hint = retarget_hint(ModelSpec(NAME, alias="nowhere"), "micro", paths)
    assert hint == (
        "Without --param model, profile 'micro' evaluates r1-micro@final: prefect deployment "
        "run 'evaluate-model/final-nightly' --param profile=micro (any alias of it: --param "
        "model=models:/r1-micro@ALIAS)"
    )
    hint = retarget_hint(ModelSpec("r1-other", alias="final"), "gpu-qwen", paths)
    assert "name its profile: prefect deployment run 'evaluate-model/final-nightly' " in hint
    assert "--param profile=micro" in hint or "--param profile=tiny" in hint


@pytest.mark.heavy
def test_without_a_model_the_profiles_final_model_is_evaluated(evaluations):
    from flows.evaluate_registered import evaluate_registered

    kwargs = {k: v for k, v in evaluations["kwargs"].items() if k != "model"}
    state = evaluate_registered(**kwargs, return_state=True)  # profile micro: r1-micro@final
    # the untrained version again: still a regression against the good one, not held against
    # its own regressed evaluation
    versions = evaluations["versions"]
    assert state.is_failed()
    assert f"{URI} version {versions['untrained']} (this evaluation" in state.message
    assert f"regressed against version {versions['good']}" in state.message


@pytest.mark.heavy
def test_an_evaluation_at_another_temperature_names_it_and_gives_no_verdict(evaluations, models):
    """The good model under an alias of its own, at temperature 0 and then at 3.0: a drop that
    compares unlike runs, named instead of judged (the flow run completes)."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from flows.evaluate_registered import evaluate_registered

    paths = evaluations["paths"]
    register(paths, models["good"], "hot")
    kwargs = evaluations["kwargs"] | {"model": f"models:/{NAME}@hot"}
    cool = evaluate_registered(**kwargs)
    hot = evaluate_registered(
        **kwargs | {"overrides": [*kwargs["overrides"], "evaluation.temperature=3.0"]}
    )
    assert hot["metrics"]["pass_at_1"] < cool["metrics"]["pass_at_1"] - 0.02  # a drop, unjudged
    assert hot["verdict"] == "settings-differ" and hot["regressions"] == []
    assert hot["previous"] is None and hot["unlike_run_id"] == cool["mlflow_run_id"]
    assert hot["settings_differ"] == ["temperature 0.0 -> 3.0"]
    run = MlflowClient(paths.tracking_uri).get_run(hot["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["verdict"] == "settings-differ"
    assert run.data.tags["settings.differ"] == "temperature 0.0 -> 3.0"
    assert run.data.params["settings.temperature"] == "3.0"
    lines = flow_run_logs(hot["mlflow_run_id"], paths)
    said = f"models:/{NAME}@hot v{hot['version']}: no verdict, settings differ from "
    assert any(said in line and "temperature 0.0 -> 3.0" in line for line in lines), lines
    flow_run_id = run.data.tags["prefect.flow_run_id"]
    with get_client(sync_client=True) as prefect:
        found = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    (report,) = [a for a in found if a.key == "evaluation-hot"]
    assert "**No verdict**" in report.data and "- temperature 0.0 -> 3.0" in report.data
