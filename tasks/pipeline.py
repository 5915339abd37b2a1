"""Open and close the pipeline's parent MLflow run."""

from __future__ import annotations

import logging
import os
from uuid import UUID

import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from prefect import get_run_logger, runtime, task
from prefect.artifacts import create_markdown_artifact

from cluster.connect import check_room
from configs.preflight import check_inputs
from configs.schema import PipelineConfig
from configs.sizes import check_plan_sizes
from configs.strict import computed_settings
from curation.curated import CuratedSet
from evaluation.metrics import EvalReport
from evaluation.report import (
    StageRow,
    html_table,
    markdown_table,
    plot_stages,
    stage_lines,
    table_dict,
)
from host.threads import process_threads, usable_cpus, wait_vars
from models.checkpoint import check_model_inputs
from models.loading import use_device
from problems.fit import check_data_fit
from rewards.registry import check_reward_params
from storage.paths import StatePaths
from storage.pipeline_runs import CODE_TAG, end_leftover_children
from storage.tracking import (
    FLOW_RUN_TAG,
    PARENT_TAG,
    STAGE_TAG,
    MlflowTracker,
    alias_for,
    check_tracking_store,
    experiment_id,
    finish_run,
    restore_alias,
    start_pipeline_run,
    tracking_client,
)
from tasks.context import RunContext, StageResult
from tasks.plan import check_fault_stage, planned_stages
from tasks.result import PipelineResult
from tasks.resume import hold_pipeline_run, resumed_command_run
from tasks.run_pages import RUN_DESCRIPTION_TAG, report_description
from tasks.stage_cache import code_version, telling_full_disks
from training.disk_fit import check_disk_room
from training.memory_fit import check_memory_fit

log = logging.getLogger(__name__)


def open_state(config: PipelineConfig, flow: str, trains: bool = True) -> StatePaths:
    """Before any store is touched: every local checkpoint and data file the flow needs (each
    checkpoint's tokenizer, chat template and weight files too; sizes the machine can hold;
    and, for a flow that trains,
    that its data fits the models), the Ray cluster it names (it answers and has room), the
    thread count, and the state folder with an MLflow store that answers (failing fast, naming
    it)."""
    check_inputs(config, flow)
    check_model_inputs(config, flow)
    check_fault_stage(config, flow)
    check_reward_params({key: stage.rewards for key, stage in config.grpo_stages().items()})
    check_plan_sizes(config)
    if trains:
        check_data_fit(config, flow)
        check_memory_fit(config, f"profile {config.name}")  # the GPU found here, if any
    if config.cluster.uses_ray:
        check_room(config.cluster)
    torch.set_num_threads(process_threads(config.torch_threads))
    use_device(config.device)
    waits = " ".join(f"{k}={v}" for k, v in wait_vars().items())
    log.info("torch threads %d (CPUs usable %d); %s; models on %s", torch.get_num_threads(),
             usable_cpus(), waits, config.device)  # fmt: skip
    paths = StatePaths.from_env()
    if trains:
        check_disk_room(config, paths.root, f"profile {config.name}")
    check_tracking_store(paths)
    paths.ensure()
    paths.check_writable()
    return paths


@task(name="open-pipeline-run", task_run_name="open-pipeline-run")
@telling_full_disks
def open_pipeline_run(config: PipelineConfig, flow: str = "r1_pipeline") -> RunContext:
    paths = open_state(config, flow)
    client = tracking_client(paths)
    flow_run_id = str(runtime.flow_run.id or "no-flow-run")
    experiment = experiment_id(client, config.name, paths)
    logger = get_run_logger()
    settings = config.model_dump(mode="json")
    command = computed_settings(config)  # the same command, however its stages run
    run_id = retried_pipeline_run(client, experiment, flow_run_id)
    if run_id is not None:
        logger.info("retry: its MLflow run goes on:\n%s", run_id)
        crash_leftover_task_runs(flow_run_id)
    elif run_id := resumed_command_run(client, experiment, flow, command, flow_run_id):
        logger.info("the same command again: MLflow parent run %s goes on", run_id)
    else:
        run_id = start_pipeline_run(
            client, experiment, f"{flow}-{flow_run_id[:8]}", flow_run_id, settings
        )
        client.set_tag(run_id, "r1.flow", flow)
        logger.info("MLflow parent run and store:\n%s\n%s", run_id, paths.tracking_uri)
    hold_pipeline_run(client, run_id, flow, command)
    fail_at = config.faults.fail_once_at
    cluster = config.cluster.active()
    plan = planned_stages(config, flow)
    keep = config.cache.keep_finished
    if keep:
        logger.info("cache.keep_finished: stages that finished before are kept, whatever the code")
    return RunContext(
        paths.root, run_id, flow_run_id, config.name, fail_at, cluster, plan, keep_finished=keep
    )


def crash_leftover_task_runs(flow_run_id: str) -> list[str]:
    """Mark CRASHED the task runs an earlier attempt of this flow run left RUNNING (its process
    was killed mid-stage), so the finished flow run holds none that runs forever. Returns their
    names."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    this_task = str(runtime.task_run.id or "")
    with get_client(sync_client=True) as client:
        left = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING]))
            ),
        )
        names = []
        for task_run in left:
            if str(task_run.id) == this_task:
                continue
            message = "its process ended while it ran; the retry of the flow run resumes it"
            client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
            names.append(task_run.name)
    if names:
        log.warning("task runs left running by the killed attempt, now crashed: %s", names)
    return names


def retried_pipeline_run(client: MlflowClient, experiment: str, flow_run_id: str) -> str | None:
    """The parent run an earlier attempt of this flow run opened, reopened; None if none."""
    runs = client.search_runs(
        [experiment],
        filter_string=(
            f"tags.`{FLOW_RUN_TAG}` = '{flow_run_id}' AND tags.`{STAGE_TAG}` = 'pipeline'"
        ),
        max_results=1,
    )
    if not runs:
        return None
    run_id = runs[0].info.run_id
    client.update_run(run_id, status="RUNNING")
    return run_id


@task(name="close-pipeline-run", task_run_name="close-pipeline-run")
@telling_full_disks
def close_pipeline_run(
    ctx: RunContext, stages: list[StageResult], evals: dict[str, EvalReport], k: int = 4
) -> PipelineResult:
    """Put each stage's headline figures on the parent run and publish the per-stage report:
    an MLflow table and plot on the parent run and a markdown artifact on the flow run."""
    client = ctx.client()
    parent = MlflowTracker(client, ctx.parent_run_id)
    rows = []
    for result in stages:
        metrics = dict(evals[result.stage].metrics) if result.stage in evals else {}
        parent.log_metrics({f"{result.stage}/{k}": v for k, v in metrics.items()})
        parent.log_metrics({f"{result.stage}/seconds": result.seconds})
        notes = dict(result.notes)
        if (origin := cached_from(client, ctx, result)) is not None:
            client.set_tag(ctx.parent_run_id, f"r1.cached.{result.stage}", result.run_id)
            notes = cache_note(client, ctx, result.stage, origin) | notes
            if moved := restore_alias(client, ctx.model_name, result.run_id):
                log.info("%s: %s@%s back on v%s", result.stage, ctx.model_name,
                         alias_for(result.stage), moved)  # fmt: skip
        note = ", ".join(f"{k} {v}" for k, v in notes.items())
        rows.append(StageRow(result.stage, result.seconds, metrics, note))
    publish_report(ctx, rows, k)
    if left := end_leftover_children(client, ctx.parent_run_id):
        log.warning("stage runs an earlier attempt left running, now killed: %s", left)
    finish_run(client, ctx.parent_run_id)
    counts = next((r.output.filter_counts for r in stages if isinstance(r.output, CuratedSet)), {})
    return PipelineResult(ctx.parent_run_id, ctx.flow_run_id, str(ctx.state_root), rows, counts)


def cache_note(client: MlflowClient, ctx: RunContext, stage: str, origin: str) -> dict[str, str]:
    """The report's note on a stage from the cache: the pipeline run that computed it, and the
    code it ran under where that is not this run's (`cache.keep_finished` kept it), also as the
    parent run's tag `r1.kept.<stage>`."""
    try:
        code = client.get_run(origin).data.tags.get(CODE_TAG, "")
    except MlflowException as err:  # that pipeline run deleted (mlflow gc): its stages hold
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return {"cached from run": f"{origin[:8]} (deleted)"}
    if not code or code == code_version():
        return {"cached from run": origin[:8]}
    client.set_tag(ctx.parent_run_id, f"r1.kept.{stage}", code)
    return {"kept from run": origin[:8], "code": code[:8]}


def cached_from(client: MlflowClient, ctx: RunContext, result: StageResult) -> str | None:
    """The pipeline run that computed a stage this run took from the cache; None if this run
    computed it."""
    parent = client.get_run(result.run_id).data.tags.get(PARENT_TAG)
    return parent if parent and parent != ctx.parent_run_id else None


# where the report's whole table is, for a person who read its lines in a run's log
WHOLE_TABLE = "the table: prefect artifact inspect r1-stage-report"


def publish_report(ctx: RunContext, rows: list[StageRow], k: int) -> None:
    """The per-stage table where each person meets it: the parent run's description in the
    MLflow UI (tasks.run_pages), a table and plot among its artifacts, a markdown artifact, and
    in the flow run's log (`--watch`, `r1 watch`, `prefect flow-run logs <id>`) a line a stage
    that fits an 80-column terminal."""
    client = ctx.client()
    table = markdown_table(rows, k)
    experiment = client.get_run(ctx.parent_run_id).info.experiment_id
    description = report_description(experiment, ctx.parent_run_id, rows, table)
    client.set_tag(ctx.parent_run_id, RUN_DESCRIPTION_TAG, description)
    lines = "\n".join(stage_lines(rows))
    get_run_logger().info("held-out, after each stage:\n%s\n%s", lines, WHOLE_TABLE)
    client.log_table(ctx.parent_run_id, table_dict(rows, k), "report/stages.json")
    client.log_text(ctx.parent_run_id, html_table(rows, k), "report/stages.html")
    plot = plot_stages(rows, k, ctx.run_dir("report") / "stages.png")
    client.log_artifact(ctx.parent_run_id, str(plot), "report")
    create_markdown_artifact(
        key="r1-stage-report",
        markdown=f"# R1 pipeline: per-stage report\n\n{table}\n\n"
        f"MLflow run: [{ctx.parent_run_id}]({run_url(experiment, ctx.parent_run_id)}) "
        f"(store `{ctx.paths.tracking_uri}`)\n",
        description="held-out figures after each stage",
    )


def run_url(experiment: str, run_id: str) -> str:
    """Where the MLflow UI shows a run: `R1_MLFLOW_UI`, or `mlflow ui`'s default address. The
    UI starts in its GenAI view (traces) unless the address asks for model training (runs)."""
    ui = os.environ.get("R1_MLFLOW_UI", "http://127.0.0.1:5000").rstrip("/")
    return f"{ui}/#/experiments/{experiment}/runs/{run_id}?workflowType=machine_learning"
