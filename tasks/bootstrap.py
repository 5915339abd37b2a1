"""Stage 0 task: the tiny world's tokenizer and base model."""

from __future__ import annotations

from configs.schema import BootstrapConfig
from stages import bootstrap as bootstrap_stage
from stages.refs import ModelRef, ProblemSet
from tasks.cache import stage_task
from tasks.context import RunContext, StageResult, log_problems, record_model, tracked_stage

STAGE = "bootstrap"


@stage_task("bootstrap-base-model")
def bootstrap_base(
    config: BootstrapConfig, ctx: RunContext, problems: ProblemSet, seed: int = 0
) -> StageResult[ModelRef]:
    with tracked_stage(ctx, STAGE, config) as (tracker, timing):
        train_digest = log_problems(tracker.client, tracker.run_id, problems, "train")
        model = bootstrap_stage.run(config, problems, ctx.stage_dir(STAGE), tracker, seed)
        digest, version = record_model(ctx, tracker, STAGE, model, [train_digest])
    return StageResult(
        STAGE,
        tracker.run_id,
        model,
        timing["seconds"],
        digest,
        {"params": f"{model.parameters / 1e6:.2f}M", "model": f"v{version}"},
    )
