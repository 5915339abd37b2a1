"""The R1 pipeline: bootstrap -> cold-start curation -> cold-start SFT -> reasoning RL (GRPO),
evaluating each model."""

from __future__ import annotations

from prefect import flow

from configs.loader import load_profile
from configs.schema import PipelineConfig
from tasks.bootstrap import bootstrap_base
from tasks.curation import curate_cold_start
from tasks.evaluation import evaluate_model
from tasks.pipeline import (
    PipelineResult,
    close_pipeline_run,
    mark_pipeline_failed,
    open_pipeline_run,
)
from tasks.problems import prepare_problems
from tasks.reasoning_rl import grpo
from tasks.sft import cold_start_sft


@flow(name="r1_pipeline", on_failure=[mark_pipeline_failed], on_crashed=[mark_pipeline_failed])
def r1_pipeline(profile: str = "tiny", config: PipelineConfig | None = None) -> PipelineResult:
    """Run the stages in order on `config`, or, when none is given, on the named profile."""
    config = config or load_profile(profile)
    ctx = open_pipeline_run(config)
    problems = prepare_problems(config.data, ctx)

    base = bootstrap_base(config.bootstrap, ctx, problems, seed=config.data.world.seed)
    base_eval = evaluate_model(config.evaluation, ctx, base, problems)

    curated = curate_cold_start(config.curation, ctx, problems, base)

    model_1 = cold_start_sft(config.cold_start_sft, ctx, base, curated)
    model_1_eval = evaluate_model(config.evaluation, ctx, model_1, problems)

    model_2 = grpo(config.reasoning_rl, ctx, model_1, problems, stage="reasoning_rl")
    model_2_eval = evaluate_model(config.evaluation, ctx, model_2, problems)

    return close_pipeline_run(
        ctx,
        [base, curated, model_1, model_2],
        {base.stage: base_eval, model_1.stage: model_1_eval, model_2.stage: model_2_eval},
    )
