"""The lines `r1 run` ends with: each whole on a narrow terminal, and the MLflow UI command one
to paste as printed, whatever the state folder's path holds (spaces, `#`, `%20`, non-ASCII)."""

from __future__ import annotations

import io
import shlex

from mlflow.tracking import MlflowClient
from rich.console import Console

from cli.main import print_whole, where_lines
from storage.paths import StatePaths

URL = "http://127.0.0.1:5000/#/experiments/1/runs/abc?workflowType=machine_learning"


def test_the_ui_command_opens_the_state_folders_store_whatever_its_path(tmp_path):
    paths = StatePaths(tmp_path / "my runs" / "état #1%20x")
    paths.root.mkdir(parents=True)
    made = MlflowClient(paths.tracking_uri).create_experiment("r1-where")
    (ui,) = [line for line in where_lines(paths, "abc", URL) if line.startswith("MLflow UI:")]
    argv = shlex.split(ui.removeprefix("MLflow UI:"))
    assert argv[0].endswith("mlflow") and argv[1:3] == ["ui", "--backend-store-uri"]
    (uri,) = argv[3:]
    assert MlflowClient(uri).get_experiment_by_name("r1-where").experiment_id == made
    assert (paths.root / "mlflow.db").exists()


def test_each_line_is_printed_whole_on_a_narrow_terminal(tmp_path):
    paths = StatePaths(tmp_path / ("a-long-folder-name-" * 4))
    out = io.StringIO()
    lines = [*where_lines(paths, "abc", URL), "[bold]not markup[/bold]"]
    print_whole(Console(file=out, width=40), lines)
    assert out.getvalue().splitlines() == lines
