"""The flows' hooks, against a real SQLite store. A flow run cancelled from Prefect (`prefect
flow-run cancel`) leaves no MLflow run RUNNING: Prefect's runner calls each flow's cancellation
hooks once the run's process is gone, and they end its parent run (with the stage runs still
open under it) or its evaluation run KILLED, saying why; a retry of the flow run reopens the
parent. A crashed flow run's parent or evaluation run ends FAILED, and the crash hook, which the
runner calls in the worker's process before the worker reports the crash a second time, loads
no stage code and no torch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelling, Crashed

from flows.distill import distill
from flows.evaluate_registered import evaluate_registered
from flows.r1_pipeline import r1_pipeline
from flows.r1_zero import r1_zero
from storage.paths import STATE_ENV, StatePaths
from storage.pipeline_runs import held_by_nobody
from storage.tracking import (
    ERROR_TAG,
    FLOW_RUN_TAG,
    PARENT_TAG,
    STAGE_TAG,
    experiment_id,
    start_pipeline_run,
    tracking_client,
)
from tasks.pipeline import retried_pipeline_run

pytestmark = pytest.mark.usefixtures("private_environment", "no_api_logs")


@pytest.fixture
def no_api_logs():
    """The hooks' log lines stay local: no Prefect server to send them to here."""
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

    with temporary_settings({PREFECT_LOGGING_TO_API_ENABLED: False}):
        yield


def crash(flow, flow_run: FlowRun) -> None:
    """What Prefect's runner does once a flow run's process died (SIGKILL, out of memory)."""
    state = Crashed(message="Flow run process exited with non-zero status code -9.")
    assert flow.on_crashed_hooks, f"{flow.name} has no crash hook"
    for hook in flow.on_crashed_hooks:
        hook(flow, flow_run, state)


def cancel(flow, flow_run: FlowRun) -> None:
    """What Prefect's runner does once a cancelled run's process has ended."""
    state = Cancelling(message="The parent flow run was cancelled.")
    assert flow.on_cancellation_hooks, f"{flow.name} has no cancellation hook"
    for hook in flow.on_cancellation_hooks:
        hook(flow, flow_run, state)


@pytest.fixture
def store(tmp_path, monkeypatch):
    paths = StatePaths(tmp_path / "state").ensure()
    monkeypatch.setenv(STATE_ENV, str(paths.root))
    client = tracking_client(paths)
    return client, experiment_id(client, "r1-test", paths)


def pipeline_mid_stage(client, experiment: str) -> tuple[FlowRun, str, str]:
    """A flow run, its MLflow parent run and the stage run open under it."""
    flow_run = FlowRun(flow_id=uuid4())
    parent = start_pipeline_run(client, experiment, "r1_pipeline-x", str(flow_run.id), {})
    tags = {PARENT_TAG: parent, STAGE_TAG: "reasoning_rl"}
    return flow_run, parent, client.create_run(experiment, tags=tags).info.run_id


@pytest.mark.parametrize("flow", [r1_pipeline, r1_zero, distill], ids=lambda f: f.name)
def test_a_cancelled_pipeline_leaves_no_mlflow_run_running(store, flow):
    client, experiment = store
    flow_run, parent, stage = pipeline_mid_stage(client, experiment)
    done = client.create_run(experiment, tags={PARENT_TAG: parent, STAGE_TAG: "bootstrap"})
    client.set_terminated(done.info.run_id, "FINISHED")

    cancel(flow, flow_run)

    for run_id in (parent, stage):
        run = client.get_run(run_id)
        assert run.info.status == "KILLED"
        assert run.data.tags[ERROR_TAG].startswith(f"cancelled: flow run {flow_run.id}")
    assert client.get_run(done.info.run_id).info.status == "FINISHED"
    assert held_by_nobody(client.get_run(parent), socket.gethostname())
    assert retried_pipeline_run(client, experiment, str(flow_run.id)) == parent
    assert client.get_run(parent).info.status == "RUNNING"


@pytest.mark.parametrize(("end", "status"), [(cancel, "KILLED"), (crash, "FAILED")])
def test_a_cancelled_or_crashed_evaluation_leaves_no_mlflow_run_running(store, end, status):
    client, experiment = store
    flow_run = FlowRun(flow_id=uuid4())
    tags = {FLOW_RUN_TAG: str(flow_run.id), STAGE_TAG: "evaluation"}
    run_id = client.create_run(experiment, tags=tags).info.run_id
    other = client.create_run(experiment, tags={**tags, FLOW_RUN_TAG: "another"}).info.run_id

    end(evaluate_registered, flow_run)

    assert client.get_run(run_id).info.status == status
    assert client.get_run(other).info.status == "RUNNING"


def test_a_run_cancelled_before_its_store_exists_makes_none(tmp_path, monkeypatch):
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "state"))
    cancel(r1_pipeline, FlowRun(flow_id=uuid4()))
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("flow", [r1_pipeline, r1_zero, distill], ids=lambda f: f.name)
def test_a_crashed_pipeline_ends_its_parent_run_failed_and_leaves_the_stage_to_the_retry(
    store, flow, caplog
):
    client, experiment = store
    flow_run, parent, stage = pipeline_mid_stage(client, experiment)

    crash(flow, flow_run)

    assert client.get_run(parent).info.status == "FAILED"
    # the stage run a killed process left open is the retry's to resume (its attempt recorded)
    assert client.get_run(stage).info.status == "RUNNING"
    said = " ".join(caplog.text.split())
    assert "flow run Crashed: Flow run process exited with non-zero status code -9." in said
    assert f"MLflow parent run: {parent}" in said
    assert held_by_nobody(client.get_run(parent), socket.gethostname())


HOOK_IN_A_WORKER = """
import json, sys
from uuid import uuid4
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelling, Crashed
from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings
from flows.{module} import {flow} as flow
loaded = set(sys.modules)
with temporary_settings({{PREFECT_LOGGING_TO_API_ENABLED: False}}):
    for hook in flow.on_crashed_hooks:
        hook(flow, FlowRun(flow_id=uuid4()), Crashed(message="exit -9"))
    for hook in flow.on_cancellation_hooks:
        hook(flow, FlowRun(flow_id=uuid4()), Cancelling(message="cancelled"))
print(json.dumps(sorted(set(sys.modules) - loaded)))
"""


@pytest.mark.parametrize(
    ("module", "flow"),
    [("r1_pipeline", "r1_pipeline"), ("evaluate_registered", "evaluate_registered")],
)
def test_the_crash_and_cancellation_hooks_load_no_stage_code_into_the_worker(store, module, flow):
    """The runner calls them in the worker's process, which keeps what they import; and after
    a crash the worker reports the crash a second time only once the hook returned, which
    overwrites a retry made before (13.5 s with the stages' code and torch, read in Prefect
    3.8's runner and worker)."""
    code = HOOK_IN_A_WORKER.format(module=module, flow=flow)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.splitlines()[-1])
    heavy = [m for m in loaded if m.split(".")[0] in ("torch", "transformers", "tasks", "stages")]
    assert not heavy, heavy
