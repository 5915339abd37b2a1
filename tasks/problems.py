"""Prepare the train and held-out problem files and record them as the pipeline's raw data."""

from __future__ import annotations

from configs.data import DataConfig
from problems.types import ProblemSet
from stages import problems as problems_stage
from storage import store
from tasks.context import RunContext, log_problems
from tasks.stage_cache import stage_task


@stage_task("prepare-problems", retries=1)
def prepare_problems(config: DataConfig, ctx: RunContext) -> ProblemSet:
    problems = problems_stage.run(config, ctx.stage_dir("problems"))
    client = ctx.client()
    for name, value in problems_stage.skipped_row_metrics(problems).items():
        client.log_metric(ctx.parent_run_id, name, value)
    for split, path in (("train", problems.train_path), ("heldout", problems.heldout_path)):
        digest = log_problems(client, ctx.parent_run_id, problems, split)
        store.record_lineage(
            ctx.paths.duckdb, str(path), "problems", digest, "problems", ctx.parent_run_id, []
        )
    return problems
