"""A finished stage whose files were deleted (its stage folder, or only its model, removed to free
disk) is computed again into the same stage folder, on a real Prefect server, instead of being
handed to the next stage as if whole; a stage whose files are all there still comes from the
cache."""

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from prefect import flow

from storage.paths import StatePaths
from storage.tracking import experiment_id, tracking_client
from tasks import stage_cache
from tasks.context import RunContext
from tasks.stage_cache import stage_task

pytestmark = pytest.mark.usefixtures("prefect_server")


@dataclass(frozen=True)
class Made:
    """A stage's output: a folder with one file in it, as a saved model."""

    folder: Path


def count_run(ctx: RunContext, name: str) -> int:
    counter = ctx.state_root / f"{name}.runs"
    runs = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(runs))
    return runs


@stage_task("make-model", stage="maker")
def maker(ctx: RunContext) -> Made:
    count_run(ctx, "maker")
    folder = ctx.stage_dir("maker") / "model"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_text("weights")
    (ctx.stage_dir("maker") / "checkpoints").mkdir(exist_ok=True)
    (ctx.stage_dir("maker") / "checkpoints" / "last").write_text("step 1")
    return Made(folder)


@stage_task("use-model", stage="user")
def user(ctx: RunContext, made: Made) -> str:
    count_run(ctx, "user")
    return (made.folder / "weights.bin").read_text()


@flow(name="make-then-use")
def make_then_use(state: str, keep: bool = False) -> Made:
    ctx = RunContext(Path(state), "parent", "flow-run", "r1-test", keep_finished=keep)
    made = maker(ctx)
    user(ctx, made)
    return made


def runs(state: Path, name: str) -> int:
    return int((state / f"{name}.runs").read_text())


@pytest.mark.parametrize("deleted", ["stage folder", "model folder", "model's files"])
def test_a_finished_stage_whose_files_were_deleted_is_computed_again(
    tmp_path, code_version, caplog, deleted
):
    code_version("v1")
    made = make_then_use(str(tmp_path))
    if deleted == "stage folder":
        shutil.rmtree(made.folder.parent)
    elif deleted == "model folder":
        shutil.rmtree(made.folder)
    else:
        (made.folder / "weights.bin").unlink()
    again = make_then_use(str(tmp_path))
    assert again.folder == made.folder  # the same key, the same stage folder
    assert (again.folder / "weights.bin").read_text() == "weights"
    assert runs(tmp_path, "maker") == 2
    assert f"maker: its finished result names {made.folder}, which is gone" in caplog.text
    assert runs(tmp_path, "user") == 1  # the same output: the next stage stays cached
    make_then_use(str(tmp_path))  # whole again: from the cache
    assert runs(tmp_path, "maker") == 2


def test_a_whole_stage_comes_from_the_cache(tmp_path, code_version):
    code_version("v1")
    made = make_then_use(str(tmp_path))
    shutil.rmtree(made.folder.parent / "checkpoints")  # what the result does not name
    make_then_use(str(tmp_path))
    assert runs(tmp_path, "maker") == 1


def test_keep_finished_keeps_no_result_whose_files_are_gone(tmp_path, code_version):
    code_version("v1")
    made = make_then_use(str(tmp_path))
    shutil.rmtree(made.folder)
    code_version("v2")
    again = make_then_use(str(tmp_path), keep=True)
    assert runs(tmp_path, "maker") == 2  # not kept: computed under the code as it is now
    assert (again.folder / "weights.bin").exists()


def test_missing_files_reads_every_path_a_result_names(tmp_path):
    there, empty = tmp_path / "there.txt", tmp_path / "empty"
    there.write_text("x")
    empty.mkdir()
    gone = tmp_path / "gone.parquet"
    result = {"made": Made(tmp_path), "paths": [there, (empty, gone)], "n": 3}
    assert stage_cache.missing_files(result) == [empty, gone]
    assert stage_cache.missing_files("no paths") == []


@dataclass(frozen=True)
class Logged:
    """A stage's output as its MLflow run recorded it (`stage_cache.Recorded`)."""

    run_id: str


@stage_task("log-stage", stage="logger")
def logger_stage(ctx: RunContext) -> Logged:
    count_run(ctx, "logger")
    client = ctx.client()
    experiment = experiment_id(client, "r1-test", ctx.paths)
    return Logged(client.create_run(experiment, run_name="logger").info.run_id)


@flow(name="log-one")
def log_one(state: str) -> Logged:
    return logger_stage(RunContext(Path(state), "parent", "flow-run", "r1-test"))


def test_a_finished_stage_whose_mlflow_run_was_deleted_is_computed_again(
    tmp_path, code_version, caplog
):
    code_version("v1")
    StatePaths(tmp_path).ensure()
    first = log_one(str(tmp_path))
    assert log_one(str(tmp_path)) == first  # from the cache
    tracking_client(StatePaths(tmp_path)).delete_run(first.run_id)  # as the MLflow UI does
    again = log_one(str(tmp_path))
    assert again != first and runs(tmp_path, "logger") == 2
    assert f"logger: its finished result names MLflow run {first.run_id}, which is gone" in (
        caplog.text
    )
