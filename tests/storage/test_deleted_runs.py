"""What a user deletes between runs, in the MLflow store and beside it: runs deleted as its UI
deletes them (`delete_run`), then collected with their files (`mlflow gc`); a registered version
or an alias deleted in the UI; the DuckDB file. A registered version whose run is gone is refused
in one sentence saying what to run, the pipeline's run context says what of a stage's result the
store no longer holds, the report's note on a stage from the cache names a pipeline run that is
gone instead of failing, and the nightly evaluation and `r1 lineage` say what is gone and what
to run."""

import shutil

import pytest
from click.testing import CliRunner
from mlflow import MlflowClient
from mlflow.cli import gc

from models.saved import ModelRef
from storage.model_registry import ModelSpec, RegistryError, SourceRunGone, fetch
from storage.paths import StatePaths
from storage.tracking import experiment_id, finish_run, register_model, tracking_client
from tasks.context import RunContext, StageResult
from tasks.pipeline import cache_note

NAME = "r1-micro"


@pytest.fixture
def paths(tmp_path) -> StatePaths:
    return StatePaths(tmp_path / "state").ensure()


def logged_run(paths: StatePaths, model_dir=None) -> str:
    """A finished run of its own; with `model_dir`, its model registered as `NAME@final`."""
    client = tracking_client(paths)
    run_id = client.create_run(experiment_id(client, NAME, paths), run_name="stage").info.run_id
    if model_dir is not None:
        register_model(client, run_id, model_dir, NAME, "final")
    finish_run(client, run_id)
    return run_id


def delete(paths: StatePaths, run_id: str, collect: bool = True) -> None:
    """What the MLflow UI's delete does, then `mlflow gc` on the store."""
    tracking_client(paths).delete_run(run_id)
    if collect:
        done = CliRunner().invoke(
            gc, ["--backend-store-uri", paths.tracking_uri, "--tracking-uri", paths.tracking_uri]
        )
        assert done.exit_code == 0, done.output


def saved_model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_a_version_whose_run_was_deleted_and_collected_is_refused_naming_what_to_run(
    paths, tmp_path
):
    run_id = logged_run(paths, saved_model(tmp_path))
    client, spec = tracking_client(paths), ModelSpec(NAME, alias="final")
    delete(paths, run_id, collect=False)  # only marked deleted: its files are still there
    assert (fetch(client, spec, tmp_path / "registry").path / "config.json").exists()
    delete(paths, run_id)
    with pytest.raises(SourceRunGone) as refused:
        fetch(client, spec, tmp_path / "registry-after")
    assert isinstance(refused.value, RegistryError)
    assert str(refused.value) == (
        f"models:/{NAME}@final is version 1, whose MLflow run {run_id} is deleted from the store "
        "with its files (mlflow gc): run the pipeline again with the same settings (r1 run) to "
        "compute that stage again and register its model anew, or point the alias at another "
        "version"
    )


def test_the_run_context_holds_only_runs_the_store_keeps(paths):
    ctx = RunContext(paths.root, "parent", "flow-run", NAME)
    kept, marked, collected = (logged_run(paths) for _ in range(3))
    delete(paths, marked, collect=False)
    delete(paths, collected)
    assert ctx.holds_run(kept)
    assert not ctx.holds_run(marked)
    assert not ctx.holds_run(collected)


def test_a_stage_cached_from_a_pipeline_run_that_is_gone_is_noted_so(paths):
    ctx = RunContext(paths.root, logged_run(paths), "flow-run", NAME)
    origin = logged_run(paths)
    delete(paths, origin)
    client = MlflowClient(paths.tracking_uri)
    assert cache_note(client, ctx, "bootstrap", origin) == {
        "cached from run": f"{origin[:8]} (deleted)"
    }


def test_a_stage_whose_registered_version_was_deleted_is_not_whole(paths, tmp_path):
    """The MLflow UI deletes a version: the cached stage would never put its alias back."""
    model = saved_model(tmp_path)
    run_id = logged_run(paths, model)
    ctx = RunContext(paths.root, "parent", "flow-run", NAME)
    result = StageResult("all_scenarios_rl", run_id, ModelRef(model), 1.0, "digest")
    assert ctx.unrecorded(result) == []
    tracking_client(paths).delete_model_version(NAME, "1")
    assert ctx.unrecorded(result) == [f"the registered version of {NAME} from run {run_id}"]
    delete(paths, run_id)
    assert ctx.unrecorded(result) == [f"MLflow run {run_id}"]


def test_the_nightly_evaluation_of_an_alias_deleted_in_the_ui_says_the_run_that_puts_it_back(
    paths, tmp_path
):
    from tasks.scheduled_eval import retarget_hint

    logged_run(paths, saved_model(tmp_path))
    tracking_client(paths).delete_registered_model_alias(NAME, "final")
    hint = retarget_hint(ModelSpec(NAME, alias="final"), "micro", paths)
    assert hint.startswith(
        "A run of profile 'micro' with the same settings puts its aliases back on its models "
        "(r1 run --profile micro;"
    )
    assert hint.endswith(f"--param model=models:/{NAME}@ALIAS")


def test_lineage_with_its_duckdb_file_deleted_says_what_is_gone_and_what_to_run(
    paths, tmp_path, capsys
):
    from cli.lineage import lineage_command

    logged_run(paths, saved_model(tmp_path))
    assert not paths.duckdb.exists()  # deleted, or as here never written
    assert lineage_command(f"models:/{NAME}@final", str(paths.root)) == 2
    said = capsys.readouterr().err.splitlines()[-1]  # after MLflow's own lines on its store
    assert said.startswith(
        f"r1: no DuckDB file at {paths.duckdb}, so models:/{NAME}@final cannot be followed: its "
        "lineage rows were deleted."
    )
    assert "PREFECT_TASKS_REFRESH_CACHE=true" in said


def test_lineage_marks_the_files_and_runs_that_are_gone(paths, tmp_path, capsys):
    from cli.lineage import lineage_command
    from storage import store

    stage_folder = paths.runs / "bootstrap" / "0123456789abcdef"
    model = stage_folder / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    run_id = logged_run(paths, model)
    problems = paths.runs / "problems" / "train.jsonl"
    store.record_lineage(paths.duckdb, str(problems), "problems", "p" * 64, "problems", "gone", [])
    store.record_lineage(
        paths.duckdb, str(model), "model", "m" * 64, "bootstrap", run_id, ["p" * 64]
    )
    shutil.rmtree(stage_folder)  # to free disk
    assert lineage_command(f"models:/{NAME}@final", str(paths.root)) == 0
    out = capsys.readouterr().out
    assert f"run {run_id} (stage)  {model} (gone)" in out
    assert f"run gone (not in the MLflow store)  {problems} (gone)" in out
    assert "runs not in the MLflow store: gone" in out
    assert "files gone: 2; a run with the same settings computes again" in out


def test_a_version_whose_files_alone_were_deleted_is_refused_and_its_stage_not_whole(
    paths, tmp_path
):
    """`mlartifacts/` deleted to free disk, the runs and versions left in `mlflow.db`."""
    model = saved_model(tmp_path)
    run_id = logged_run(paths, model)
    ctx = RunContext(paths.root, "parent", "flow-run", NAME)
    result = StageResult("all_scenarios_rl", run_id, ModelRef(model), 1.0, "digest")
    assert ctx.unrecorded(result) == []
    shutil.rmtree(paths.mlflow_artifacts)
    assert ctx.unrecorded(result) == [f"the files of {NAME} version 1"]
    with pytest.raises(SourceRunGone, match=r"^models:/r1-micro@final is version 1, whose files"):
        fetch(tracking_client(paths), ModelSpec(NAME, alias="final"), tmp_path / "registry")
    assert not (tmp_path / "registry" / NAME).exists() or not any(
        (tmp_path / "registry" / NAME).iterdir()
    )
