"""The same command run again after its process died goes on in the same MLflow runs.

`r1 run` (and `scripts/run.sh`) starts a new flow run each time; the finished stages come from
Prefect's cache and the stage that died resumes from its checkpoint. Here that new flow run
reopens the parent run its earlier attempt left (storage.pipeline_runs), so the stage resumes its
own stage run as a Prefect retry does: one parent, one stage run, one whole curve, the stage's
time over all its attempts. The earlier attempt's flow run, which a killed process left
Running, is marked Crashed with the task runs it left Running.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from mlflow import MlflowClient
from prefect import runtime

from storage.pipeline_runs import (
    CODE_TAG,
    COMMAND_TAG,
    OWNER_TAG,
    command_digest,
    owner_of_this_process,
    reopen_pipeline_run,
    resumable_pipeline_run,
)
from storage.tracking import FLOW_RUN_TAG
from tasks.stage_cache import code_version

log = logging.getLogger(__name__)


def hold_pipeline_run(client: MlflowClient, run_id: str, flow: str, config: dict[str, Any]) -> None:
    """Tag the parent run with its command, the code version and this process, the owner: what a
    later run of the same command looks at to reopen it."""
    client.set_tag(run_id, COMMAND_TAG, command_digest(flow, config))
    client.set_tag(run_id, CODE_TAG, code_version())
    client.set_tag(run_id, OWNER_TAG, owner_of_this_process())


def resumed_command_run(
    client: MlflowClient, experiment: str, flow: str, config: dict[str, Any], flow_run_id: str
) -> str | None:
    """The parent run of the same command's earlier attempt, reopened for this flow run; None
    when there is none to go on with, or when this flow run belongs to a deployment (a
    deployment's run resumes by `prefect flow-run retry`)."""
    if runtime.deployment.id:
        return None
    command = command_digest(flow, config)
    run = resumable_pipeline_run(client, experiment, command, code_version())
    if run is None:
        return None
    earlier = run.data.tags.get(FLOW_RUN_TAG, "")
    run_id = reopen_pipeline_run(client, run, flow_run_id)
    if earlier and earlier != flow_run_id:
        crash_earlier_flow_run(earlier)
    return run_id


RESUMED_MESSAGE = "its process ended while it ran; the same command run again resumed it"


def crash_earlier_flow_run(flow_run_id: str) -> list[str]:
    """Mark Crashed the earlier attempt's flow run and its task runs, where its process was
    killed and left them Running. Returns the names of those it marked."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    message = RESUMED_MESSAGE
    try:
        flow_id = UUID(flow_run_id)
    except ValueError:
        return []
    with get_client(sync_client=True) as client:
        try:
            flow_run = client.read_flow_run(flow_id)
        except ObjectNotFound:  # another Prefect server's run
            return []
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_id]))
        )
        marked = [t for t in task_runs if t.state is not None and t.state.is_running()]
        for task_run in marked:
            client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
        names = [t.name for t in marked]
        if flow_run.state is not None and flow_run.state.is_running():
            client.set_flow_run_state(flow_id, Crashed(message=message), force=True)
            names.append(flow_run.name)
    if names:
        log.warning("runs the killed attempt left running, now crashed: %s", names)
    return names
