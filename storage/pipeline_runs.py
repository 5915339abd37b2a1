"""A pipeline's parent run found again when the same command runs again after its process died.

A retry through Prefect keeps its flow run id, and finds its parent run by it
(tasks.pipeline.retried_pipeline_run). A command run again (`r1 run`, `scripts/run.sh`) is a new
flow run: it finds the parent run of its earlier attempt by what the command asks for, the flow
and its validated config (`r1.command`), and reopens it, so that the stage it died in resumes
its own stage run (storage.tracking.stage_run): one parent, one stage run, one curve.

Only the latest parent run of that command is looked at, and only one nobody holds open: one the
earlier process closed as failed, or one left RUNNING by a process on this machine that is gone
(its host, pid and start time are the tag `r1.owner`). A RUNNING one whose process is alive, or
lives on another machine, belongs to a run going on: the command then starts a parent of its
own. A parent left RUNNING by a process that is gone, under code that changed since (the stages'
keys differ, nothing of it would resume), is ended KILLED with its runs left RUNNING.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import psutil
from mlflow import MlflowClient
from mlflow.entities import Run, RunStatus

from storage.tracking import ATTEMPTS_TAG, ERROR_TAG, FLOW_RUN_TAG, PARENT_TAG, STAGE_TAG

log = logging.getLogger(__name__)

COMMAND_TAG = "r1.command"  # digest of the flow and its config: the same command's runs share it
CODE_TAG = "r1.code"  # the code version the run's stages were keyed with
OWNER_TAG = "r1.owner"  # `host:pid:start` of the process that holds the run open
KILLED = "killed: its process ended without closing the run"


def command_digest(flow: str, config: dict[str, Any]) -> str:
    """What identifies a command: the flow it runs and its validated config."""
    text = json.dumps({"flow": flow, "config": config}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def owner_of_this_process() -> str:
    """`host:pid:start`, the start time telling this process from a later one with its pid."""
    started = psutil.Process().create_time()
    return f"{socket.gethostname()}:{os.getpid()}:{started:.2f}"


def process_alive(pid: int, started: float) -> bool:
    """Whether the process `pid` that started at `started` (epoch seconds) still runs."""
    try:
        process = psutil.Process(pid)
        same = abs(process.create_time() - started) < 0.05  # not a later process with its pid
        return same and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def owner_gone(
    owner: str | None, host: str, alive: Callable[[int, float], bool] = process_alive
) -> bool:
    """Whether the process named by `owner` is known to be gone: it ran on `host`, this machine,
    and is not alive. An owner unnamed or on another machine cannot be told gone."""
    if not owner:
        return False
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != host:
        return False
    try:
        pid, started = int(parts[1]), float(parts[2])
    except ValueError:
        return False
    return not alive(pid, started)


def held_by_nobody(
    run: Run, host: str, alive: Callable[[int, float], bool] = process_alive
) -> bool:
    """A parent run no process holds open: closed as failed or killed, or left RUNNING by a
    process of this machine that is gone. FINISHED: done, never reopened."""
    status = run.info.status
    if status in ("FAILED", "KILLED"):
        return True
    return status == "RUNNING" and owner_gone(run.data.tags.get(OWNER_TAG), host, alive)


def latest_command_run(client: MlflowClient, experiment: str, command: str) -> Run | None:
    """The latest parent run of the command, whatever its state."""
    runs = client.search_runs(
        [experiment],
        filter_string=f"tags.`{COMMAND_TAG}` = '{command}' AND tags.`{STAGE_TAG}` = 'pipeline'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def resumable_pipeline_run(
    client: MlflowClient, experiment: str, command: str, code: str
) -> Run | None:
    """The parent run the command's earlier attempt left and nobody holds, when it ran the same
    code; None otherwise. One left RUNNING under other code is ended KILLED here."""
    run = latest_command_run(client, experiment, command)
    if run is None or not held_by_nobody(run, socket.gethostname()):
        return None
    if run.data.tags.get(CODE_TAG) == code:
        return run
    if run.info.status == "RUNNING":
        end_killed(client, run, f"{KILLED}; the code changed, so a new run started afresh")
    return None


def reopen_pipeline_run(client: MlflowClient, run: Run, flow_run_id: str) -> str:
    """Reopen an earlier attempt's parent run for this flow run: `r1.attempt.N` says how that
    attempt ended and which flow run it was, the flow-run tag now names this one (the failure
    hook finds the run by it), and this process holds it."""
    run_id = run.info.run_id
    attempt = int(run.data.tags.get(ATTEMPTS_TAG, "1"))
    status = run.info.status
    ended = KILLED if status == "RUNNING" else status.lower()
    earlier = run.data.tags.get(FLOW_RUN_TAG, "?")
    client.set_tag(run_id, f"r1.attempt.{attempt}", f"{ended} (flow run {earlier})")
    client.set_tag(run_id, ATTEMPTS_TAG, str(attempt + 1))
    client.set_tag(run_id, FLOW_RUN_TAG, flow_run_id)
    client.set_tag(run_id, OWNER_TAG, owner_of_this_process())
    client.update_run(run_id, status="RUNNING")
    log.info("parent run %s reopened (attempt %d; the last one %s)", run_id, attempt + 1, ended)
    return run_id


def end_killed(client: MlflowClient, run: Run, why: str) -> None:
    """End a run, and its child runs still RUNNING, as KILLED, saying why."""
    for child in running_children(client, run):
        kill_run(client, child.info.run_id, why)
    kill_run(client, run.info.run_id, why)


def kill_run(client: MlflowClient, run_id: str, why: str) -> None:
    client.set_tag(run_id, ERROR_TAG, why)
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.KILLED))


def running_children(client: MlflowClient, parent: Run) -> list[Run]:
    """The child runs of `parent` still RUNNING."""
    return client.search_runs(
        [parent.info.experiment_id],
        filter_string=(
            f"tags.`{PARENT_TAG}` = '{parent.info.run_id}' AND attributes.status = 'RUNNING'"
        ),
    )


def end_leftover_children(client: MlflowClient, parent_run_id: str) -> list[str]:
    """At the end of a pipeline run: end KILLED the child runs an earlier attempt left RUNNING
    that no attempt since resumed. Returns their stage names."""
    left = running_children(client, client.get_run(parent_run_id))
    for child in left:
        kill_run(client, child.info.run_id, f"{KILLED}; no later attempt resumed it")
    return [child.data.tags.get(STAGE_TAG, child.info.run_id) for child in left]


def open_flow_runs(client: MlflowClient, flow_run_id: str, stage: str) -> list[Run]:
    """The runs of the flow run `flow_run_id` tagged `stage` (`pipeline`: its parent runs;
    `evaluation`: a scheduled evaluation's run) that are still RUNNING."""
    return client.search_runs(
        experiment_ids=[e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`{FLOW_RUN_TAG}` = '{flow_run_id}' AND tags.`{STAGE_TAG}` = "
        f"'{stage}' AND attributes.status = 'RUNNING'",
    )


def end_cancelled_runs(client: MlflowClient, flow_run_id: str, stage: str, why: str) -> list[str]:
    """End KILLED, tagged with `why`, the open runs of the flow run tagged `stage`
    (open_flow_runs), with their child runs still RUNNING. Returns their ids. A cancelled flow
    run left them RUNNING for ever in the MLflow UI; KILLED, a retry of it reopens its parent
    run (held_by_nobody) and the stage that was cut off resumes from its checkpoint."""
    runs = open_flow_runs(client, flow_run_id, stage)
    for run in runs:
        end_killed(client, run, why)
    return [run.info.run_id for run in runs]


def end_failed_runs(client: MlflowClient, flow_run_id: str, stage: str) -> list[str]:
    """End FAILED the open runs of the flow run tagged `stage` (open_flow_runs); their child
    runs stay as they are: a stage run left RUNNING by a killed process is resumed by the
    retry, which records that attempt as killed. Returns their ids."""
    runs = open_flow_runs(client, flow_run_id, stage)
    for run in runs:
        client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FAILED))
    return [run.info.run_id for run in runs]
