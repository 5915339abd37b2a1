"""Stage 3 task (and the R1-Zero run): GRPO with rule rewards, registered and traced."""

from __future__ import annotations

from prefect import task

from configs.schema import GRPOConfig
from stages import reasoning_rl
from stages.refs import ModelRef, ProblemSet
from tasks.context import RunContext, StageResult, log_problems, record_model, tracked_stage


@task(name="grpo")
def grpo(
    config: GRPOConfig,
    ctx: RunContext,
    policy: StageResult[ModelRef],
    problems: ProblemSet,
    stage: str = "reasoning_rl",
) -> StageResult[ModelRef]:
    with tracked_stage(ctx, stage, config) as (tracker, timing):
        train_digest = log_problems(tracker.client, tracker.run_id, problems, "train")
        tracker.client.set_tag(tracker.run_id, "policy.digest", policy.digest)
        model = reasoning_rl.run(
            config, policy.output, problems, ctx.stage_dir(stage), tracker, desc=stage
        )
        digest, version = record_model(ctx, tracker, stage, model, [policy.digest, train_digest])
    return StageResult(
        stage, tracker.run_id, model, timing["seconds"], digest, {"model": f"v{version}"}
    )
