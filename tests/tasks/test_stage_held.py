"""A stage another process computes now, on the same inputs in the same state folder (a second
`r1 run` of the same command), is not computed into the same stage folder at once: the second
stops in one line naming the stage, its folder and the process; once that process is gone the
stage runs."""

import subprocess
import sys
from pathlib import Path

import pytest
from prefect import flow

from tasks.context import RunContext
from tasks.stage_cache import KEY_LENGTH, StageBusyError, stage_key, stage_task

pytestmark = pytest.mark.usefixtures("prefect_server")

# Holds an flock on argv[1], naming itself in it as a stage's holder does, until killed.
HOLDER = """
import fcntl, os, sys, time
handle = open(sys.argv[1], "a+")
fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
handle.truncate(0)
handle.write(f"pid {os.getpid()}")
handle.flush()
print("held", flush=True)
time.sleep(600)
"""


@stage_task("held-stage", stage="alone")
def alone(ctx: RunContext) -> str:
    (ctx.state_root / "alone.ran").write_text("ran")
    return "done"


@flow(name="one-stage")
def one_stage(state: str) -> str:
    return alone(context(state))


def context(state: str) -> RunContext:
    return RunContext(Path(state), "parent", "flow-run", "r1-test")


def test_a_stage_another_process_computes_now_stops_naming_that_process(tmp_path):
    key = stage_key("held-stage", {"ctx": context(str(tmp_path))}, "alone")[:KEY_LENGTH]
    lock = tmp_path / "locks" / f"{key}.lock"
    lock.parent.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StageBusyError) as info:
            one_stage(str(tmp_path))
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"alone: pid {holder.pid} is computing this stage in ")
        assert str(tmp_path / "runs" / "alone" / key) in message
        assert not (tmp_path / "alone.ran").exists()
    finally:
        holder.kill()
        holder.wait()
    assert one_stage(str(tmp_path)) == "done"
    assert (tmp_path / "alone.ran").exists()
