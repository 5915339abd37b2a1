"""A stage killed with SIGKILL leaves its MLflow run RUNNING and its Prefect task run Running;
the retried attempt closes both: the stage run is resumed (its earlier attempt recorded as
killed, its curve going on in the same run) and the task run is marked Crashed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow import MlflowClient

from storage.paths import StatePaths
from storage.tracking import experiment_id, stage_run, start_pipeline_run, tracking_client

# Heavy: real processes killed with SIGKILL.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]
KEY = "k" * 64

STAGE_PROCESS = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from storage.paths import StatePaths
    from storage.tracking import stage_run, tracking_client
    client = tracking_client(StatePaths(Path(sys.argv[1])))
    with stage_run(client, sys.argv[2], "reasoning_rl", {"steps": 5}, sys.argv[3]) as run:
        for step in (1, 2, 3):
            run.log_metrics({"reward/mean": step / 10}, step)
        print(run.run_id, flush=True)
        time.sleep(600)
    """
)


def test_a_killed_stage_run_is_resumed_by_the_retry_with_one_whole_curve(tmp_path):
    paths = StatePaths(tmp_path / "state").ensure()
    client = tracking_client(paths)
    parent = start_pipeline_run(
        client, experiment_id(client, "r1-kill", paths), "r1_pipeline-kill", "flow-1", {}
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGE_PROCESS, str(paths.root), parent, KEY],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    killed_run = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert client.get_run(killed_run).info.status == "RUNNING"  # what a kill leaves

    with stage_run(client, parent, "reasoning_rl", {"steps": 5}, KEY) as run:
        assert run.run_id == killed_run
        for step in (3, 4, 5):  # resumed from its checkpoint after step 2
            run.log_metrics({"reward/mean": step / 10}, step)
    runs = MlflowClient(paths.tracking_uri).search_runs(
        [client.get_run(parent).info.experiment_id],
        filter_string="tags.`r1.stage` = 'reasoning_rl'",
    )
    assert [r.info.run_id for r in runs] == [killed_run]
    (resumed,) = runs
    assert resumed.info.status == "FINISHED"
    assert resumed.data.tags["r1.attempts"] == "2"
    assert resumed.data.tags["r1.attempt.1"].startswith("killed")
    steps = {m.step for m in client.get_metric_history(killed_run, "reward/mean")}
    assert steps == {1, 2, 3, 4, 5}


def test_a_failed_attempt_is_resumed_with_its_error_recorded_and_a_new_key_starts_fresh(tmp_path):
    paths = StatePaths(tmp_path / "state").ensure()
    client = tracking_client(paths)
    parent = start_pipeline_run(
        client, experiment_id(client, "r1-fail", paths), "r1_pipeline-fail", "flow-1", {}
    )
    with pytest.raises(RuntimeError), stage_run(client, parent, "mixed_sft", {}, KEY):
        raise RuntimeError("disk full")
    with stage_run(client, parent, "mixed_sft", {}, KEY) as again:
        pass
    run = client.get_run(again.run_id)
    assert run.data.tags["r1.attempt.1"] == "failed: RuntimeError: disk full"
    assert "r1.error" not in run.data.tags and run.info.status == "FINISHED"
    with stage_run(client, parent, "mixed_sft", {}, "other" * 8) as other:
        assert other.run_id != again.run_id  # other settings: a stage run of its own
    with stage_run(client, parent, "mixed_sft", {}, KEY) as third:
        assert third.run_id != again.run_id  # a finished run is never reopened


def test_the_retry_marks_task_runs_the_killed_attempt_left_running_crashed():
    from prefect import flow, get_client, task
    from prefect.states import Running

    from tasks.pipeline import crash_leftover_task_runs
    from tests.prefect_harness import prefect_harness

    @flow
    def pipeline() -> None:
        """A flow for the server to hold a run of; it never runs here."""

    @task
    def stage() -> None:
        """A task for the server to hold a run of; it never runs here."""

    with (
        prefect_harness(),
        get_client(sync_client=True) as client,
    ):
        flow_run = client.create_flow_run(pipeline)
        left = client.create_task_run(stage, flow_run.id, "0", state=Running())
        assert client.read_task_run(left.id).state.type.value == "RUNNING"
        assert crash_leftover_task_runs(str(flow_run.id)) == [left.name]
        assert client.read_task_run(left.id).state.type.value == "CRASHED"
