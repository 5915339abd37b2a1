"""Prepare the train and held-out problem files and record them as the pipeline's raw data."""

from __future__ import annotations

from prefect import task

from configs.schema import DataConfig
from stages import problems as problems_stage
from stages.refs import ProblemSet
from storage import store
from storage.digests import file_digest
from storage.tracking import log_dataset
from tasks.context import RunContext


@task(name="prepare-problems", retries=1)
def prepare_problems(config: DataConfig, ctx: RunContext) -> ProblemSet:
    problems = problems_stage.run(config, ctx.stage_dir("problems"))
    client = ctx.client()
    for path, rows, context in (
        (problems.train_path, problems.n_train, "train"),
        (problems.heldout_path, problems.n_heldout, "eval"),
    ):
        digest = file_digest(path)
        log_dataset(client, ctx.parent_run_id, f"problems-{context}", digest, path, context, rows)
        store.record_lineage(
            ctx.paths.duckdb, str(path), "problems", digest, "problems", ctx.parent_run_id, []
        )
    return problems
