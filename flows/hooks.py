"""The flows' failure hooks, which load the code that records a failure only when one comes (a
flow module stays light: flows/__init__.py)."""

from __future__ import annotations

from typing import Any

from tasks.progress import name_task_run_logs

# Prefect's API log handlers get the formatter as a flow module loads: a flow run's first lines
# ("Beginning flow run ...") come before its stages' code, whose tasks would install it.
name_task_run_logs()


def pipeline_failed(flow: Any, flow_run: Any, state: Any) -> None:
    """tasks.pipeline.mark_pipeline_failed: the parent MLflow run closed as FAILED."""
    from tasks.pipeline import mark_pipeline_failed

    mark_pipeline_failed(flow, flow_run, state)


def pipeline_cancelled(flow: Any, flow_run: Any, state: Any) -> None:
    """The flow run's parent MLflow run, and its stage runs still RUNNING, ended KILLED."""
    end_cancelled(flow, flow_run, state, "pipeline", "resumes it")


def evaluation_failed(flow: Any, flow_run: Any, state: Any) -> None:
    """tasks.scheduled_eval.mark_evaluation_failed: the evaluation's MLflow run closed as
    FAILED."""
    from tasks.scheduled_eval import mark_evaluation_failed

    mark_evaluation_failed(flow, flow_run, state)


def evaluation_cancelled(flow: Any, flow_run: Any, state: Any) -> None:
    """The flow run's evaluation run (tasks.scheduled_eval) ended KILLED."""
    end_cancelled(flow, flow_run, state, "evaluation", "evaluates again")


def end_cancelled(flow: Any, flow_run: Any, state: Any, stage: str, retry: str) -> None:
    """Cancellation hook (`prefect flow-run cancel`): end KILLED the MLflow runs of `flow_run`
    tagged `stage` still RUNNING, and say so in its logs, with what a retry does (`retry`).
    Prefect's runner calls it in the worker's process once the flow run's process is gone, so
    it loads only the stores' code (no stage code, no torch: a worker keeps what it imports)."""
    from prefect.logging.loggers import flow_run_logger

    from storage.paths import StatePaths
    from storage.pipeline_runs import end_cancelled_runs
    from storage.tracking import tracking_client

    paths = StatePaths.from_env()
    if not paths.mlflow_db.exists():  # cancelled before the store was made: nothing to end
        return
    why = f"cancelled: flow run {flow_run.id} ({state.message})"
    ended = end_cancelled_runs(tracking_client(paths), str(flow_run.id), stage, why)
    flow_run_logger(flow_run, flow).warning(
        "flow run cancelled; MLflow run %s ended KILLED; `prefect flow-run retry %s` %s",
        ", ".join(ended) or "(none open)",
        flow_run.id,
        retry,
    )
