"""Evaluation task: held-out metrics for a stage's model, logged into that stage's run."""

from __future__ import annotations

import pyarrow.parquet as pq
from prefect import get_run_logger

from configs.reinforcement import EvalConfig
from evaluation.metrics import EvalReport
from evaluation.report import figure_lines
from models.saved import ModelRef
from problems.general_files import GeneralFiles
from problems.types import ProblemSet
from stages import evaluate as evaluate_stage
from stages.reward_model import RewardModelRef
from storage.tracking import MlflowTracker
from tasks.context import RunContext, StageResult, log_problems
from tasks.general import general_prompts, preference_reward
from tasks.stage_cache import stage_task

SAMPLE_ROWS = 50  # completions shown in the MLflow table; all of them stay in the Parquet file


def evaluation_name(parameters: dict) -> str:
    """`evaluate: cold_start_sft`: the task run named after the stage whose model it judges."""
    return f"evaluate: {parameters['stage'].stage}"


@stage_task("evaluate-model", run_name=evaluation_name)
def evaluate_model(
    config: EvalConfig,
    ctx: RunContext,
    stage: StageResult[ModelRef],
    problems: ProblemSet,
    general: GeneralFiles | None = None,
    reward_model: StageResult[RewardModelRef] | None = None,
) -> EvalReport:
    """Held-out metrics; with general data and a reward model, the general score too."""
    client = ctx.client()
    tracker = MlflowTracker(client, stage.run_id)
    log_problems(client, stage.run_id, problems, "heldout")
    report = evaluate_stage.run(
        config,
        stage.output,
        problems,
        ctx.stage_dir(stage.stage) / "eval",
        tracker,
        general=general_prompts(general, "heldout"),
        scorer=preference_reward(reward_model),
        cluster=ctx.cluster,
    )
    tracker.log_artifact(report.samples_path, "eval")
    samples = pq.read_table(report.samples_path).slice(0, SAMPLE_ROWS).to_pylist()
    client.log_table(
        stage.run_id, {k: [r[k] for r in samples] for k in samples[0]}, "eval/samples.json"
    )
    figures = "\n".join(figure_lines(report.metrics, config.k))
    get_run_logger().info("held-out figures:\n%s", figures)
    return report
