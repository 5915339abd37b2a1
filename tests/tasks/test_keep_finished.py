"""`cache.keep_finished`: a stage that finished under earlier code is taken from the cache, on a
real Prefect server, while a stage that never finished runs under the code as it is now; a state
folder made again where one was removed takes nothing from the old one's results."""

import shutil
from pathlib import Path

import pytest
from prefect import flow

from tasks import stage_cache
from tasks.context import RunContext
from tasks.stage_cache import finished_key, remember_key, stage_task

pytestmark = pytest.mark.usefixtures("prefect_server")


@stage_task("made-under", stage="first")
def first(ctx: RunContext) -> str:
    """Counts its runs in the state folder; its result says the code it ran under."""
    counter = ctx.state_root / "first.runs"
    counter.write_text(str(int(counter.read_text()) + 1 if counter.exists() else 1))
    return stage_cache.code_version()


@stage_task("then", stage="second")
def second(ctx: RunContext, made_under: str, fail: bool) -> str:
    if fail:
        raise RuntimeError("second: the bug")
    return f"{made_under} then {stage_cache.code_version()}"


@flow(name="two-stages")
def two_stages(state: str, keep: bool = False, fail: bool = False) -> str:
    ctx = RunContext(Path(state), "parent", "flow-run", "r1-test", keep_finished=keep)
    return second(ctx, first(ctx), fail)


def runs_of_first(state: Path) -> int:
    return int((state / "first.runs").read_text())


def test_a_stage_finished_under_earlier_code_is_kept_the_failed_one_runs(tmp_path, code_version):
    code_version("v1")
    with pytest.raises(RuntimeError, match="the bug"):
        two_stages(str(tmp_path), fail=True)
    assert runs_of_first(tmp_path) == 1
    code_version("v2")  # the fix
    assert two_stages(str(tmp_path), keep=True) == "v1 then v2"
    assert runs_of_first(tmp_path) == 1


def test_without_it_a_code_change_runs_every_stage_again(tmp_path, code_version):
    code_version("v1")
    assert two_stages(str(tmp_path)) == "v1 then v1"
    code_version("v2")
    assert two_stages(str(tmp_path)) == "v2 then v2"
    assert runs_of_first(tmp_path) == 2


def test_the_latest_finished_result_is_kept(tmp_path, code_version):
    for version in ("v1", "v2"):
        code_version(version)
        with pytest.raises(RuntimeError):
            two_stages(str(tmp_path), fail=True)
    code_version("v3")
    assert two_stages(str(tmp_path), keep=True) == "v2 then v3"
    code_version("v3")  # the same code again: its own results, as without the setting
    assert two_stages(str(tmp_path), keep=True) == "v2 then v3"
    assert runs_of_first(tmp_path) == 2


def test_refreshing_the_cache_keeps_nothing(tmp_path, code_version):
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE, temporary_settings

    code_version("v1")
    two_stages(str(tmp_path))
    code_version("v2")
    with temporary_settings({PREFECT_TASKS_REFRESH_CACHE: True}):
        assert two_stages(str(tmp_path), keep=True) == "v2 then v2"
    assert runs_of_first(tmp_path) == 2


def test_the_index_names_the_most_recently_used_key_with_a_result(tmp_path):
    index = tmp_path / "stage_keys"
    assert finished_key(index, "inputs", lambda key: True) is None
    for key in ("old", "mid", "new"):
        remember_key(index, "inputs", key)
    with_results = {"old", "mid"}
    assert finished_key(index, "inputs", with_results.__contains__) == "mid"
    remember_key(index, "inputs", "old")  # used again: now the latest
    assert finished_key(index, "inputs", with_results.__contains__) == "old"
    assert finished_key(index, "other inputs", with_results.__contains__) is None


def test_an_index_that_cannot_be_written_leaves_the_cache_working(tmp_path, code_version, caplog):
    (tmp_path / "stage_keys").write_text("not a folder")
    code_version("v1")
    assert two_stages(str(tmp_path), keep=True) == "v1 then v1"
    assert two_stages(str(tmp_path), keep=True) == "v1 then v1"
    assert runs_of_first(tmp_path) == 1  # from the cache, as without the index
    assert "first: its key is not noted in" in caplog.text


@pytest.mark.parametrize("keep", [False, True])
def test_a_state_folder_made_again_at_the_same_path_runs_its_stages_again(
    tmp_path, code_version, keep
):
    """Prefect keeps the results outside the state folder here (as under a PREFECT_HOME set
    elsewhere); the files they name went with the old folder."""
    state = tmp_path / "state"
    code_version("v1")
    for _ in range(2):
        state.mkdir()
        assert two_stages(str(state), keep=keep) == "v1 then v1"
        assert runs_of_first(state) == 1
        shutil.rmtree(state)
