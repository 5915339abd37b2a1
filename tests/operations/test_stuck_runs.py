"""A flow run whose worker or process is gone ends Crashed, is listed by `r1 runs`, ends `r1
watch`, and a retry resumes it from its checkpoint; against the real stack (`scripts/serve.sh`:
a Prefect server, the process worker, the MLflow UI) and a real micro pipeline run:

- the stack stopped while stage 3 trains (`serve.sh stop`, then `serve.sh` again): the worker
  ends its flow run, which reports Crashed before the server stops;
- the machine gone while stage 3 trains (every process of the stack and the run killed at once
  with SIGKILL, nothing reported), then the stack started again: the worker ends the run Crashed
  as it starts;
- the worker and two runs killed while the server stays up: the heartbeat automation marks the
  run left alone Crashed once its heartbeats have stopped for `R1_CRASH_AFTER_SECONDS`, and the
  run then cancelled ends Cancelled, not Cancelling for ever.
"""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest
from mlflow import MlflowClient

from tests.operations.stack import (
    Stack,
    command,
    flow_run_id,
    flow_run_process,
    prefect,
    r1,
    run_state,
    served_stack,
    session_of,
    wait_for_end,
)

# Heavy: a Prefect server and worker (scripts/serve.sh) and deployment runs of the pipeline.
pytestmark = [pytest.mark.heavy, pytest.mark.slow]  # a real stack: CI runs it (-m slow)

STEPS = 80  # micro's stage 3 checkpoints every step; enough steps to stop it mid-way
CRASH_AFTER = 60  # seconds without a heartbeat (they come every 30 s)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("stuck-state")
    with served_stack(state, R1_CRASH_AFTER_SECONDS=str(CRASH_AFTER)) as served:
        yield served


def start_training_run(stack: Stack, steps: int) -> str:
    """A micro pipeline run, returned once its stage 3 has logged three steps (`steps` differs
    between runs: the same settings would take stage 3 from the cache)."""
    overrides = json.dumps([f"reasoning_rl.steps={steps}"])
    started = prefect(
        stack.env, "deployment", "run", "r1-pipeline/micro", "--param", f"overrides={overrides}"
    )
    run_id = flow_run_id(started.stdout)
    deadline = time.monotonic() + 600
    while len(stage3_rewards(stack, run_id)) < 3:
        assert time.monotonic() < deadline, "stage 3 never reached its third step"
        time.sleep(0.5)
    return run_id


def stage3_runs(stack: Stack, run_id: str) -> list:
    client = MlflowClient(f"sqlite:///{stack.state}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments()]
    stage3 = f"tags.`prefect.flow_run_id` = '{run_id}' AND tags.`r1.stage` = 'reasoning_rl'"
    return client.search_runs(experiments, filter_string=stage3)


def stage3_rewards(stack: Stack, run_id: str) -> list:
    runs = stage3_runs(stack, run_id)
    if not runs:
        return []
    client = MlflowClient(f"sqlite:///{stack.state}/mlflow.db")
    return client.get_metric_history(runs[0].info.run_id, "reward/mean")


def assert_listed_watched_and_resumed(stack: Stack, run_id: str, steps: int, reason: str) -> None:
    """`r1 runs` lists the run Crashed with `reason`; `r1 watch` ends on it and names the retry;
    the retry resumes stage 3 from its checkpoint and the run completes."""
    listed = r1(stack.env, "runs", "--state", "failed", "--state", "crashed")
    lines = listed.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(run_id)]
    assert "Crashed" in lines[at], listed.stdout
    assert reason in lines[at + 1], listed.stdout
    watched = r1(stack.env, "watch", run_id, timeout=120)
    assert watched.returncode == 1, watched.stdout + watched.stderr
    assert f"flow run {run_id} Crashed:\n" in watched.stdout, watched.stdout
    assert f".venv/bin/prefect flow-run retry {run_id}" in watched.stdout

    retry = prefect(stack.env, "flow-run", "retry", run_id)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert wait_for_end(stack.env, run_id) == "COMPLETED"
    (run,) = stage3_runs(stack, run_id)  # one stage run, resumed by the retry
    assert run.info.status == "FINISHED"
    client = MlflowClient(f"sqlite:///{stack.state}/mlflow.db")
    (resumed,) = client.get_metric_history(run.info.run_id, "train/resumed_from_step")
    assert resumed.value >= 2  # from its checkpoint, not from the start
    logged = sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/mean"))
    assert logged == list(range(1, steps + 1))  # one point per step, none missing


def test_a_run_stopped_with_the_stack_ends_crashed_and_resumes(stack):
    run_id = start_training_run(stack, STEPS)
    stopped = stack.serve("stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "serve: stopped the worker (" in stopped.stdout, stopped.stdout
    assert "killed" not in stopped.stdout
    assert not [p for p in psutil.process_iter() if flow_run_process(p, run_id)]

    started = stack.serve("start")
    assert started.returncode == 0, started.stdout + started.stderr
    kind, message = run_state(stack.env, run_id)
    assert kind == "CRASHED", message  # reported before the server stopped
    assert "termination signal" in message
    assert_listed_watched_and_resumed(stack, run_id, STEPS, "termination signal")


def kill_sessions(sessions: set[int]) -> None:
    """SIGKILL to every process of `sessions`, all at once, nothing said; waits for them."""
    for process in psutil.process_iter():
        if session_of(process) in sessions:
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs([p for p in psutil.process_iter() if session_of(p) in sessions], timeout=10)


def engine_session(run_id: str) -> int:
    (engine,) = [p for p in psutil.process_iter() if flow_run_process(p, run_id)]
    return os.getsid(engine.pid)


def test_a_run_whose_machine_went_down_is_ended_by_its_worker_when_the_stack_starts(stack):
    """Every process of the stack and the run killed at once, then the stack started again: the
    worker finds the run without a process as it starts and ends it Crashed. The heartbeat
    automation cannot be what ends it here: its window is an hour long while the run dies, and
    the stack's start puts the automation back with its own timeout, which starts new windows
    (as the server does when it forgets those that expired while it was down)."""
    run_id = start_training_run(stack, STEPS + 1)
    hour = command(stack.env, "python", "-m", "cli.heartbeats", "--within", "3600", timeout=120)
    assert hour.returncode == 0, hour.stdout + hour.stderr
    sessions = {stack.pid(name) for name in ("server", "worker", "mlflow")}
    kill_sessions(sessions | {engine_session(run_id)})  # the machine is gone

    started = stack.serve("start")  # nobody said anything: the run is Running, until now
    assert started.returncode == 0, started.stdout + started.stderr
    kind, message = run_state(stack.env, run_id)
    assert kind == "CRASHED", message
    assert "found no process for it when it started" in message
    assert_listed_watched_and_resumed(stack, run_id, STEPS + 1, "Its process is gone")


def test_runs_whose_worker_was_killed_end_crashed_or_cancelled_by_their_heartbeats(stack):
    """The worker and two of its runs killed outright while the server stays up, one wait for
    both: the run left alone ends Crashed once it has been unheard for `R1_CRASH_AFTER_SECONDS`
    (the heartbeat automation); the run then cancelled (`prefect flow-run cancel`), which nothing
    is left to stop and Prefect lets go nowhere but Cancelled, ends Cancelled then (it stayed
    Cancelling for ever)."""
    crashed = start_training_run(stack, 5 * STEPS)  # trains until it is killed
    cancelled = start_training_run(stack, STEPS + 2)
    kill_sessions({stack.pid("worker"), engine_session(crashed), engine_session(cancelled)})
    cancel = prefect(stack.env, "flow-run", "cancel", cancelled)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr

    watched = r1(stack.env, "watch", crashed, timeout=CRASH_AFTER + 120)
    assert watched.returncode == 1, watched.stdout + watched.stderr
    said = " ".join(watched.stdout.split())  # the reason wraps at 80 columns
    assert f"flow run {crashed} Crashed: in reasoning_rl: No heartbeat for {CRASH_AFTER} s" in said
    listed = r1(stack.env, "runs", "--state", "crashed")
    assert f"{crashed}  Crashed" in listed.stdout and "No heartbeat" in listed.stdout

    watched = r1(stack.env, "watch", cancelled, timeout=CRASH_AFTER + 120)
    said = " ".join(watched.stdout.split())
    assert f"flow run {cancelled} Cancelled: Cancelled: no heartbeat" in said, watched.stdout
    assert "its process was already gone" in said
    # last in this module: the worker stays dead (the stack's stop ends the rest)
