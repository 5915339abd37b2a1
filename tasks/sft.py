"""SFT tasks: stage 2 (cold start, on the curated set) and stage 5 (mixed, on the rejection set
and the non-reasoning set)."""

from __future__ import annotations

from datasets import load_from_disk

from configs.supervised import SFTConfig
from curation.curated import CuratedSet
from models.saved import ModelRef
from problems.general_files import GeneralFiles
from stages import sft as sft_stage
from stages.mixed import build_sft_set
from storage.digests import file_digest, rows_digest
from storage.tracking import log_dataset
from tasks.context import RunContext, StageResult, record_dataset, record_model, tracked_stage
from tasks.rejection import RejectionSet
from tasks.stage_cache import stage_task

STAGE = "cold_start_sft"


@stage_task("cold-start-sft", stage=STAGE)
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
            config,
            base.output,
            curated.output.dataset_path,
            ctx.stage_dir(STAGE),
            tracker,
            desc=STAGE,
            cluster=ctx.cluster,
        )
        digest, version = record_model(ctx, tracker, STAGE, model, [base.ref, curated.ref])
    return StageResult(
        STAGE, tracker.run_id, model, timing["seconds"], digest, {"model": f"v{version}"}
    )


@stage_task("mixed-sft")
def mixed_sft(
    config: SFTConfig,
    ctx: RunContext,
    base: StageResult[ModelRef],
    rejected: StageResult[RejectionSet],
    general: GeneralFiles | None,
    stage: str = "mixed_sft",
) -> StageResult[ModelRef]:
    """Stage 5: the *base* model (as in DeepSeek-R1), on the rejection-sampled reasoning set plus
    the non-reasoning set."""
    with tracked_stage(ctx, stage, config) as (tracker, timing):
        general_sft = general.sft_path if general else None
        data, counts = build_sft_set(
            rejected.output.dataset_path, general_sft, ctx.stage_dir(stage), config.train.seed
        )
        digest = rows_digest(load_from_disk(str(data)))
        sources = [rejected.ref] + ([file_digest(general.sft_path)] if general else [])
        rows = sum(counts.values())
        mixed = record_dataset(ctx, tracker, stage, data, digest, rows, sources, "mixed-sft")
        tracker.log_metrics({f"data/{kind}": float(n) for kind, n in counts.items()})
        out = ctx.stage_dir(stage)
        model = sft_stage.run(config, base.output, data, out, tracker, stage, ctx.cluster)
        inputs = [base.ref, rejected.ref, mixed]
        model_digest, version = record_model(ctx, tracker, stage, model, inputs)
    notes = {"data": ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))}
    notes["model"] = f"v{version}"
    return StageResult(stage, tracker.run_id, model, timing["seconds"], model_digest, notes)
