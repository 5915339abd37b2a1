"""Stage 7 tasks: each student's base, its distillation, and its RL-only twin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from configs.reinforcement import GRPOConfig
from configs.schema import StudentConfig, StudentTraining
from configs.supervised import CorpusConfig
from models.saved import ModelRef
from problems.types import ProblemSet
from stages import bootstrap as bootstrap_stage
from stages import distill as distill_stage
from stages.mixed import build_sft_set
from stages.reward_model import RewardModelRef
from storage.tracking import log_dataset
from tasks.context import (
    RunContext,
    StageResult,
    log_problems,
    record_model,
    tag_checkpoint,
    tracked_stage,
)
from tasks.general import runtime_rewards
from tasks.guard_report import guard_reported
from tasks.plan import uses_reward_model
from tasks.rejection import RejectionSet
from tasks.run_pages import describe_curves
from tasks.stage_cache import stage_task


def student_stage(prefix: str) -> Callable[[dict[str, Any]], str]:
    """The stage name of a per-student task's call: `prefix` and the student's name."""
    return lambda parameters: prefix + parameters["student"].name


@stage_task("student-base", stage=student_stage("student_base_"))
def student_base(
    student: StudentConfig,
    corpus: CorpusConfig,
    ctx: RunContext,
    base: StageResult[ModelRef],
    problems: ProblemSet,
    seed: int = 0,
) -> StageResult[ModelRef]:
    """A real student is a local checkpoint; the tiny world pretrains one like its base."""
    stage = f"student_base_{student.name}"
    with tracked_stage(ctx, stage, student) as (tracker, timing):
        if student.path is not None:  # a raw input: it derives from nothing in this run
            tag_checkpoint(tracker, student.path, student.hub_id)
            model, inputs = bootstrap_stage.from_checkpoint(student.path, tracker), []
        else:  # the base's tokenizer, a corpus made from the training problems
            model = bootstrap_stage.pretrain_student(
                student, corpus, base.output, problems, ctx.stage_dir(stage), tracker, seed
            )
            inputs = [base.ref, log_problems(tracker.client, tracker.run_id, problems, "train")]
        digest, version = record_model(ctx, tracker, stage, model, inputs)
    notes = {"params": f"{model.parameters / 1e6:.2f}M", "model": f"v{version}"}
    if student.path is not None:
        notes["checkpoint"] = student.hub_id or student.path.name
    return StageResult(stage, tracker.run_id, model, timing["seconds"], digest, notes)


@stage_task("distill-student", stage=student_stage("student_"))
def distill_student(
    config: StudentTraining,
    student: StudentConfig,
    ctx: RunContext,
    base: StageResult[ModelRef],
    teacher: StageResult[ModelRef],
    traces: StageResult[RejectionSet],
    problems: ProblemSet,
) -> StageResult[ModelRef]:
    stage = f"student_{student.name}"
    with tracked_stage(ctx, stage, config) as (tracker, timing):
        distill_stage.check_smaller(base.output, teacher.output, student.name)
        log_dataset(
            tracker.client,
            tracker.run_id,
            "distillation-traces",
            traces.digest,
            traces.output.parquet_path,
            "training",
            traces.output.n_kept,
        )
        data, _ = build_sft_set(traces.output.dataset_path, None, ctx.stage_dir(stage))
        model = distill_stage.distill(
            config,
            base.output,
            teacher.output,
            data,
            problems,
            ctx.stage_dir(stage),
            tracker,
            stage,
            ctx.cluster,
        )
        inputs = [base.ref, teacher.ref, traces.ref]
        if config.method == "on_policy":  # the training problems are its prompts
            inputs.append(log_problems(tracker.client, tracker.run_id, problems, "train"))
        digest, version = record_model(ctx, tracker, stage, model, inputs)
    notes = {"params": f"{model.parameters / 1e6:.2f}M", "model": f"v{version}"}
    return StageResult(stage, tracker.run_id, model, timing["seconds"], digest, notes)


@stage_task("rl-only-twin", stage=student_stage("rl_only_"))
def rl_only_twin(
    config: GRPOConfig,
    student: StudentConfig,
    ctx: RunContext,
    base: StageResult[ModelRef],
    problems: ProblemSet,
    seconds: float,
    reward_model: StageResult[RewardModelRef] | None = None,
) -> StageResult[ModelRef]:
    """The same student base, GRPO alone (`distillation.rl_twin`), for the wall time its
    distillation took (the reward model scores too where the twin's rewards name it)."""
    stage = f"rl_only_{student.name}"
    reward_model = reward_model if uses_reward_model(config) else None
    with tracked_stage(ctx, stage, config) as (tracker, timing):
        train_digest = log_problems(tracker.client, tracker.run_id, problems, "train")
        with guard_reported(ctx, tracker, stage) as guard:
            model = distill_stage.rl_twin(
                config,
                base.output,
                problems,
                seconds,
                ctx.stage_dir(stage),
                tracker,
                stage,
                runtime_rewards(reward_model),
                ctx.cluster,
            )
        inputs = [base.ref, train_digest] + ([reward_model.ref] if reward_model else [])
        digest, version = record_model(ctx, tracker, stage, model, inputs, guard.promoted)
        describe_curves(tracker.client, tracker.run_id, stage, ctx.stage_dir(stage))
    notes = {"budget": f"{seconds:.0f}s"} | guard.notes() | {"model": f"v{version}"}
    return StageResult(stage, tracker.run_id, model, timing["seconds"], digest, notes)
