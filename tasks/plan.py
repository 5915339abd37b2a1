"""The stages a flow will run on a config, in order: what "stage 6 of 16" counts.

The flows compose their tasks directly; this list says the same in one place so that a stage's
progress can name its place in the run. `tests/pipeline` checks it against the stages a real
run of each flow produced, so the two cannot drift apart unseen.
"""

from __future__ import annotations

from configs.reinforcement import GRPOConfig
from configs.schema import PipelineConfig
from contracts.reward_names import PREFERENCE


def uses_reward_model(config: GRPOConfig) -> bool:
    """Whether a GRPO stage's rewards include the reward model's score."""
    return any(term.name == PREFERENCE for term in config.rewards)


def student_stages(config: PipelineConfig) -> list[str]:
    """Stage 7: the teacher's traces, then per student its base, its distillation and its
    RL-only twin."""
    distill = config.distillation
    if not distill.students:
        return []
    stages = ["distill_traces"]
    for student in distill.students:
        stages += [f"student_base_{student.name}", f"student_{student.name}"]
        if distill.rl_twins:
            stages.append(f"rl_only_{student.name}")
    return stages


def pipeline_stages(config: PipelineConfig) -> list[str]:
    """flows/r1_pipeline.py, stage by stage."""
    stages = ["bootstrap"]
    if config.data.general:
        stages.append("reward_model")
    if config.r1_zero_in_pipeline:
        stages.append("r1_zero_rl")
    stages += ["cold_start_curation", "cold_start_sft", "reasoning_rl"]
    stages += ["rejection_sampling", "mixed_sft", "all_scenarios_rl"]
    return stages + student_stages(config)


def r1_zero_stages(config: PipelineConfig) -> list[str]:
    """flows/r1_zero.py: the base, the reward model where a reward term names it, R1-Zero."""
    trains_rm = uses_reward_model(config.r1_zero) and bool(config.data.general)
    return ["bootstrap"] + (["reward_model"] if trains_rm else []) + ["r1_zero_rl"]


FLOW_STAGES = {
    "r1_pipeline": pipeline_stages,
    "r1_zero": r1_zero_stages,
    "distill": student_stages,
}


def planned_stages(config: PipelineConfig, flow: str) -> tuple[str, ...]:
    """The stages `flow` runs on `config`, in order; none for a flow this does not know."""
    plan = FLOW_STAGES.get(flow)
    return tuple(plan(config)) if plan else ()


class FaultStageError(ValueError):
    """`faults.fail_once_at` names a stage the flow does not run: the fault would never fire."""


def check_fault_stage(config: PipelineConfig, flow: str) -> None:
    """Raise FaultStageError when `faults.fail_once_at` names no stage of `flow` on `config`."""
    fail_at = config.faults.fail_once_at
    plan = planned_stages(config, flow)
    stage = (fail_at or "").partition("@")[0]
    if fail_at and plan and stage not in plan:
        raise FaultStageError(
            f"faults.fail_once_at {fail_at!r}: {flow} runs no stage {stage!r} on this profile; "
            f"its stages: {', '.join(plan)}"
        )
