"""A shell that names another MLflow store (`MLFLOW_REGISTRY_URI`, `MLFLOW_TRACKING_URI`, as a
machine set up for other work has them): the state folder's store keeps the runs and the
registered models, and `r1 lineage` finds them there."""

import os
import sqlite3
from pathlib import Path

import pytest

from cli.main import main
from storage import store
from storage.paths import StatePaths
from storage.tracking import (
    experiment_id,
    register_model,
    stage_run,
    start_pipeline_run,
    tracking_client,
)

# `r1` points the process environment at its state folder: each test gets its own copy.
pytestmark = pytest.mark.usefixtures("private_environment")

DIGEST = "ab" * 32


def registered(db: Path) -> list[tuple[str, str]]:
    """(name, version) of each model version the SQLite store `db` holds."""
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT name, version FROM model_versions").fetchall()
    finally:
        con.close()


def test_models_are_registered_in_the_state_folders_store_whatever_the_shell_names(
    tmp_path, monkeypatch, capsys
):
    other = tmp_path / "other" / "mlflow.db"
    other.parent.mkdir()
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", f"sqlite:///{other}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other}")
    paths = StatePaths(tmp_path / "state").ensure()
    client = tracking_client(paths)
    parent = start_pipeline_run(
        client, experiment_id(client, "r1-test", paths), "r1_pipeline-test", "flow-1", {}
    )
    model_dir = paths.root / "model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"tiny")
    with stage_run(client, parent, "bootstrap", {}) as tracker:
        register_model(client, tracker.run_id, model_dir, "r1-test", "bootstrap")
        store.record_lineage(paths.duckdb, "runs/bootstrap/model", "model", DIGEST, "bootstrap",
                             tracker.run_id, [])  # fmt: skip

    assert registered(paths.mlflow_db) == [("r1-test", 1)]
    assert not other.exists()  # nothing went to the store the shell named
    assert main(["lineage", "models:/r1-test@bootstrap", "--state-dir", str(paths.root)]) == 0
    assert f"run {tracker.run_id} (bootstrap)" in capsys.readouterr().out


def test_a_shell_setting_that_names_another_store_is_said_not_to_be_used(tmp_path, monkeypatch):
    from cli.environment import prepare_environment, unused_mlflow_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5099")
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", "sqlite:///state/mlflow.db")  # the same store
    paths = prepare_environment("state")
    assert unused_mlflow_settings(paths, os.environ) == [
        "mlflow: MLFLOW_TRACKING_URI=http://127.0.0.1:5099 is not used: the run's runs and "
        f"models go to the state folder's store, sqlite:///{tmp_path / 'state' / 'mlflow.db'}"
    ]
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert unused_mlflow_settings(prepare_environment("state"), os.environ) == []
