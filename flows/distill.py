"""Stage 7 alone: distil a registered teacher (by default the pipeline's final model) into the
profile's students, each with its RL-only twin, as the last stage of `r1-pipeline` does."""

from __future__ import annotations

from host.threads import settle_process

# before torch loads, in a deployment's flow-run process too: how its threads wait (host/threads.py)
settle_process()

from typing import TYPE_CHECKING

from prefect import flow

from configs.profiles import flow_config
from configs.schema import PipelineConfig
from flows import deployment_run
from flows.hooks import pipeline_cancelled, pipeline_failed
from tasks.result import PipelineResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from evaluation.metrics import EvalReport
    from models.saved import ModelRef
    from problems.types import ProblemSet
    from tasks.context import RunContext, StageResult


def distil_students(
    config: PipelineConfig,
    ctx: RunContext,
    base: StageResult[ModelRef],
    teacher: StageResult[ModelRef],
    problems: ProblemSet,
    reward_model: StageResult | None,
    evaluate: Callable[[StageResult], EvalReport],
) -> tuple[list[StageResult], dict[str, EvalReport]]:
    """Stage 7: the teacher's traces, then per student its base, its distillation and its
    RL-only twin; the stage results in order and the students' evaluations."""
    from tasks.distill import distill_student, rl_only_twin, student_base
    from tasks.rejection import rejection_sample

    distill = config.distillation
    stages: list[StageResult] = []
    evals: dict[str, EvalReport] = {}
    if not distill.students:
        return stages, evals
    traces = rejection_sample(
        distill.traces, ctx, teacher, problems, None, reward_model, stage="distill_traces"
    )
    stages.append(traces)
    for student in distill.students:
        s_base = student_base(student, config.bootstrap.corpus, ctx, base, problems)
        s_model = distill_student(
            distill.student_training(), student, ctx, s_base, teacher, traces, problems
        )
        stages += [s_base, s_model]
        evals[s_model.stage] = evaluate(s_model)
        if distill.rl_twins:
            twin = rl_only_twin(
                distill.rl_twin, student, ctx, s_base, problems, s_model.seconds, reward_model
            )
            stages.append(twin)
            evals[twin.stage] = evaluate(twin)
    return stages, evals


@flow(
    name="distill",
    on_failure=[pipeline_failed],
    on_crashed=[pipeline_failed],
    on_cancellation=[pipeline_cancelled],
)
def distill(
    profile: str = "tiny",
    overrides: list[str] | None = None,
    teacher: str = "models:/r1-tiny@final",
    config: PipelineConfig | None = None,
) -> PipelineResult:
    """Sample the teacher's traces, then per student: its base, its distillation, its twin.
    The students' tiny-world bases pretrain from the registered bootstrap model's tokenizer."""
    from cluster.kept import kept_actors
    from storage import model_registry
    from storage.tracking import alias_for
    from tasks.evaluation import evaluate_model
    from tasks.general import prepare_general
    from tasks.pipeline import close_pipeline_run, open_pipeline_run
    from tasks.problems import prepare_problems
    from tasks.registered import as_stage_result, registered_model, teacher_hint

    name = model_registry.parse_model(teacher).name  # a bad URI fails before a store opens
    config = flow_config(profile, overrides, config, whole=deployment_run())
    with kept_actors(config.cluster):
        ctx = open_pipeline_run(config, flow="distill")
        problems = prepare_problems(config.data, ctx)
        general = prepare_general(config.data.general, ctx) if config.data.general else None

        def registered(uri: str, stage: str, hint: str = "") -> StageResult[ModelRef]:
            return as_stage_result(registered_model(ctx.paths, uri, hint), stage)

        model = registered(teacher, "teacher", teacher_hint(name, config.name))
        base = registered(f"models:/{name}@{alias_for('bootstrap')}", "bootstrap")
        rm = (
            registered(f"models:/{name}@{alias_for('reward_model')}", "reward_model")
            if general
            else None
        )

        def evaluate(stage: StageResult) -> EvalReport:
            return evaluate_model(config.evaluation, ctx, stage, problems, general, rm)

        stages, evals = distil_students(config, ctx, base, model, problems, rm, evaluate)
        return close_pipeline_run(ctx, stages, evals, config.evaluation.k)
