"""Stage 2 task: cold-start SFT of the base on the curated set."""

from __future__ import annotations

from prefect import task

from configs.schema import SFTConfig
from stages import sft as sft_stage
from stages.refs import CuratedSet, ModelRef
from storage.tracking import log_dataset
from tasks.context import RunContext, StageResult, record_model, tracked_stage

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
        digest, version = record_model(ctx, tracker, STAGE, model, [base.digest, curated.digest])
    return StageResult(
        STAGE, tracker.run_id, model, timing["seconds"], digest, {"model": f"v{version}"}
    )
