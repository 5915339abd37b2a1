"""A stage run resumed after a failure or a kill: one MLflow run, one point per step, and the
time of every attempt, against a real SQLite store."""

import time

import pytest
from mlflow import MlflowClient

from storage.paths import StatePaths
from storage.tracking import (
    ATTEMPT_SECONDS,
    ATTEMPTS_TAG,
    experiment_id,
    stage_run,
    start_pipeline_run,
    tracking_client,
)

KEY = "k" * 64
STAGE = "reasoning_rl"


@pytest.fixture
def store(tmp_path) -> tuple[MlflowClient, str]:
    paths = StatePaths(tmp_path / "state").ensure()
    client = tracking_client(paths)
    experiment = experiment_id(client, "r1-test", paths)
    return client, start_pipeline_run(client, experiment, "pipeline", "flow-1", {})


def points(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def log_steps(tracker, steps: range) -> None:
    for step in steps:
        tracker.log_metrics({"reward/mean": step / 10, "progress/fraction": step / 4}, step)


def test_a_resumed_stage_logs_each_step_once_and_counts_both_attempts(store):
    client, parent = store
    with (
        pytest.raises(RuntimeError, match="died at step 2"),
        stage_run(client, parent, STAGE, {}, KEY) as first,
    ):
        log_steps(first, range(1, 3))  # steps 1 and 2; the checkpoint holds step 1
        time.sleep(0.2)
        raise RuntimeError("died at step 2")
    with stage_run(client, parent, STAGE, {}, KEY) as second:
        assert second.run_id == first.run_id and second.attempts.number == 2
        assert second.attempts.earlier_seconds >= 0.2
        log_steps(second, range(2, 5))  # resumed from step 1: step 2 again, then 3 and 4
        second.log_metrics({"data/rows": 7.0})  # a stage's figure, at step 0, is logged again
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[ATTEMPTS_TAG] == "2"
    assert points(client, run.info.run_id, "progress/fraction") == [
        (1, 0.25),
        (2, 0.5),
        (3, 0.75),
        (4, 1.0),
    ]
    assert [step for step, _ in points(client, run.info.run_id, "reward/mean")] == [1, 2, 3, 4]
    (failed,) = points(client, run.info.run_id, ATTEMPT_SECONDS)
    assert failed[0] == 1 and failed[1] >= 0.2


def test_a_killed_attempt_counts_until_its_last_record(store):
    """A process killed mid-stage leaves its run RUNNING; the retry counts that attempt from its
    start to its last metric."""
    client, parent = store
    began = time.time()
    generator = stage_run(client, parent, STAGE, {}, KEY)
    tracker = generator.__enter__()  # never exited: the process "died" here
    time.sleep(0.3)
    log_steps(tracker, range(1, 4))
    worked = time.time() - began
    time.sleep(1.0)  # time after the last record is not counted
    with stage_run(client, parent, STAGE, {}, KEY) as resumed:
        assert resumed.run_id == tracker.run_id
        assert 0.3 <= resumed.attempts.earlier_seconds <= worked + 0.01
        assert resumed.attempts.last_steps["reward/mean"] == 3
        log_steps(resumed, range(3, 5))
    run = client.get_run(tracker.run_id)
    assert run.data.tags["r1.attempt.1"].startswith("killed")
    assert [s for s, _ in points(client, run.info.run_id, "reward/mean")] == [1, 2, 3, 4]
