"""Runs deleted from the MLflow store as its UI deletes them (`delete_run`), then collected with
their files (`mlflow gc`): a registered version they logged is refused in one sentence saying
what to run, the pipeline's run context says which runs it no longer holds, and the report's
note on a stage from the cache names a pipeline run that is gone instead of failing."""

import pytest
from click.testing import CliRunner
from mlflow import MlflowClient
from mlflow.cli import gc

from storage.model_registry import ModelSpec, RegistryError, SourceRunGone, fetch
from storage.paths import StatePaths
from storage.tracking import experiment_id, finish_run, register_model, tracking_client
from tasks.context import RunContext
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
