"""Stage 3 task (and the R1-Zero run): GRPO with rule rewards, registered and traced."""

from __future__ import annotations

import json
from pathlib import Path

from configs.reinforcement import GRPOConfig
from models.saved import ModelRef
from problems.general_files import GeneralFiles
from problems.types import ProblemSet
from stages import reasoning_rl
from stages.reward_model import RewardModelRef
from storage.digests import file_digest
from tasks.context import RunContext, StageResult, log_problems, record_model, tracked_stage
from tasks.general import general_prompts, runtime_rewards
from tasks.guard_report import guard_reported
from tasks.plan import uses_reward_model
from tasks.run_pages import describe_curves
from tasks.stage_cache import stage_task


@stage_task("grpo")
def grpo(
    config: GRPOConfig,
    ctx: RunContext,
    policy: StageResult[ModelRef],
    problems: ProblemSet,
    stage: str = "reasoning_rl",
    general: GeneralFiles | None = None,
    reward_model: StageResult[RewardModelRef] | None = None,
) -> StageResult[ModelRef]:
    """GRPO; with general data and a reward model (stage 6), general prompts join the batch
    and the reward model scores them. The reward model is an input only where a reward term
    names it (`preference`)."""
    reward_model = reward_model if uses_reward_model(config) else None
    with tracked_stage(ctx, stage, config) as (tracker, timing):
        train_digest = log_problems(tracker.client, tracker.run_id, problems, "train")
        tracker.client.set_tag(tracker.run_id, "policy.digest", policy.digest)
        with guard_reported(ctx, tracker, stage) as guard:
            model = reasoning_rl.run(
                config,
                policy.output,
                problems,
                ctx.stage_dir(stage),
                tracker,
                desc=stage,
                general=general_prompts(general, "train") if config.general_prompts else [],
                extra_rewards=runtime_rewards(reward_model),
                cluster=ctx.cluster,
            )
        inputs = [policy.ref, train_digest] + ([reward_model.ref] if reward_model else [])
        if general is not None and config.general_prompts:
            inputs.append(file_digest(general.rl_prompts_path))
        digest, version = record_model(ctx, tracker, stage, model, inputs, guard.promoted)
        describe_curves(tracker.client, tracker.run_id, stage, ctx.stage_dir(stage))
    notes = probe_notes(ctx.stage_dir(stage) / reasoning_rl.PROBE_SUMMARY)
    notes |= guard.notes() | {"model": f"v{version}"}
    return StageResult(stage, tracker.run_id, model, timing["seconds"], digest, notes)


def probe_notes(path: Path) -> dict[str, str]:
    """Held-out pass@1 and response length before and after, when the run probed them."""
    if not path.exists():
        return {}
    summary = json.loads(path.read_text())
    (acc_0, acc_1), (len_0, len_1) = summary["pass_at_1_lenient"], summary["mean_tokens"]
    return {"pass@1": f"{acc_0:.2f}->{acc_1:.2f}", "length": f"{len_0:.0f}->{len_1:.0f}"}
