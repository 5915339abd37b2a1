"""A state folder moved or copied: MLflow keeps its experiments' artifact folder as an absolute
path, so the store's check refuses it in one line, naming the old folder, until it is moved back
or the old path leads to it through a symlink."""

import shutil

import pytest

from storage.paths import StatePaths
from storage.tracking import (
    TrackingStoreError,
    check_tracking_store,
    experiment_id,
    register_model,
    start_pipeline_run,
    tracking_client,
)


def made_store(root) -> StatePaths:
    """A state folder whose store holds the project's experiment, a run and a registered model,
    as a pipeline run leaves it (and MLflow's own Default experiment, kept elsewhere)."""
    paths = StatePaths(root)
    check_tracking_store(paths)
    paths.ensure()
    client = tracking_client(paths)
    experiment = experiment_id(client, "r1-test", paths)
    run_id = start_pipeline_run(client, experiment, "pipeline", "flow-1", {})
    model = root / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"w")
    register_model(client, run_id, model, "r1-test", "final")
    return paths


def test_a_copied_or_moved_state_folder_is_refused_until_the_old_path_leads_to_it(tmp_path):
    old = made_store(tmp_path / "old")
    check_tracking_store(old)  # where it was made: fine

    copy = StatePaths(tmp_path / "copy")
    shutil.copytree(old.root, copy.root, symlinks=True)
    with pytest.raises(TrackingStoreError) as info:
        check_tracking_store(copy)
    message = str(info.value)
    assert "\n" not in message
    assert f"moved or copied from {old.root}; move it back, or make {old.root} a symlink" in message

    shutil.rmtree(old.root)  # the recovery: the old path a symlink to the folder as it is now
    old.root.symlink_to(copy.root)
    check_tracking_store(copy)
    client = tracking_client(copy)
    version = client.get_model_version_by_alias("r1-test", "final")
    source = client.download_artifacts(version.run_id, "model", str(tmp_path / "fetched"))
    assert (tmp_path / "fetched" / "model" / "weights.bin").read_bytes() == b"w", source


def test_experiments_kept_outside_any_state_folder_are_left_alone(tmp_path):
    paths = made_store(tmp_path / "state")
    client = tracking_client(paths)
    client.create_experiment("mine", artifact_location=(tmp_path / "elsewhere").as_uri())
    check_tracking_store(paths)
