"""The flows' failure, crash and cancellation hooks, which load the code that records the end
only when one comes, and only the stores' code (a flow module stays light: flows/__init__.py)."""

from __future__ import annotations

from typing import Any

from tasks.progress import name_task_run_logs

# Prefect's API log handlers get the formatter as a flow module loads: a flow run's first lines
# ("Beginning flow run ...") come before its stages' code, whose tasks would install it.
name_task_run_logs()


def pipeline_failed(flow: Any, flow_run: Any, state: Any) -> None:
    """The flow run's parent MLflow run closed FAILED, and why, in the flow run's logs."""
    end_failed(flow, flow_run, state, "pipeline", "parent run")


def pipeline_cancelled(flow: Any, flow_run: Any, state: Any) -> None:
    """The flow run's parent MLflow run, and its stage runs still RUNNING, ended KILLED."""
    end_cancelled(flow, flow_run, state, "pipeline", "resumes it")


def evaluation_failed(flow: Any, flow_run: Any, state: Any) -> None:
    """The flow run's evaluation run (tasks.scheduled_eval) closed FAILED, and why."""
    end_failed(flow, flow_run, state, "evaluation", "evaluation run")


def evaluation_cancelled(flow: Any, flow_run: Any, state: Any) -> None:
    """The flow run's evaluation run (tasks.scheduled_eval) ended KILLED."""
    end_cancelled(flow, flow_run, state, "evaluation", "evaluates again")


def end_failed(flow: Any, flow_run: Any, state: Any, stage: str, what: str) -> None:
    """Failure and crash hook: end FAILED the MLflow runs of `flow_run` tagged `stage` still
    RUNNING (`what` they are), and give the reason in the flow run's own logs (`prefect
    flow-run logs <id>`), not only on stderr. After a crash the worker waits for it (Prefect
    3.8.8 runs it in a process of its own) before it reports the crash a second time (which
    leaves a retry made meanwhile alone: cli/late_reports.py), so it loads only the stores'
    code (2.0 s and 288 MB in all, against 6.6 s and 617 MB with the stages' code and torch,
    on two busy cores)."""
    from prefect.logging.loggers import flow_run_logger

    from storage.paths import StatePaths
    from storage.pipeline_runs import end_failed_runs
    from storage.tracking import tracking_client

    paths = StatePaths.from_env()
    if not paths.mlflow_db.exists():  # failed before the store was made: nothing to end
        return
    ended = end_failed_runs(tracking_client(paths), str(flow_run.id), stage)
    reason = (state.message or "").removeprefix("Flow run encountered an exception: ")
    flow_run_logger(flow_run, flow).error(
        "flow run %s: %s\nMLflow %s: %s", state.name, reason, what, ", ".join(ended) or "none"
    )


def end_cancelled(flow: Any, flow_run: Any, state: Any, stage: str, retry: str) -> None:
    """Cancellation hook (`prefect flow-run cancel`): end KILLED the MLflow runs of `flow_run`
    tagged `stage` still RUNNING, and say so in its logs, with what a retry does (`retry`).
    Prefect's runner calls it once the flow run's process is gone; like end_failed it loads
    only the stores' code."""
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
