"""`r1 run` killed with SIGKILL mid-stage (the command and everything it started, as when its
machine goes down), then the same command again, its logging intervals changed (settings that
say how often a stage logs or saves, no part of what it asks for): it resumes, and leaves the
record a Prefect retry leaves. One parent run and one run per stage, none left RUNNING; the
stage's curve whole, one point per step from 1; its description summing up every step; its
time, and the report's, over both attempts; the killed attempt's Prefect flow run and task runs
marked Crashed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tasks.run_pages import RUN_DESCRIPTION_TAG, curve_keys, curves_summary, run_history

# Slow: two micro pipeline runs through the command line, the first killed mid-stage.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
R1 = Path(sys.executable).parent / "r1"
STAGE = "reasoning_rl"
STEPS = 20  # micro's stage 3 checkpoints every step; enough steps to kill it mid-way
COMMAND = [
    str(R1), "run", "--profile", "micro",
    "--set", f"{STAGE}.steps={STEPS}", "--set", f"{STAGE}.checkpoint_every=1",
]  # fmt: skip
AGAIN = COMMAND + [
    "--set", f"{STAGE}.samples_every=2", "--set", "cold_start_sft.train.log_every=2",
]  # fmt: skip
WAIT = 900.0  # seconds for the first run to reach the stage's third step on a busy 2-core box


def all_runs(client: MlflowClient) -> list:
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def stage_points(client: MlflowClient) -> int:
    """How many steps the stage has logged so far (0 before it starts)."""
    runs = [r for r in all_runs(client) if r.data.tags.get("r1.stage") == STAGE]
    if not runs:
        return 0
    return len(client.get_metric_history(runs[0].info.run_id, "reward/mean"))


def kill_mid_stage(env: dict[str, str], client: MlflowClient, log: Path) -> None:
    """Start the command; SIGKILL its whole session once the stage has logged three steps."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            COMMAND, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + WAIT
        while stage_points(client) < 3:
            assert proc.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, (
                f"the stage never reached step 3:\n{log.read_text()[-3000:]}"
            )
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert stage_points(client) < STEPS, "the stage ended before the kill"


def running_prefect_runs(state: Path) -> list[tuple[str, str]]:
    """The flow runs and task runs Prefect's database still holds Running."""
    with sqlite3.connect(state / "prefect" / "prefect.db") as db:
        return [
            (table, name)
            for table in ("flow_run", "task_run")
            for (name,) in db.execute(f"select name from {table} where state_type = 'RUNNING'")
        ]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, MlflowClient, str]:
    """The killed run and the same command again; the state folder, a client, the second run's
    output."""
    tmp = tmp_path_factory.mktemp("resume")
    state = tmp / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"PREFECT_HOME": str(state / "prefect"), "R1_STATE_DIR": str(state)}
    state.mkdir()
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    kill_mid_stage(env, client, tmp / "killed.log")
    assert [r.info.status for r in all_runs(client) if r.data.tags.get("r1.stage") == STAGE] == [
        "RUNNING"
    ]  # what the kill leaves
    again = subprocess.run(AGAIN, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output[-5000:]
    return state, client, output


def test_no_run_is_left_running_and_each_stage_has_one_run(resumed):
    state, client, output = resumed
    runs = all_runs(client)
    assert not [
        (r.data.tags.get("r1.stage"), r.info.status) for r in runs if r.info.status == "RUNNING"
    ]
    (parent,) = [r for r in runs if r.data.tags.get("r1.stage") == "pipeline"]
    assert parent.info.status == "FINISHED" and parent.data.tags["r1.attempts"] == "2"
    assert parent.data.tags["r1.attempt.1"].startswith("killed")
    assert "the same command again: MLflow parent run" in output
    stages = [r.data.tags["r1.stage"] for r in runs if r.data.tags.get("r1.stage") != "pipeline"]
    assert len(stages) == len(set(stages)), stages
    assert {
        r.data.tags["mlflow.parentRunId"] for r in runs if r.info.run_id != parent.info.run_id
    } == {parent.info.run_id}
    assert not running_prefect_runs(state)


def test_the_stage_run_holds_every_step_once_and_its_description_sums_them_all(resumed):
    _, client, _ = resumed
    (run,) = [r for r in all_runs(client) if r.data.tags.get("r1.stage") == STAGE]
    assert run.data.tags["r1.attempt.1"].startswith("killed")
    for key in ("reward/mean", "progress/fraction"):
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert steps == list(range(1, STEPS + 1)), key
    history = run_history(client, run.info.run_id, curve_keys(list(run.data.metrics)))
    assert len(history) == STEPS
    description = run.data.tags[RUN_DESCRIPTION_TAG]
    assert curves_summary(history) in description
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "training_curves.png" in artifacts


def test_the_stage_time_counts_both_attempts_in_the_report(resumed):
    _, client, _ = resumed
    (run,) = [r for r in all_runs(client) if r.data.tags.get("r1.stage") == STAGE]
    (killed,) = client.get_metric_history(run.info.run_id, "stage/attempt_seconds")
    seconds = run.data.metrics["stage/seconds"]
    assert seconds > killed.value > 0
    (parent,) = [r for r in all_runs(client) if r.data.tags.get("r1.stage") == "pipeline"]
    assert parent.data.metrics[f"{STAGE}/seconds"] == pytest.approx(seconds)
