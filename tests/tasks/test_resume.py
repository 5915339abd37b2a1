"""The same command run again reopens its dead attempt's parent run, and a deployment's flow run
does not (it resumes by `prefect flow-run retry`); against a real SQLite store."""

import subprocess
import sys

import pytest

from storage.paths import StatePaths
from storage.pipeline_runs import COMMAND_TAG, OWNER_TAG, owner_gone
from storage.tracking import FLOW_RUN_TAG, experiment_id, start_pipeline_run, tracking_client
from tasks import resume

CONFIG = {"name": "r1-test", "reasoning_rl": {"steps": 4}}


@pytest.fixture
def dead_attempt(tmp_path, monkeypatch):
    """A parent run of the command, left RUNNING by a process that has ended; the flow runs
    whose Prefect records the reopening marks crashed."""
    paths = StatePaths(tmp_path / "state").ensure()
    client = tracking_client(paths)
    experiment = experiment_id(client, "r1-test", paths)
    run_id = start_pipeline_run(client, experiment, "r1_pipeline-x", "flow-1", CONFIG)
    resume.hold_pipeline_run(client, run_id, "r1_pipeline", CONFIG)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    host, _, started = client.get_run(run_id).data.tags[OWNER_TAG].split(":")
    client.set_tag(run_id, OWNER_TAG, f"{host}:{proc.pid}:{started}")
    crashed: list[str] = []
    monkeypatch.setattr(resume, "crash_earlier_flow_run", crashed.append)
    return client, experiment, run_id, crashed


def test_the_same_command_reopens_its_dead_attempts_parent_run(dead_attempt):
    client, experiment, run_id, crashed = dead_attempt
    found = resume.resumed_command_run(client, experiment, "r1_pipeline", CONFIG, "flow-2")
    assert found == run_id and crashed == ["flow-1"]
    tags = client.get_run(run_id).data.tags
    assert tags[FLOW_RUN_TAG] == "flow-2" and tags["r1.attempts"] == "2"
    assert not owner_gone(tags[OWNER_TAG], tags[OWNER_TAG].split(":")[0])  # this process's


def test_another_command_or_a_deployments_run_starts_its_own(dead_attempt, monkeypatch):
    client, experiment, _, crashed = dead_attempt
    other = CONFIG | {"reasoning_rl": {"steps": 5}}
    assert resume.resumed_command_run(client, experiment, "r1_pipeline", other, "f2") is None
    assert resume.resumed_command_run(client, experiment, "r1_zero", CONFIG, "f2") is None
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", "a-deployment")
    assert resume.resumed_command_run(client, experiment, "r1_pipeline", CONFIG, "f2") is None
    assert crashed == []
    run = client.search_runs([experiment], filter_string=f"tags.`{COMMAND_TAG}` != ''")[0]
    assert run.info.status == "RUNNING"  # left for its own retry
