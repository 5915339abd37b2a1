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


def evaluation_failed(flow: Any, flow_run: Any, state: Any) -> None:
    """tasks.scheduled_eval.mark_evaluation_failed: the evaluation's MLflow run closed as
    FAILED."""
    from tasks.scheduled_eval import mark_evaluation_failed

    mark_evaluation_failed(flow, flow_run, state)
