"""Operations as a user meets them, against the real thing: `scripts/serve.sh` starts a Prefect
server, a process worker and the MLflow UI on loopback and deploys prefect.yaml; `prefect
deployment run 'r1-pipeline/micro' --watch` runs the pipeline with a one-time failure injected
mid-way through stage 3 (`faults.fail_once_at`) and prints which stage failed and why; `r1 runs`
gives its id whole; `prefect flow-run retry` resumes it and `r1 watch` follows the retry to its
end. The retried run takes the earlier stages from the cache, resumes stage 3 from its
checkpoint (one point per step, its time over both attempts), and finishes; the nightly
evaluation deployment's cron schedule has put runs on the server's calendar, and run now on
the wrong profile it names the command that works; `serve.sh stop` leaves no process behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from mlflow import MlflowClient

from configs import load_profile
from tests.operations.stack import (
    ROOT,
    flow_run_id,
    flow_run_json,
    flow_run_process,
    prefect,
    r1,
    served_stack,
    session_of,
    task_runs,
    wait_for_end,
    wait_for_log,
)

# Heavy: a Prefect server and worker (scripts/serve.sh) and deployment runs of the pipeline.
pytestmark = [pytest.mark.heavy, pytest.mark.slow]  # a real stack: CI runs it (-m slow)

FAULT = "reasoning_rl@2"  # micro's stage 3 checkpoints every step and runs 2
EARLIER_TASKS = {"prepare-problems", "bootstrap", "cold_start_curation", "cold_start_sft"}
REASON = "InjectedFailure: reasoning_rl: injected failure at step 2 (faults.fail_once_at)"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Server and worker started by the documented script, stopped by it at the end."""
    state = tmp_path_factory.mktemp("ops-state")
    # the scheduler looks for deployments to schedule every 60 s by default
    with served_stack(state, PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2") as served:
        yield state, served.env


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
    listed = r1(env, "runs", "--state", "failed", "--state", "crashed")
    retry = prefect(env, "flow-run", "retry", run_id)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    followed = r1(env, "watch", run_id)
    final_state = wait_for_end(env, run_id)
    return state, env, run_id, first, first_tasks, final_state, listed, followed


def test_the_injected_failure_fails_the_deployment_run(failed_then_retried):
    _, _, _, first, first_tasks, _, _, _ = failed_then_retried
    assert first.returncode != 0, first.stdout
    assert "Failed" in first.stdout + first.stderr
    failed = [name for name, kind, _, _ in first_tasks if kind == "FAILED"]
    assert failed == ["reasoning_rl"], first_tasks


def test_the_watch_names_the_stages_their_progress_and_the_failures_reason(failed_then_retried):
    """`prefect deployment run --watch`, as the README runs it: task runs named after their
    stages, progress lines, and the reason the run failed, also at the end of the output."""
    first = failed_then_retried[3]
    out = " ".join(first.stdout.split())  # lines wrapped at 80 columns, joined
    assert "prefect.task-run.Running * reasoning_rl" in out
    assert "prefect.task-run.Completed * evaluate: bootstrap" in out
    assert "reasoning_rl: step 1 of 2 (50%)" in out
    assert f"reasoning_rl: stage 6 of 16 failed at step 2: {REASON}" in out
    ending = " ".join(first.stdout.split("\n")[-8:])
    assert "Flow run finished in state 'Failed'" in ending
    assert "injected failure at step 2" in " ".join(ending.split()), ending


def test_r1_runs_prints_the_failed_runs_id_whole_and_why_it_failed(failed_then_retried):
    run_id, listed = failed_then_retried[2], failed_then_retried[6]
    assert listed.returncode == 0, listed.stdout + listed.stderr
    lines = listed.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(run_id)]  # at 80 columns
    assert "Failed" in lines[at] and "r1-pipeline/micro" in lines[at]
    reason = [line for line in lines[at + 1 :] if line.startswith("    ")]  # wrapped at 80
    said = REASON.replace(" reasoning_rl:", "")  # the stage named once
    assert " ".join(line.strip() for line in reason).startswith(f"reasoning_rl: {said}")


def test_r1_watch_follows_the_retry_to_its_end(failed_then_retried):
    followed = failed_then_retried[7]
    assert followed.returncode == 0, followed.stdout + followed.stderr
    out = followed.stdout
    assert "reasoning_rl: stage 6 of 16 resumes\n" in out and " attempt 2\n" in out
    assert "bootstrap: Finished in state Cached" in out
    assert out.rstrip().splitlines()[-1].startswith(f"flow run {failed_then_retried[2]} Completed")


def test_the_retry_takes_earlier_stages_from_the_cache_and_reruns_the_failed_one(
    failed_then_retried,
):
    state, env, run_id, _, _, final_state, _, _ = failed_then_retried
    assert final_state == "COMPLETED"
    runs = task_runs(env, run_id)
    by_name: dict[str, set[str]] = {}
    for name, _, state_name, _ in runs:
        by_name.setdefault(name, set()).add(state_name)
    for name in EARLIER_TASKS:
        assert "Cached" in by_name[name], (name, by_name)
    assert "Completed" in by_name["reasoning_rl"], by_name  # ran again, this time to the end

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
    for key in ("reward/mean", "progress/fraction"):  # step 2 ran in both attempts
        steps = sorted(m.step for m in client.get_metric_history(stage3[0].info.run_id, key))
        assert steps == [1, 2], key  # one point per step
    (parent,) = client.search_runs(
        [stage3[0].info.experiment_id],
        filter_string=f"tags.`prefect.flow_run_id` = '{run_id}' AND tags.`r1.stage` = 'pipeline'",
    )
    assert parent.info.status == "FINISHED"  # the same parent run, reopened by the retry
    # the report's time of stage 3 is that of both attempts
    (first_attempt,) = client.get_metric_history(stage3[0].info.run_id, "stage/attempt_seconds")
    seconds = stage3[0].data.metrics["stage/seconds"]
    assert seconds > first_attempt.value > 0
    assert parent.data.metrics["reasoning_rl/seconds"] == seconds


def test_a_new_run_with_the_same_parameters_computes_nothing_again(failed_then_retried):
    env = failed_then_retried[1]
    again = prefect(env, "deployment", "run", "r1-pipeline/micro", "--watch")
    assert again.returncode == 0, again.stdout + again.stderr
    # the report at its end, a line a stage, each whole at 80 columns (not wrapped)
    lines = again.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.endswith("held-out, after each stage:")]
    footer = "the table: prefect artifact inspect r1-stage-report"  # whole: not wrapped
    (end,) = [i for i, line in enumerate(lines) if line.endswith(footer)]
    report = lines[at + 1 : end]
    assert len(report) == 16, report  # a whole line each, none wrapped into a second
    assert all(re.fullmatch(r"\s+[a-z_0-9]+ +\d+s(  \S.*)?", line) for line in report), report
    assert re.fullmatch(r"\s+bootstrap +\d+s  pass@1 \d\.\d{3} format \d\.\d{3}", report[0])
    runs = task_runs(env, flow_run_id(again.stdout))
    computed = {name for name, _, state_name, _ in runs if state_name != "Cached"}
    # stage 3 ran under the fault's key in the faulted run, so a run without the fault computes it
    # once; its model has the same digest, so every later stage comes from the cache
    assert computed <= {"open-pipeline-run", "close-pipeline-run", "reasoning_rl"}, computed


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
    # retried as soon as the crash hook (flows/hooks.py) has said so, before the worker's second
    # report of the crash, which must not undo the retry (cli/late_reports.py)
    wait_for_log(env, run_id, "flow run Crashed: ")
    retry = prefect(env, "flow-run", "retry", run_id)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    ended = wait_for_end(env, run_id)
    logs = prefect(env, "flow-run", "logs", run_id).stdout
    assert ended == "COMPLETED", retry.stdout + logs[-3000:]
    (run,) = stage3()
    assert run.info.status == "FINISHED"
    assert run.data.tags["r1.attempt.1"].startswith("killed")
    for key in ("reward/mean", "progress/fraction"):  # one point per step, none missing
        logged = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert logged == list(range(1, steps + 1)), key
    resumed = client.get_metric_history(run.info.run_id, "train/resumed_from_step")
    assert resumed and resumed[0].value >= 2
    (killed,) = client.get_metric_history(run.info.run_id, "stage/attempt_seconds")
    assert run.data.metrics["stage/seconds"] > killed.value > 0  # both attempts' time
    assert not [t for t in task_runs(env, run_id) if t[1] == "RUNNING"]


def test_the_nightly_evaluation_on_the_wrong_profile_names_the_command_to_run(
    failed_then_retried,
):
    """After the micro walk, the nightly deployment as deployed (profile tiny) finds no
    `r1-tiny` and says what to run (that the flow then evaluates `r1-micro@final`:
    tests/flows/test_scheduled_eval.py)."""
    env = failed_then_retried[1]
    tiny = prefect(env, "deployment", "run", "evaluate-model/final-nightly", "--watch")
    assert tiny.returncode != 0
    fix = "prefect deployment run 'evaluate-model/final-nightly' --param profile=micro"
    assert fix in " ".join(tiny.stdout.split()), tiny.stdout[-3000:]
    # said once in full before the end (the traceback) and once at the end, cut in between
    said = "no registered model 'r1-tiny' (registered: r1-micro). Profile 'tiny' evaluates"
    assert " ".join(tiny.stdout.split()).count(said) == 2, tiny.stdout
    # a retry would meet the same registry: `r1 watch` does not suggest one
    watched = r1(env, "watch", flow_run_id(tiny.stdout), timeout=120)
    assert watched.returncode == 1 and "RegistryError: no registered model" in watched.stdout
    assert "flow-run retry" not in watched.stdout
    assert "would fail the same way" in watched.stdout


def test_overrides_of_a_cluster_run_add_to_the_deployments_cluster(stack):
    """`--param overrides=[...]` on `r1-pipeline/cluster`, as docs/cluster.md shows it, keeps
    the deployment's cluster: Prefect merges parameters key by key, and the address is a key of
    its own. (No worker serves the pool r1-cluster here: the run waits, and is deleted.)"""
    _, env = stack
    overrides = json.dumps(["cluster.workers=8"])
    started = prefect(
        env, "deployment", "run", "r1-pipeline/cluster", "--param", f"overrides={overrides}"
    )
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = flow_run_id(started.stdout)
    parameters = flow_run_json(env, run_id, "run.parameters")
    prefect(env, "flow-run", "delete", run_id)
    assert parameters["overrides"] == ["cluster.workers=8"], parameters
    config = load_profile(
        parameters["profile"], parameters["overrides"], parameters["cluster_address"]
    )  # as the flow builds it
    assert (config.cluster.address, config.cluster.workers) == ("auto", 8)


def test_stop_ends_every_process_the_stack_started(stack):
    """Last: `serve.sh stop` ends the server, the worker and the MLflow UI with SIGTERM (none of
    them busy, none needs SIGKILL), and nothing they started is left."""
    state, env = stack
    sessions = {p.name: int(p.read_text()) for p in (state / "pids").iterdir() if p.is_file()}
    assert set(sessions) == {"server", "worker", "mlflow"}
    members = [p for p in psutil.process_iter() if session_of(p) in sessions.values()]
    assert len(members) >= 4  # the three and the MLflow UI's uvicorn
    stopped = subprocess.run(
        ["bash", "scripts/serve.sh", "stop"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    for name in sessions:
        assert f"serve: stopped the {name} (" in stopped.stdout, stopped.stdout
    assert "killed" not in stopped.stdout
    left = [p for p in members if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline() for p in left]
    assert not [p for p in psutil.process_iter() if session_of(p) in sessions.values()]
    assert not (state / "serve.env").exists()
