"""Which parent run the same command, run again, reopens: its latest one that nobody holds open
and that ran the same code; against a real SQLite store, with a stand-in for the process
table."""

import socket
import subprocess
import sys

import psutil
import pytest
from mlflow import MlflowClient

from storage.paths import StatePaths
from storage.pipeline_runs import (
    CODE_TAG,
    COMMAND_TAG,
    OWNER_TAG,
    command_digest,
    end_leftover_children,
    owner_gone,
    owner_of_this_process,
    process_alive,
    reopen_pipeline_run,
    resumable_pipeline_run,
)
from storage.tracking import (
    ATTEMPTS_TAG,
    FLOW_RUN_TAG,
    experiment_id,
    finish_run,
    stage_run,
    start_pipeline_run,
    tracking_client,
)

HOST = socket.gethostname()
COMMAND = command_digest("r1_pipeline", {"name": "r1-test"})
CODE = "c" * 64


def test_the_command_digest_covers_the_flow_and_every_setting():
    config = {"name": "r1-micro", "reasoning_rl": {"steps": 2}}
    assert command_digest("r1_pipeline", config) == command_digest("r1_pipeline", dict(config))
    assert command_digest("r1_zero", config) != command_digest("r1_pipeline", config)
    other = {"name": "r1-micro", "reasoning_rl": {"steps": 3}}
    assert command_digest("r1_pipeline", other) != command_digest("r1_pipeline", config)


@pytest.mark.parametrize(
    ("owner", "alive", "gone"),
    [
        (f"{HOST}:123:1700000000.50", False, True),  # this machine, process gone
        (f"{HOST}:123:1700000000.50", True, False),  # this machine, still running
        ("elsewhere:123:1700000000.50", False, False),  # another machine: cannot tell
        (None, False, False),  # an older run, no owner recorded
        (f"{HOST}:x:y", False, False),
    ],
)
def test_an_owner_is_gone_only_when_it_ran_here_and_is_not_alive(owner, alive, gone):
    seen = []

    def is_alive(pid: int, started: float) -> bool:
        seen.append((pid, started))
        return alive

    assert owner_gone(owner, HOST, is_alive) is gone
    if owner and owner.startswith(HOST) and ":x:" not in owner:
        assert seen == [(123, 1700000000.50)]


def test_a_process_is_alive_while_it_runs_and_its_pid_alone_is_not_enough():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(proc.pid).create_time()
        assert process_alive(proc.pid, started)
        assert not process_alive(proc.pid, started - 10)  # a pid reused by a later process
    finally:
        proc.kill()
        proc.wait()
    assert not process_alive(proc.pid, started)
    assert owner_gone(owner_of_this_process(), HOST) is False


@pytest.fixture
def store(tmp_path) -> tuple[MlflowClient, str]:
    paths = StatePaths(tmp_path / "state").ensure()
    client = tracking_client(paths)
    return client, experiment_id(client, "r1-test", paths)


def parent_run(client: MlflowClient, experiment: str, owner: str, code: str = CODE) -> str:
    run_id = start_pipeline_run(client, experiment, "r1_pipeline-x", "flow-1", {})
    tags = {COMMAND_TAG: COMMAND, CODE_TAG: code, OWNER_TAG: owner}
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    return run_id


def dead_owner() -> str:
    """An owner on this machine whose process has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return f"{HOST}:{proc.pid}:{started:.2f}"


def test_a_run_left_running_by_a_dead_process_is_reopened_for_the_new_flow_run(store):
    client, experiment = store
    parent = parent_run(client, experiment, dead_owner())
    found = resumable_pipeline_run(client, experiment, COMMAND, CODE)
    assert found is not None and found.info.run_id == parent
    assert reopen_pipeline_run(client, found, "flow-2") == parent
    run = client.get_run(parent)
    assert run.info.status == "RUNNING"
    assert run.data.tags[FLOW_RUN_TAG] == "flow-2"  # the failure hook finds it by this
    assert run.data.tags[ATTEMPTS_TAG] == "2"
    said = run.data.tags["r1.attempt.1"]
    assert said.startswith("killed") and "flow run flow-1" in said
    assert run.data.tags[OWNER_TAG] == owner_of_this_process()
    # now this process holds it: a third run of the command does not take it over
    assert resumable_pipeline_run(client, experiment, COMMAND, CODE) is None


def test_a_failed_run_is_reopened_and_a_finished_or_held_one_is_not(store):
    client, experiment = store
    failed = parent_run(client, experiment, owner_of_this_process())
    finish_run(client, failed, failed=True)
    found = resumable_pipeline_run(client, experiment, COMMAND, CODE)
    assert found is not None and found.info.run_id == failed
    finish_run(client, failed)
    assert resumable_pipeline_run(client, experiment, COMMAND, CODE) is None  # done
    parent_run(client, experiment, owner_of_this_process())  # a run going on, the latest
    assert resumable_pipeline_run(client, experiment, COMMAND, CODE) is None
    assert resumable_pipeline_run(client, experiment, "other-command", CODE) is None


def test_a_dead_run_of_other_code_is_ended_killed_with_its_running_stages(store):
    client, experiment = store
    parent = parent_run(client, experiment, dead_owner(), code="old" * 8)
    opened = stage_run(client, parent, "reasoning_rl", {}, "k" * 64)
    stage = opened.__enter__()  # never exited: the process "died" here
    assert resumable_pipeline_run(client, experiment, COMMAND, CODE) is None
    for run_id in (parent, stage.run_id):
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and "code changed" in run.data.tags["r1.error"]


def test_stage_runs_no_attempt_resumed_are_ended_killed_at_the_close(store):
    client, experiment = store
    parent = parent_run(client, experiment, owner_of_this_process())
    opened = stage_run(client, parent, "mixed_sft", {}, "k" * 64)
    left = opened.__enter__()  # never exited: the process "died" here
    with stage_run(client, parent, "cold_start_sft", {}, "j" * 64) as finished:
        assert client.get_run(finished.run_id).info.status == "RUNNING"  # ended by its block
    assert end_leftover_children(client, parent) == ["mixed_sft"]
    assert client.get_run(left.run_id).info.status == "KILLED"
    assert end_leftover_children(client, parent) == []
