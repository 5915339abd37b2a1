"""Stage 1 task: curate cold-start traces into DuckDB and a Hugging Face dataset."""

from __future__ import annotations

from datasets import load_from_disk

from configs.supervised import CurationConfig
from curation.curated import CuratedSet
from models.saved import ModelRef
from problems.types import ProblemSet
from stages import curation as curation_stage
from storage import store
from storage.digests import rows_digest
from tasks.context import RunContext, StageResult, log_problems, tracked_stage
from tasks.stage_cache import stage_task

STAGE = "cold_start_curation"


@stage_task("curate-cold-start", stage=STAGE)
def curate_cold_start(
    config: CurationConfig,
    ctx: RunContext,
    problems: ProblemSet,
    base: StageResult[ModelRef],
    max_example_tokens: int | None = None,
) -> StageResult[CuratedSet]:
    """The cold-start set; `max_example_tokens`, the cold-start SFT's max_length, bounds each
    whole example."""
    with tracked_stage(ctx, STAGE, config) as (tracker, timing):
        train_digest = log_problems(tracker.client, tracker.run_id, problems, "train")
        curated = curation_stage.run(
            config, problems, base.output, ctx.stage_dir(STAGE), tracker, max_example_tokens
        )
        digest = rows_digest(load_from_disk(str(curated.dataset_path)))
        tracker.client.log_dict(tracker.run_id, curated.filter_counts, "filter_counts.json")
        tracker.log_artifact(curated.candidates_path, "candidates")
        tracker.client.set_tag(tracker.run_id, "dataset.digest", digest)
        store.write_curation(
            ctx.paths.duckdb,
            ctx.parent_run_id,
            tracker.run_id,
            curated.candidates_path,
            curated.filter_counts,
        )
    store.record_lineage(
        ctx.paths.duckdb,
        str(curated.dataset_path),
        "dataset",
        digest,
        STAGE,
        tracker.run_id,
        [train_digest, base.ref],
    )
    return StageResult(
        STAGE,
        tracker.run_id,
        curated,
        timing["seconds"],
        digest,
        {"kept": f"{curated.n_kept}/{curated.n_candidates}"},
    )
