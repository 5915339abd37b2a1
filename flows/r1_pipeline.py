"""The R1 pipeline, base model to distilled students, evaluating every stage's model:

0 bootstrap (tiny world) and the preference reward model; R1-Zero (GRPO with rule rewards
straight on the base, the paper's comparison); 1 cold-start curation; 2 cold-start SFT;
3 reasoning RL (GRPO); 4 rejection sampling into DuckDB; 5 mixed SFT from the base; 6 RL for
all scenarios; 7 distillation into each student, with its RL-only twin.
"""

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
    name="r1-pipeline",
    on_failure=[pipeline_failed],
    on_crashed=[pipeline_failed],
    on_cancellation=[pipeline_cancelled],
)
def r1_pipeline(
    profile: str = "tiny",
    overrides: list[str] | None = None,
    config: PipelineConfig | None = None,
    cluster_address: str | None = None,
) -> PipelineResult:
    """Run the stages in order on `config`, or, when none is given, on the named profile with
    `overrides` (`key=value` settings, as `r1 run --set` takes them) and, when given,
    `cluster_address` as its `cluster.address` (the `r1-pipeline/cluster` deployment's 'auto',
    which a run's own overrides add to rather than replace)."""
    from cluster.kept import kept_actors
    from flows.distill import distil_students
    from tasks.bootstrap import bootstrap_base
    from tasks.curation import curate_cold_start
    from tasks.evaluation import evaluate_model
    from tasks.general import prepare_general, train_reward_model
    from tasks.pipeline import close_pipeline_run, open_pipeline_run
    from tasks.problems import prepare_problems
    from tasks.reasoning_rl import grpo
    from tasks.rejection import rejection_sample
    from tasks.sft import cold_start_sft, mixed_sft

    config = flow_config(profile, overrides, config, cluster_address, whole=deployment_run())
    with kept_actors(config.cluster):
        ctx = open_pipeline_run(config)
        problems = prepare_problems(config.data, ctx)
        general = prepare_general(config.data.general, ctx) if config.data.general else None

        base = bootstrap_base(config.bootstrap, ctx, problems, seed=config.data.world.seed)
        rm = train_reward_model(config.reward_model, ctx, base, general) if general else None

        def evaluate(stage):
            return evaluate_model(config.evaluation, ctx, stage, problems, general, rm)

        stages, evals = [base], {base.stage: evaluate(base)}
        if rm is not None:
            stages.append(rm)
        if config.r1_zero_in_pipeline:
            zero = grpo(config.r1_zero, ctx, base, problems, "r1_zero_rl", reward_model=rm)
            stages.append(zero)
            evals[zero.stage] = evaluate(zero)

        sft_length = config.cold_start_sft.train.max_length
        curated = curate_cold_start(config.curation, ctx, problems, base, sft_length)
        model_1 = cold_start_sft(config.cold_start_sft, ctx, base, curated)
        model_2 = grpo(config.reasoning_rl, ctx, model_1, problems, "reasoning_rl", reward_model=rm)
        stages += [curated, model_1, model_2]
        evals |= {m.stage: evaluate(m) for m in (model_1, model_2)}

        rejected = rejection_sample(config.rejection, ctx, model_2, problems, general, rm)
        model_3 = mixed_sft(config.mixed_sft, ctx, base, rejected, general)
        model_4 = grpo(
            config.all_scenarios_rl, ctx, model_3, problems, "all_scenarios_rl", general, rm
        )
        stages += [rejected, model_3, model_4]
        evals |= {m.stage: evaluate(m) for m in (model_3, model_4)}

        students, student_evals = distil_students(
            config, ctx, base, model_4, problems, rm, evaluate
        )
        stages += students
        evals |= student_evals

        return close_pipeline_run(ctx, stages, evals, config.evaluation.k)
