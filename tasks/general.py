"""Non-reasoning data and the preference reward model (for stages 4-6 and evaluation)."""

from __future__ import annotations

from prefect import get_run_logger

from configs.data import GeneralConfig
from configs.reinforcement import RewardModelConfig
from contracts.reward_names import PREFERENCE
from models.saved import ModelRef
from preference.reward import PreferenceReward
from problems.general_files import GeneralFiles, write_general_sets
from problems.loader import load_problems
from problems.types import Problem
from rewards.registry import RewardFn
from stages import reward_model as reward_model_stage
from stages.reward_model import RewardModelRef
from storage import store
from storage.digests import file_digest
from storage.tracking import log_dataset
from tasks.context import RunContext, StageResult, record_model, tracked_stage
from tasks.stage_cache import stage_task

STAGE = "reward_model"


@stage_task("prepare-general-data", retries=1)
def prepare_general(config: GeneralConfig, ctx: RunContext) -> GeneralFiles:
    files = write_general_sets(config, ctx.stage_dir("general"))
    client = ctx.client()
    for name, path in files.paths().items():
        digest = file_digest(path)
        rows = files.counts.get(name, 0)
        log_dataset(client, ctx.parent_run_id, f"general-{name}", digest, path, name, rows)
        store.record_lineage(
            ctx.paths.duckdb, str(path), "problems", digest, "general", ctx.parent_run_id, []
        )
    return files


def general_prompts(files: GeneralFiles | None, split: str) -> list[Problem]:
    """The general prompts for RL ("train") or evaluation ("heldout"); none without the data."""
    if files is None:
        return []
    return load_problems(files.rl_prompts_path if split == "train" else files.eval_prompts_path)


def preference_reward(rm: StageResult[RewardModelRef] | None) -> PreferenceReward | None:
    return None if rm is None else PreferenceReward(rm.output.path)


def runtime_rewards(rm: StageResult[RewardModelRef] | None) -> dict[str, RewardFn]:
    """The rewards a stage can only have at run time, by their config names."""
    return {} if rm is None else {PREFERENCE: PreferenceReward(rm.output.path)}


@stage_task("train-reward-model", stage=STAGE)
def train_reward_model(
    config: RewardModelConfig,
    ctx: RunContext,
    base: StageResult[ModelRef],
    general: GeneralFiles,
) -> StageResult[RewardModelRef]:
    with tracked_stage(ctx, STAGE, config) as (tracker, timing):
        pairs_digest = file_digest(general.pairs_train_path)
        log_dataset(
            tracker.client,
            tracker.run_id,
            "preference-pairs",
            pairs_digest,
            general.pairs_train_path,
            "training",
            general.counts.get("pairs_train", 0),
        )
        rm = reward_model_stage.run(
            config,
            base.output,
            general.pairs_train_path,
            general.pairs_heldout_path,
            ctx.stage_dir(STAGE),
            tracker,
        )
        model = ModelRef(rm.path, rm.parameters)
        digest, version = record_model(ctx, tracker, STAGE, model, [base.ref, pairs_digest])
    get_run_logger().info(
        "held-out pairwise accuracy %.3f\nbefore training %.3f",
        rm.heldout_accuracy,
        rm.accuracy_before,
    )
    notes = {"pair_acc": f"{rm.accuracy_before:.2f}->{rm.heldout_accuracy:.2f}"}
    return StageResult(STAGE, tracker.run_id, rm, timing["seconds"], digest, notes)
