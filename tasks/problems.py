"""Prepare the train and held-out problem files and record them as the pipeline's raw data."""

from __future__ import annotations

from configs.data import DataConfig
from problems.types import ProblemSet
from stages import problems as problems_stage
from storage import store
from storage.digests import file_digest
from storage.lineage import InputRef
from tasks.context import RunContext, log_problems
from tasks.stage_cache import stage_task


@stage_task("prepare-problems", retries=1)
def prepare_problems(config: DataConfig, ctx: RunContext) -> ProblemSet:
    problems = problems_stage.run(config, ctx.stage_dir("problems"))
    client = ctx.client()
    for name, value in problems_stage.skipped_row_metrics(problems).items():
        client.log_metric(ctx.parent_run_id, name, value)
    raw = {}
    if config.source == "files" and config.files is not None:  # the user's own files, as read
        raw = {"train": config.files.train_path, "heldout": config.files.heldout_path}
    for split, path in (("train", problems.train_path), ("heldout", problems.heldout_path)):
        digest = log_problems(client, ctx.parent_run_id, problems, split)
        inputs: list[str | InputRef] = []
        if split in raw:
            source = raw[split].resolve()
            source_digest = file_digest(source)
            store.record_lineage(
                ctx.paths.duckdb, str(source), "raw", source_digest, "source", ctx.parent_run_id, []
            )
            inputs = [InputRef(source_digest, ctx.parent_run_id)]
        store.record_lineage(
            ctx.paths.duckdb, str(path), "problems", digest, "problems", ctx.parent_run_id, inputs
        )
    return problems
