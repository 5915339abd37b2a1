"""The worker's start: the runs of its pool left Running or Cancelling with no process on this
machine are the ones it ends, each in the state that fits."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from cli.worker import live_flow_run_ids, orphan_message, orphans


def test_orphans_are_the_running_and_cancelling_runs_without_a_process():
    runs = [
        ("a", "RUNNING"),  # its process is alive: left alone
        ("b", "RUNNING"),  # gone: Crashed
        ("c", "CANCELLING"),  # gone while cancelling: Cancelled, what was asked
        ("d", "COMPLETED"),  # ended: never touched
        ("e", "PENDING"),  # not started: the worker will start it
        ("f", "CANCELLING"),  # alive: its worker stops it
    ]
    assert orphans(runs, alive={"a", "f"}) == [("b", "CRASHED"), ("c", "CANCELLED")]
    assert orphans(runs, alive={"a", "b", "c", "f"}) == []
    assert orphans([], alive=set()) == []


def test_a_process_that_carries_a_flow_run_id_is_seen_alive_and_one_that_ended_is_not():
    run_id = str(uuid.uuid4())
    env = {**os.environ, "PREFECT__FLOW_RUN_ID": run_id}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        assert run_id in live_flow_run_ids()
    finally:
        child.kill()
        child.wait()
    assert run_id not in live_flow_run_ids()


def test_the_messages_say_why_and_what_to_do():
    assert "Retry it to resume" in orphan_message("r1-local", "CRASHED")
    assert "nothing was left to stop" in orphan_message("r1-local", "CANCELLED")
