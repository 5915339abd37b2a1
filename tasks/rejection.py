"""Stage 4 task (and stage 7's traces): sample into the DuckDB rollout store, filter by SQL,
export the kept set, and record the funnel and the lineage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from prefect import get_run_logger

from configs.schema import RejectionConfig
from evaluation.report import packed
from models.saved import ModelRef
from problems.general_files import GeneralFiles
from problems.types import ProblemSet
from stages import rejection as rejection_stage
from stages.reward_model import RewardModelRef
from storage import rollout_store
from storage.digests import file_digest
from storage.funnel import Funnel, export_kept, run_funnel
from storage.tracking import MlflowTracker
from tasks.context import RunContext, StageResult, log_problems, record_dataset, tracked_stage
from tasks.general import general_prompts, runtime_rewards
from tasks.stage_cache import stage_task


@dataclass(frozen=True)
class RejectionSet:
    """The kept rollouts as a Hugging Face dataset and as Parquet, and the funnel that made it."""

    dataset_path: Path
    parquet_path: Path
    n_rollouts: int
    n_kept: int
    funnel: list[tuple[str, int, int]]  # (filter, rows in, rows out)


class DuckDBSink:
    """The rollouts of one model in the pipeline's DuckDB file."""

    def __init__(self, db: Path, model_id: str):
        self.db = db
        self.model_id = model_id

    def stored(self) -> dict[str, set[int]]:
        return rollout_store.existing_samples(self.db, self.model_id)

    def insert(self, rows: pa.Table) -> int:
        return rollout_store.insert_rollouts(self.db, rows)


@stage_task("rejection-sampling")
def rejection_sample(
    config: RejectionConfig,
    ctx: RunContext,
    policy: StageResult[ModelRef],
    problems: ProblemSet,
    general: GeneralFiles | None,
    reward_model: StageResult[RewardModelRef] | None = None,
    stage: str = "rejection_sampling",
) -> StageResult[RejectionSet]:
    """The policy's digest and the sampling settings key the rollouts (`rollouts_key`), so a
    rerun of the same model and settings resumes, never doubles, and other settings never reuse
    its rows. With general data, its RL prompts join the reasoning prompts."""
    with tracked_stage(ctx, stage, config) as (tracker, timing):
        train_digest = log_problems(tracker.client, tracker.run_id, problems, "train")
        key = rejection_stage.rollouts_key(policy.digest, config)
        tracker.client.set_tag(tracker.run_id, "policy.digest", policy.digest)
        tracker.client.set_tag(tracker.run_id, "rollouts.key", key)
        prompts = rejection_stage.select_prompts(
            config,
            rejection_stage.reasoning_problems(config, problems.train_path),
            general_prompts(general, "train"),
        )
        report = rejection_stage.run(
            config,
            policy.output,
            key,
            prompts,
            DuckDBSink(ctx.paths.duckdb, key),
            tracker,
            runtime_rewards(reward_model),
            stage,
            ctx.cluster,
        )
        funnel = run_funnel(ctx.paths.duckdb, key, config.funnel, tracker.run_id)
        out = ctx.stage_dir(stage)
        digest = export_kept(
            ctx.paths.duckdb, tracker.run_id, out / "kept.parquet", out / "dataset"
        )
        steps = log_funnel(tracker, funnel)
        tracker.log_artifact(out / "kept.parquet", "dataset")
        inputs = [policy.ref, train_digest]
        inputs += [file_digest(general.rl_prompts_path)] if general else []
        inputs += [reward_model.ref] if reward_model else []
        record_dataset(ctx, tracker, stage, out / "kept.parquet", digest, funnel.kept, inputs)
        get_run_logger().info("%s", funnel_text(stage, report, steps))
    n_rollouts = steps[0][1] if steps else 0
    result = RejectionSet(out / "dataset", out / "kept.parquet", n_rollouts, funnel.kept, steps)
    notes: dict[str, object] = {"kept": f"{funnel.kept}/{n_rollouts}"}
    if report.chunks_skipped:
        notes["resumed"] = f"{report.chunks_skipped}/{report.chunks} chunks stored"
    return StageResult(stage, tracker.run_id, result, timing["seconds"], digest, notes)


def funnel_text(
    stage: str, report: rejection_stage.SamplingReport, steps: list[tuple[str, int, int]]
) -> str:
    """`rejection_sampling: 20 prompts, sampled 40`, the chunks a resumed stage took from the
    store, then the funnel, rows kept after each filter, in lines that fit a log line."""
    lines = [f"{stage}: {report.prompts} prompts, sampled {report.sampled}"]
    if report.chunks_skipped:
        lines.append(f"skipped {report.chunks_skipped} stored chunks")
    kept = [f"{name} {n_out}" for name, _, n_out in steps]
    if kept:
        kept[0] = f"funnel: {kept[0]}"
    return "\n".join(lines + packed(kept, " -> "))


def log_funnel(tracker: MlflowTracker, funnel: Funnel) -> list[tuple[str, int, int]]:
    """The SQL funnel on the stage's run: rows kept per filter as metrics and as a table;
    returns its steps as (filter, rows in, rows out)."""
    steps = [(s.name, s.rows_in, s.rows_out) for s in funnel.filters]
    tracker.log_metrics({f"funnel/{name}": float(n_out) for name, _, n_out in steps})
    columns = ("filter", "rows_in", "rows_out")
    table = {column: [s[i] for s in steps] for i, column in enumerate(columns)}
    tracker.client.log_table(tracker.run_id, table, "funnel.json")
    return steps
