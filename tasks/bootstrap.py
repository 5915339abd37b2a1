"""Stage 0 task: the policy's base, trained in the tiny world or a local checkpoint."""

from __future__ import annotations

from configs.supervised import BootstrapConfig
from models.saved import ModelRef
from problems.types import ProblemSet
from stages import bootstrap as bootstrap_stage
from tasks.context import (
    RunContext,
    StageResult,
    log_problems,
    record_model,
    tag_checkpoint,
    tracked_stage,
)
from tasks.stage_cache import stage_task

STAGE = "bootstrap"


@stage_task("bootstrap-base-model", stage=STAGE)
def bootstrap_base(
    config: BootstrapConfig, ctx: RunContext, problems: ProblemSet, seed: int = 0
) -> StageResult[ModelRef]:
    with tracked_stage(ctx, STAGE, config) as (tracker, timing):
        if config.path is None:  # trained on a corpus made from the training problems
            inputs = [log_problems(tracker.client, tracker.run_id, problems, "train")]
        else:
            inputs = []
            tag_checkpoint(tracker, config.path, config.hub_id)
        model = bootstrap_stage.run(config, problems, ctx.stage_dir(STAGE), tracker, seed)
        digest, version = record_model(ctx, tracker, STAGE, model, inputs)
    notes = {"params": f"{model.parameters / 1e6:.2f}M", "model": f"v{version}"}
    if config.path is not None:
        notes["checkpoint"] = config.hub_id or config.path.name
    return StageResult(STAGE, tracker.run_id, model, timing["seconds"], digest, notes)
