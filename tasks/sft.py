"""Stage 2 task: cold-start SFT of the base on the curated set."""

from __future__ import annotations

from prefect import task

from configs.schema import SFTConfig
from stages import sft as sft_stage
from stages.refs import CuratedSet, ModelRef
from storage import store
from storage.digests import tree_digest
from storage.tracking import log_dataset, register_model
from tasks.context import RunContext, StageResult, tracked_stage

STAGE = "cold_start_sft"


@task(name="cold-start-sft")
def cold_start_sft(
    config: SFTConfig,
    ctx: RunContext,
    base: StageResult[ModelRef],
    curated: StageResult[CuratedSet],
) -> StageResult[ModelRef]:
    with tracked_stage(ctx, STAGE, config) as (tracker, timing):
        log_dataset(
            tracker.client,
            tracker.run_id,
            "cold-start-curated",
            curated.digest,
            curated.output.dataset_path,
            "training",
            curated.output.n_kept,
        )
        tracker.client.set_tag(tracker.run_id, "base.digest", base.digest)
        model = sft_stage.run(
            config, base.output, curated.output, ctx.stage_dir(STAGE), tracker, desc=STAGE
        )
        digest = tree_digest(model.path)
        version = register_model(tracker.client, tracker.run_id, model.path, ctx.model_name, STAGE)
    store.record_lineage(
        ctx.paths.duckdb,
        str(model.path),
        "model",
        digest,
        STAGE,
        tracker.run_id,
        [base.digest, curated.digest],
    )
    return StageResult(
        STAGE, tracker.run_id, model, timing["seconds"], digest, {"model": f"v{version}"}
    )
