"""R1-Zero: GRPO with rule rewards straight on the base model, no cold start (a profile whose
R1-Zero rewards name the reward model's score also trains that, on its general data)."""

from __future__ import annotations

from host.threads import settle_process

# before torch loads, in a deployment's flow-run process too: how its threads wait (host/threads.py)
settle_process()

from prefect import flow

from configs.profiles import flow_config
from configs.schema import PipelineConfig
from flows import deployment_run
from flows.hooks import pipeline_cancelled, pipeline_failed
from tasks.result import PipelineResult


@flow(
    name="r1-zero",
    on_failure=[pipeline_failed],
    on_crashed=[pipeline_failed],
    on_cancellation=[pipeline_cancelled],
)
def r1_zero(
    profile: str = "tiny", overrides: list[str] | None = None, config: PipelineConfig | None = None
) -> PipelineResult:
    """Run R1-Zero on `config`, or, when none is given, on the named profile with `overrides`
    (`key=value` settings, as `r1 run --set` takes them)."""
    from cluster.kept import kept_actors
    from tasks.bootstrap import bootstrap_base
    from tasks.evaluation import evaluate_model
    from tasks.general import prepare_general, train_reward_model
    from tasks.pipeline import close_pipeline_run, open_pipeline_run
    from tasks.plan import uses_reward_model
    from tasks.problems import prepare_problems
    from tasks.reasoning_rl import grpo

    config = flow_config(profile, overrides, config, whole=deployment_run())
    with kept_actors(config.cluster):
        ctx = open_pipeline_run(config, flow="r1_zero")
        problems = prepare_problems(config.data, ctx)

        base = bootstrap_base(config.bootstrap, ctx, problems, seed=config.data.world.seed)
        base_eval = evaluate_model(config.evaluation, ctx, base, problems)

        stages, rm = [base], None
        if uses_reward_model(config.r1_zero) and config.data.general:
            general = prepare_general(config.data.general, ctx)
            rm = train_reward_model(config.reward_model, ctx, base, general)
            stages.append(rm)

        zero = grpo(config.r1_zero, ctx, base, problems, "r1_zero_rl", reward_model=rm)
        zero_eval = evaluate_model(config.evaluation, ctx, zero, problems)
        stages.append(zero)
        return close_pipeline_run(ctx, stages, {base.stage: base_eval, zero.stage: zero_eval})
