"""The tasks of a scheduled evaluation of a registered model: its MLflow run, the regenerated
held-out data, the evaluation itself, and the verdict against the latest earlier evaluation of
the same alias with the same settings (recorded in DuckDB's `eval_history` and `eval_settings`,
and as the MLflow run's `settings.*` params)."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from mlflow import MlflowClient
from prefect import get_run_logger, runtime, task
from prefect.artifacts import create_markdown_artifact

from configs.cluster import ClusterConfig
from configs.data import DataConfig
from configs.profiles import ConfigError, known_profiles, load_profile
from configs.reinforcement import EvalConfig
from configs.schema import PipelineConfig
from evaluation.metrics import EvalReport
from evaluation.settings import evaluation_settings
from evaluation.verdict import (
    EvaluationVerdict,
    artifact_key,
    judge,
    verdict_line,
    verdict_markdown,
)
from models.saved import ModelRef
from preference.reward import PreferenceReward
from problems.general_files import GeneralFiles, write_general_sets
from problems.loader import load_problems
from problems.types import ProblemSet
from stages import evaluate as evaluate_stage
from stages import problems as problems_stage
from storage import eval_history, store
from storage.digests import file_digest
from storage.lineage import InputRef
from storage.model_registry import ModelSpec, RegisteredModel, parse_alias_uri
from storage.paths import StatePaths
from storage.tracking import (
    FLOW_RUN_TAG,
    STAGE_TAG,
    MlflowTracker,
    alias_for,
    experiment_id,
    finish_run,
    log_dataset,
    tracking_client,
)
from tasks.stage_cache import telling_full_disks

log = logging.getLogger(__name__)

EVALUATION_STAGE = "evaluation"
DEPLOYMENT = "evaluate-model/final-nightly"  # prefect.yaml
FINAL_ALIAS = alias_for("all_scenarios_rl")
SAMPLE_ROWS = 50  # completions shown in the MLflow table; all of them stay in the Parquet file
SETTINGS_PREFIX = "settings."  # the MLflow params that hold the evaluation's settings
# The code that grades completions and summarises the grades: an edit to it changes what the
# figures measure, so its digest is the `verifiers` setting.
GRADING_MODULES = (
    "contracts.answer_format",
    "evaluation.metrics",
    "rewards.accuracy",
    "rewards.code",
    "rewards.countdown",
    "rewards.language",
    "rewards.verifiers",
)


@dataclass(frozen=True)
class EvalData:
    """The regenerated held-out suites of one evaluation."""

    problems: ProblemSet
    general_prompts_path: Path | None
    digests: dict[str, str]


def model_to_evaluate(model: str | None, config: PipelineConfig) -> ModelSpec:
    """`model`, or the profile's final model: `models:/<the profile's model name>@final`."""
    spec = parse_alias_uri(model or f"models:/{config.name}@{FINAL_ALIAS}")
    if spec.name != config.name:
        log.warning(
            "evaluating %s on the held-out suites of a profile whose models are %s",
            spec.uri,
            config.name,
        )
    return spec


def profiles_by_model() -> dict[str, str]:
    """The registered model name of each profile in configs/ -> that profile."""
    found: dict[str, str] = {}
    for profile in known_profiles():
        try:
            found.setdefault(load_profile(profile).name, profile)
        except ConfigError:
            continue
    return found


def earned_alias(client: Any, spec: ModelSpec) -> bool:
    """Whether a stage once gave a version of `spec`'s model the alias `spec` names (tag
    `r1.alias`): an alias deleted since (in the MLflow UI), not one no run sets."""
    from storage.tracking import ALIAS_TAG

    if spec.alias is None:
        return False
    versions = client.search_model_versions(f"name = '{spec.name}'")
    return any(version.tags.get(ALIAS_TAG) == spec.alias for version in versions)


def retarget_hint(spec: ModelSpec, profile: str, paths: StatePaths) -> str:
    """What to run to evaluate a model the registry holds, when it lacks `spec`: the command
    with the profile whose final model is registered, and how to name any alias; for an alias
    a stage gave the model and that was deleted since (in the MLflow UI), the run that puts it
    back."""
    client = tracking_client(paths)
    registered = {m.name for m in client.search_registered_models()}
    if spec.name in registered and earned_alias(client, spec):  # one of its stages' aliases
        return (
            f"A run of profile '{profile}' with the same settings puts its aliases back on its "
            f"models (r1 run --profile {profile}; a stage whose registered version was deleted "
            f"is computed again), or name an alias it has: --param model=models:/{spec.name}@ALIAS"
        )
    profiles = profiles_by_model()
    # the profile's own model first: where it is registered, the model asked for is what lacks
    names = sorted(registered & profiles.keys(), key=lambda n: (profiles[n] != profile, n))
    command = f"prefect deployment run '{DEPLOYMENT}'"
    if not names:
        return (
            f"Run the pipeline on profile '{profile}' first, or name a registered model: "
            f"{command} --param model=models:/NAME@ALIAS --param profile=PROFILE"
        )
    name = names[0]
    other = profiles[name]
    if other == profile:
        return (
            f"Without --param model, profile '{profile}' evaluates {name}@{FINAL_ALIAS}: "
            f"{command} --param profile={profile} (any alias of it: --param "
            f"model=models:/{name}@ALIAS)"
        )
    return (
        f"Profile '{profile}' evaluates {spec.uri}; to evaluate {name}@{FINAL_ALIAS}, name "
        f"its profile: {command} --param profile={other} (any alias: add "
        f"--param model=models:/{name}@ALIAS)"
    )


def evaluation_dir(paths: StatePaths, run_id: str) -> Path:
    """Where one evaluation keeps its regenerated data and its samples."""
    return paths.root / "evaluations" / run_id


def model_tags(model: RegisteredModel, flow_run_id: str) -> dict[str, str]:
    """The tags that link an evaluation run to the registered version it evaluated."""
    return {
        "model.name": model.name,
        "model.alias": model.alias or "",
        "model.version": model.version,
        "model.source_run_id": model.source_run_id,
        "model.digest": model.digest,
        FLOW_RUN_TAG: flow_run_id,
        STAGE_TAG: EVALUATION_STAGE,
    }


@cache
def verifiers_version() -> str:
    """Digest of the grading modules' sources (GRADING_MODULES), as this process runs them."""
    h = hashlib.sha256()
    for name in GRADING_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"grading module {name} not found")
        h.update(name.encode())
        h.update(file_digest(Path(spec.origin)).encode())
    return h.hexdigest()


def settings_of(
    config: EvalConfig, data: EvalData, reward_model: RegisteredModel | None
) -> dict[str, str]:
    """This evaluation's settings (evaluation/settings.py): what its figures measure."""
    judge_digest = None if reward_model is None else reward_model.digest
    return evaluation_settings(config, data.digests, judge_digest, verifiers_version())


@task(name="open-evaluation-run", task_run_name="open-evaluation-run")
@telling_full_disks
def open_evaluation_run(
    paths: StatePaths, model: RegisteredModel, settings: dict[str, Any], config: EvalConfig
) -> str:
    """An MLflow run in `NAME-evaluation`, tagged with the model; returns its id."""
    client = tracking_client(paths)
    flow_run_id = str(runtime.flow_run.id or "no-flow-run")
    experiment = experiment_id(client, f"{model.name}-evaluation", paths)
    run = client.create_run(
        experiment,
        run_name=f"{model.alias}-v{model.version}-{flow_run_id[:8]}",
        tags=model_tags(model, flow_run_id),
    )
    run_id = run.info.run_id
    for key, value in settings.items():
        client.log_param(run_id, key, value)
    client.log_dict(run_id, config.model_dump(mode="json"), "config.json")
    get_run_logger().info("MLflow evaluation run %s in %s", run_id, paths.tracking_uri)
    return run_id


@task(name="prepare-heldout-data", task_run_name="prepare-heldout-data")
@telling_full_disks
def prepare_data(config: DataConfig, paths: StatePaths, run_id: str) -> EvalData:
    """Regenerate the profile's held-out problems and general prompts (the same seeds give the
    same files the pipeline evaluated on) and record them as the run's inputs; what else
    regenerating them writes is removed (`drop_training_sets`)."""
    out = evaluation_dir(paths, run_id)
    problems = problems_stage.run(config, out / "problems")
    general = write_general_sets(config.general, out / "general") if config.general else None
    drop_training_sets(problems, general)
    inputs = {"problems-heldout": (problems.heldout_path, problems.n_heldout)}
    if general is not None:
        inputs["general-eval_prompts"] = (
            general.eval_prompts_path,
            general.counts.get("eval_prompts", 0),
        )
    client = tracking_client(paths)
    digests = {}
    for dataset, (path, rows) in inputs.items():
        digests[dataset] = file_digest(path)
        log_dataset(client, run_id, dataset, digests[dataset], path, "eval", rows)
        client.set_tag(run_id, f"data.{dataset}.digest", digests[dataset])
    return EvalData(problems, None if general is None else general.eval_prompts_path, digests)


def drop_training_sets(problems: ProblemSet, general: GeneralFiles | None) -> None:
    """Remove the sets an evaluation never reads that regenerating its suites writes beside them:
    the training problems (with real data, the whole training file, read to refuse a held-out
    question it also holds, and written again) and the general training sets. Each night's
    evaluation kept them in its folder for good: 2.1 of the 2.5 MB it wrote for tiny."""
    unread = [problems.train_path]
    if general is not None:
        unread += [
            general.sft_path,
            general.pairs_train_path,
            general.pairs_heldout_path,
            general.rl_prompts_path,
        ]
    for path in unread:
        path.unlink(missing_ok=True)


@task(name="evaluate-registered-model", task_run_name="evaluate-registered-model")
@telling_full_disks
def evaluate_registered_model(
    config: EvalConfig,
    paths: StatePaths,
    model: RegisteredModel,
    data: EvalData,
    reward_model: RegisteredModel | None,
    run_id: str,
    cluster: ClusterConfig | None = None,
) -> EvalReport:
    """The pipeline's held-out evaluation of the downloaded version, logged as `eval/*`."""
    client = tracking_client(paths)
    tracker = MlflowTracker(client, run_id)
    general = load_problems(data.general_prompts_path) if data.general_prompts_path else []
    report = evaluate_stage.run(
        config,
        ModelRef(model.path),
        data.problems,
        evaluation_dir(paths, run_id) / "eval",
        tracker,
        general=general,
        scorer=None if reward_model is None else PreferenceReward(reward_model.path),
        cluster=cluster,
    )
    tracker.log_artifact(report.samples_path, "eval")
    samples = pq.read_table(report.samples_path).slice(0, SAMPLE_ROWS).to_pylist()
    client.log_table(run_id, {k: [r[k] for r in samples] for k in samples[0]}, "eval/samples.json")
    if reward_model is not None:
        client.set_tag(run_id, "reward_model.version", reward_model.version)
    store.record_lineage(
        paths.duckdb,
        str(report.samples_path),
        "eval",
        file_digest(report.samples_path),
        EVALUATION_STAGE,
        run_id,
        [InputRef(model.digest, model.source_run_id), *data.digests.values()],
    )
    get_run_logger().info(
        "%s v%s: %s",
        model.uri,
        model.version,
        ", ".join(f"{k}={v:.3f}" for k, v in report.metrics.items()),
    )
    return report


@task(name="record-evaluation", task_run_name="record-evaluation")
@telling_full_disks
def record_evaluation(
    paths: StatePaths,
    model: RegisteredModel,
    run_id: str,
    metrics: dict[str, float],
    max_drop: dict[str, float],
    settings: dict[str, str],
) -> EvaluationVerdict:
    """Compare with the latest earlier evaluation of the alias with the same settings that did
    not regress (no verdict when there is none), append to the history with its settings and
    verdict, publish the verdict, and close the MLflow run (FAILED on a regression)."""
    alias = model.alias or ""
    client = tracking_client(paths)
    for name, value in settings.items():
        client.log_param(run_id, SETTINGS_PREFIX + name, value)
    earlier = eval_history.earlier(paths.duckdb, model.name, alias, run_id)
    verdict = judge(model, run_id, metrics, settings, earlier, max_drop)
    eval_history.append(
        paths.duckdb,
        model.name,
        alias,
        model.version,
        model.digest,
        run_id,
        model.source_run_id,
        metrics,
        settings=settings,
        verdict=verdict.outcome,
    )
    get_run_logger().info("%s", verdict_line(verdict, max_drop))
    close_evaluation_run(client, verdict)
    create_markdown_artifact(
        key=artifact_key(alias),
        markdown=verdict_markdown(verdict, max_drop, paths.tracking_uri),
        description=f"evaluation of {model.uri} against its previous evaluation",
    )
    return verdict


def close_evaluation_run(client: MlflowClient, verdict: EvaluationVerdict) -> None:
    """Tag the run with what it was compared with and its verdict (`ok`, `regression`, or
    `settings-differ` with the settings that differ from the latest earlier evaluation's), and
    end it."""
    run_id = verdict.mlflow_run_id
    if verdict.previous is not None:
        client.set_tag(run_id, "previous.run_id", verdict.previous.mlflow_run_id)
        client.set_tag(run_id, "previous.version", verdict.previous.version)
    if verdict.unlike is not None:
        client.set_tag(run_id, "unlike.run_id", verdict.unlike.mlflow_run_id)
    if verdict.unlike_settings:
        client.set_tag(
            run_id, "settings.differ", "\n".join(d.line() for d in verdict.unlike_settings)
        )
    client.set_tag(run_id, "verdict", verdict.outcome)
    if verdict.regressions:
        client.set_tag(run_id, "regression", "\n".join(verdict.regressions))
    finish_run(client, run_id, failed=bool(verdict.regressions))
