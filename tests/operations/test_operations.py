"""Operations as a user meets them, against the real thing: `scripts/serve.sh` starts a Prefect
server and a process worker on loopback and deploys prefect.yaml; `prefect deployment run
'r1-pipeline/micro' --watch` runs the pipeline with a one-time failure injected mid-way through
stage 3 (`faults.fail_once_at`); `prefect flow-run retry` resumes it. The retried run takes the
earlier stages from the cache, resumes stage 3 from its checkpoint, and finishes; the nightly
evaluation deployment's cron schedule has put runs on the server's calendar."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

# Heavy: a Prefect server and worker (scripts/serve.sh) and deployment runs of the pipeline.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CRASH_REPORT_SECONDS = 15
FAULT = "reasoning_rl@2"  # micro's stage 3 checkpoints every step and runs 2
EARLIER_TASKS = {
    "prepare-problems",
    "bootstrap-base-model",
    "curate-cold-start",
    "cold-start-sft",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Server and worker started by the documented script, stopped by it at the end."""
    state = tmp_path_factory.mktemp("ops-state")
    port = free_port()
    env = os.environ | {
        "R1_STATE_DIR": str(state),
        "R1_PREFECT_PORT": str(port),
        "R1_VENV": str(VENV_BIN.parent),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_HOME": str(state / "prefect"),
        # the scheduler looks for deployments to schedule every 60 s by default
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
    }
    env.pop("TQDM_DISABLE", None)

    def serve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "scripts/serve.sh", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    started = serve("start")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield state, env
    finally:
        serve("stop")


def prefect(env: dict, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "prefect"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def flow_run_id(output: str) -> str:
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", output)
    assert match, output
    return match.group(1)


def wait_for_end(env: dict, run_id: str, timeout: int = 900) -> str:
    """The flow run's final state type, polled from the server by a fresh interpreter."""
    code = (
        "import sys, time\n"
        "from prefect import get_client\n"
        "deadline = time.time() + float(sys.argv[2])\n"
        "time.sleep(2)\n"
        "while time.time() < deadline:\n"
        "    with get_client(sync_client=True) as c:\n"
        "        state = c.read_flow_run(sys.argv[1]).state\n"
        "    if state.is_final():\n"
        "        print(state.type.value)\n"
        "        sys.exit(0)\n"
        "    time.sleep(2)\n"
        "print('TIMEOUT')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, run_id, str(timeout)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def task_runs(env: dict, run_id: str) -> list:
    """The flow run's task runs, read from the server by a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from prefect import get_client\n"
        "from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId\n"
        "with get_client(sync_client=True) as c:\n"
        "    runs = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId("
        "any_=[sys.argv[1]])))\n"
        "print(json.dumps([[r.name, r.state.type.value, r.state.name, r.start_time is not None]"
        " for r in runs]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, run_id], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def failed_then_retried(stack):
    state, env = stack
    overrides = json.dumps([f"faults.fail_once_at={FAULT}"])
    first = prefect(
        env,
        "deployment",
        "run",
        "r1-pipeline/micro",
        "--param",
        f"overrides={overrides}",
        "--watch",
    )
    run_id = flow_run_id(first.stdout)
    first_tasks = task_runs(env, run_id)
    retry = prefect(env, "flow-run", "retry", run_id)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    final_state = wait_for_end(env, run_id)
    return state, env, run_id, first, first_tasks, final_state


def test_the_injected_failure_fails_the_deployment_run(failed_then_retried):
    _, _, _, first, first_tasks, _ = failed_then_retried
    assert first.returncode != 0, first.stdout
    assert "Failed" in first.stdout + first.stderr
    failed = [name for name, kind, _, _ in first_tasks if kind == "FAILED"]
    assert any(name.startswith("grpo") for name in failed), first_tasks


def test_the_retry_takes_earlier_stages_from_the_cache_and_reruns_the_failed_one(
    failed_then_retried,
):
    state, env, run_id, _, _, final_state = failed_then_retried
    assert final_state == "COMPLETED"
    runs = task_runs(env, run_id)
    by_name: dict[str, set[str]] = {}
    for name, _, state_name, _ in runs:
        by_name.setdefault(name.rsplit("-", 1)[0], set()).add(state_name)
    for name in EARLIER_TASKS:
        assert "Cached" in by_name[name], (name, by_name)
    assert "Completed" in by_name["grpo"], by_name  # stage 3 ran again, this time to the end

    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    stage3 = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string="tags.`r1.stage` = 'reasoning_rl'",
        order_by=["attributes.start_time ASC"],
    )
    # one stage run: the retry resumed the failed attempt's run, its curve goes on in it
    assert [r.info.status for r in stage3] == ["FINISHED"]
    tags = stage3[0].data.tags
    assert tags["r1.attempts"] == "2"
    assert tags["r1.attempt.1"].startswith("failed: InjectedFailure: reasoning_rl: injected")
    resumed = client.get_metric_history(stage3[0].info.run_id, "train/resumed_from_step")
    assert [m.value for m in resumed] == [1.0]  # the checkpoint after step 1, not step 0
    steps = {m.step for m in client.get_metric_history(stage3[0].info.run_id, "reward/mean")}
    assert steps == {1, 2}
    (parent,) = client.search_runs(
        [stage3[0].info.experiment_id],
        filter_string=f"tags.`prefect.flow_run_id` = '{run_id}' AND tags.`r1.stage` = 'pipeline'",
    )
    assert parent.info.status == "FINISHED"  # the same parent run, reopened by the retry


def test_a_new_run_with_the_same_parameters_computes_nothing_again(failed_then_retried):
    _, env, _, _, _, _ = failed_then_retried
    again = prefect(env, "deployment", "run", "r1-pipeline/micro", "--watch")
    assert again.returncode == 0, again.stdout + again.stderr
    runs = task_runs(env, flow_run_id(again.stdout))
    computed = {name.rsplit("-", 1)[0] for name, _, state_name, _ in runs if state_name != "Cached"}
    # stage 3 ran under the fault's key in the faulted run, so a run without the fault computes it
    # once; its model has the same digest, so every later stage comes from the cache
    assert computed <= {"open-pipeline-run", "close-pipeline-run", "grpo"}, computed


def test_the_nightly_evaluation_schedule_creates_runs(stack):
    _, env = stack
    listed = prefect(env, "deployment", "inspect", "evaluate-model/final-nightly")
    assert listed.returncode == 0, listed.stderr
    assert "0 3 * * *" in listed.stdout
    code = (
        "import time, sys\n"
        "from prefect import get_client\n"
        "from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName\n"
        "for _ in range(60):\n"
        "    with get_client(sync_client=True) as c:\n"
        "        runs = c.read_flow_runs(deployment_filter=DeploymentFilter("
        "name=DeploymentFilterName(any_=['final-nightly'])))\n"
        "    scheduled = [r for r in runs if r.state.type.value == 'SCHEDULED']\n"
        "    if scheduled:\n"
        "        print(len(scheduled), min(r.expected_start_time for r in scheduled))\n"
        "        sys.exit(0)\n"
        "    time.sleep(2)\n"
        "sys.exit(1)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    count, first_time = out.stdout.split(" ", 1)
    assert int(count) >= 1 and "03:00:00" in first_time


def test_a_flow_run_killed_mid_stage_is_retried_into_one_whole_stage_run(stack):
    """SIGKILL of the flow-run process while stage 3 trains, then `prefect flow-run retry`: the
    run ends COMPLETED, stage 3 has one MLflow run (its first attempt recorded as killed) holding
    every step's reward once or more and no step missing, and no task run stays Running."""
    state, env = stack
    steps = 40
    overrides = json.dumps([f"reasoning_rl.steps={steps}", "reasoning_rl.checkpoint_every=1"])
    started = prefect(
        env, "deployment", "run", "r1-pipeline/micro", "--param", f"overrides={overrides}"
    )
    run_id = flow_run_id(started.stdout)
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    flow_filter = f"tags.`prefect.flow_run_id` = '{run_id}' AND tags.`r1.stage` = 'reasoning_rl'"

    def stage3() -> list:
        experiments = [e.experiment_id for e in client.search_experiments()]
        return client.search_runs(experiments, filter_string=flow_filter)

    deadline = time.monotonic() + 600
    while True:
        assert time.monotonic() < deadline, "stage 3 never reached its third step"
        runs = stage3()
        if runs and len(client.get_metric_history(runs[0].info.run_id, "reward/mean")) >= 3:
            break
        time.sleep(0.5)
    (engine,) = [p for p in psutil.process_iter() if flow_run_process(p, run_id)]
    engine.send_signal(signal.SIGKILL)
    assert wait_for_end(env, run_id) == "CRASHED"
    # the worker reports the crash on its own, seconds after the state is set; a retry before
    # that report is overwritten by it
    time.sleep(CRASH_REPORT_SECONDS)
    retry = prefect(env, "flow-run", "retry", run_id)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    ended = wait_for_end(env, run_id)
    logs = prefect(env, "flow-run", "logs", run_id).stdout
    assert ended == "COMPLETED", retry.stdout + logs[-3000:]
    (run,) = stage3()
    assert run.info.status == "FINISHED"
    assert run.data.tags["r1.attempt.1"].startswith("killed")
    logged = {m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")}
    assert logged == set(range(1, steps + 1))
    resumed = client.get_metric_history(run.info.run_id, "train/resumed_from_step")
    assert resumed and resumed[0].value >= 2
    assert not [t for t in task_runs(env, run_id) if t[1] == "RUNNING"]


def flow_run_process(process: psutil.Process, run_id: str) -> bool:
    """Whether `process` runs the flow run `run_id` (the worker passes its id in the env)."""
    try:
        return process.environ().get("PREFECT__FLOW_RUN_ID") == run_id
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
