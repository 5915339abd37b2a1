"""Scheduled evaluation of a registered model: `models:/NAME@ALIAS` on the held-out suites.

The flow resolves the alias in the state folder's MLflow registry, downloads that version,
regenerates the profile's held-out problems (and general prompts) deterministically, evaluates
with the pipeline's own evaluation stage (scoring general prompts with `NAME@reward-model` when
one is registered), and records an MLflow run in the experiment `NAME-evaluation` tagged with the
model it evaluated. Each evaluation is appended to the DuckDB table `eval_history` and compared
with the previous evaluation of the same alias: a drop of pass@1 or of the general score beyond
`max_drop` marks the MLflow run FAILED and ends the Prefect flow run Failed, naming the metrics.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch
from mlflow import MlflowClient
from prefect import flow, get_run_logger, runtime, task
from prefect.artifacts import create_markdown_artifact

from configs.data import DataConfig
from configs.loader import load_profile
from configs.preflight import check_inputs
from configs.reinforcement import EvalConfig
from evaluation.metrics import EvalReport
from models.saved import ModelRef
from preference.reward import PreferenceReward
from problems.general import write_general_sets
from problems.loader import load_problems
from problems.types import ProblemSet
from stages import evaluate as evaluate_stage
from stages import problems as problems_stage
from storage import eval_history, registry, store
from storage.digests import file_digest, tree_digest
from storage.lineage import InputRef
from storage.paths import StatePaths
from storage.tracking import (
    FLOW_RUN_TAG,
    STAGE_TAG,
    MlflowTracker,
    alias_for,
    check_tracking_store,
    experiment_id,
    finish_run,
    log_dataset,
    tracking_client,
)

log = logging.getLogger(__name__)

URI_PATTERN = re.compile(r"models:/(?P<name>[A-Za-z0-9][\w.\-]*)@(?P<alias>[A-Za-z0-9][\w\-]*)")
REWARD_MODEL_ALIAS = alias_for("reward_model")
EVALUATION_STAGE = "evaluation"
WATCHED = ("pass_at_1", "general_score")  # the metrics a regression is judged on
SAMPLE_ROWS = 50  # completions shown in the MLflow table; all of them stay in the Parquet file


class EvaluationRegression(RuntimeError):
    """The evaluated version is worse than the previous evaluation of its alias."""


@dataclass(frozen=True)
class RegisteredModel:
    """A registered model version, downloaded into the state folder."""

    name: str
    alias: str
    version: str
    source_run_id: str
    path: Path
    digest: str

    @property
    def uri(self) -> str:
        return f"models:/{self.name}@{self.alias}"


@dataclass(frozen=True)
class EvalData:
    """The regenerated held-out suites of one evaluation."""

    problems: ProblemSet
    general_prompts_path: Path | None
    digests: dict[str, str]


@dataclass(frozen=True)
class Verdict:
    """What an evaluation found, against the previous evaluation of the same alias."""

    model: RegisteredModel
    mlflow_run_id: str
    metrics: dict[str, float]
    previous: eval_history.Evaluation | None
    regressions: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.model.uri,
            "name": self.model.name,
            "alias": self.model.alias,
            "version": self.model.version,
            "model_digest": self.model.digest,
            "source_run_id": self.model.source_run_id,
            "mlflow_run_id": self.mlflow_run_id,
            "metrics": dict(self.metrics),
            "previous": None if self.previous is None else dict(self.previous.metrics),
            "previous_run_id": None if self.previous is None else self.previous.mlflow_run_id,
            "previous_version": None if self.previous is None else self.previous.version,
            "regressions": list(self.regressions),
        }


# ---- the registry ----------------------------------------------------------------------------


def parse_model_uri(uri: str) -> tuple[str, str]:
    """`models:/NAME@ALIAS` -> (NAME, ALIAS); anything else (a version number, a run URI, a path)
    is refused with a message saying what is expected."""
    match = URI_PATTERN.fullmatch(uri.strip()) if isinstance(uri, str) else None
    if match is None:
        raise ValueError(
            f"model {uri!r} is not of the form models:/NAME@ALIAS (for example "
            f"models:/r1-tiny@final); a version number, run URI or path is not accepted"
        )
    return match["name"], match["alias"]


def registered_model(
    client: MlflowClient, paths: StatePaths, name: str, alias: str
) -> RegisteredModel:
    """The version `name@alias` points at, its files fetched once into the state folder's
    `registry/` (shared with the other flows that use registered models). A clear error when the
    name or the alias is unknown, or when the version holds no saved model."""
    resolved = registry.resolve(client, registry.ModelSpec(name, alias=alias))
    path = registry.download(client, resolved, paths.root / "registry")
    if not (path / "config.json").exists():
        raise registry.RegistryError(
            f"{resolved.spec.uri} (version {resolved.version}) holds no saved model "
            f"(no config.json in {path})"
        )
    tags = client.get_run(resolved.run_id).data.tags
    return RegisteredModel(
        name=name,
        alias=alias,
        version=resolved.version,
        source_run_id=resolved.run_id,
        path=path,
        digest=tags.get("model.digest") or tree_digest(path),
    )


@task(name="resolve-registered-model")
def resolve_model(paths: StatePaths, name: str, alias: str) -> RegisteredModel:
    """Resolve `name@alias` in the state folder's registry and download that version."""
    model = registered_model(tracking_client(paths), paths, name, alias)
    get_run_logger().info("%s is version %s, in %s", model.uri, model.version, model.path)
    return model


@task(name="resolve-reward-model")
def resolve_reward_model(paths: StatePaths, name: str) -> RegisteredModel | None:
    """`name@reward-model` downloaded, or None when none is registered (no general score)."""
    client = tracking_client(paths)
    try:
        registry.resolve(client, registry.ModelSpec(name, alias=REWARD_MODEL_ALIAS))
    except registry.RegistryError as err:
        get_run_logger().info("no reward model, so no general score: %s", err)
        return None
    return registered_model(client, paths, name, REWARD_MODEL_ALIAS)


# ---- the evaluation run ----------------------------------------------------------------------


def evaluation_dir(paths: StatePaths, run_id: str) -> Path:
    """Where one evaluation keeps its regenerated data and its samples."""
    return paths.root / "evaluations" / run_id


def model_tags(model: RegisteredModel, flow_run_id: str) -> dict[str, str]:
    """The tags that link an evaluation run to the registered version it evaluated."""
    return {
        "model.name": model.name,
        "model.alias": model.alias,
        "model.version": model.version,
        "model.source_run_id": model.source_run_id,
        "model.digest": model.digest,
        FLOW_RUN_TAG: flow_run_id,
        STAGE_TAG: EVALUATION_STAGE,
    }


@task(name="open-evaluation-run")
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


@task(name="prepare-heldout-data")
def prepare_data(config: DataConfig, paths: StatePaths, run_id: str) -> EvalData:
    """Regenerate the profile's held-out problems and general prompts (the same seeds give the
    same files the pipeline evaluated on) and record them as the run's inputs."""
    out = evaluation_dir(paths, run_id)
    problems = problems_stage.run(config, out / "problems")
    general = write_general_sets(config.general, out / "general") if config.general else None
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


@task(name="evaluate-registered-model")
def evaluate_model(
    config: EvalConfig,
    paths: StatePaths,
    model: RegisteredModel,
    data: EvalData,
    reward_model: RegisteredModel | None,
    run_id: str,
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


@task(name="record-evaluation")
def record_evaluation(
    paths: StatePaths,
    model: RegisteredModel,
    run_id: str,
    metrics: dict[str, float],
    max_drop: dict[str, float],
) -> Verdict:
    """Append to the history, compare with the previous evaluation of the alias, publish the
    verdict, and close the MLflow run (FAILED on a regression)."""
    eval_history.append(
        paths.duckdb,
        model.name,
        model.alias,
        model.version,
        model.digest,
        run_id,
        model.source_run_id,
        metrics,
    )
    earlier = eval_history.latest_before(paths.duckdb, model.name, model.alias, run_id)
    lines = [] if earlier is None else eval_history.regressions(earlier.metrics, metrics, max_drop)
    verdict = Verdict(model, run_id, metrics, earlier, lines)
    close_evaluation_run(tracking_client(paths), verdict)
    create_markdown_artifact(
        key=artifact_key(model.alias),
        markdown=verdict_markdown(verdict, max_drop, paths.tracking_uri),
        description=f"evaluation of {model.uri} against its previous evaluation",
    )
    return verdict


def close_evaluation_run(client: MlflowClient, verdict: Verdict) -> None:
    """Tag the run with what it was compared with and its verdict, and end it."""
    run_id = verdict.mlflow_run_id
    if verdict.previous is not None:
        client.set_tag(run_id, "previous.run_id", verdict.previous.mlflow_run_id)
        client.set_tag(run_id, "previous.version", verdict.previous.version)
    client.set_tag(run_id, "verdict", "regression" if verdict.regressions else "ok")
    if verdict.regressions:
        client.set_tag(run_id, "regression", "\n".join(verdict.regressions))
    finish_run(client, run_id, failed=bool(verdict.regressions))


def artifact_key(alias: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return "evaluation-" + re.sub(r"[^a-z0-9-]+", "-", alias.lower()).strip("-")


def verdict_markdown(verdict: Verdict, max_drop: dict[str, float], tracking_uri: str) -> str:
    """Current against previous figures, metric by metric, and the verdict."""
    model, earlier = verdict.model, verdict.previous
    before = {} if earlier is None else earlier.metrics
    lines = [
        f"# Evaluation of {model.uri} (version {model.version})",
        "",
        "| metric | current | previous | change | allowed drop |",
        "|---|---:|---:|---:|---:|",
    ]
    for metric in sorted(set(verdict.metrics) | set(before)):
        now, then = verdict.metrics.get(metric), before.get(metric)
        change = f"{now - then:+.3f}" if now is not None and then is not None else "-"
        allowed = f"{max_drop[metric]:.3f}" if metric in max_drop else "-"
        lines.append(f"| {metric} | {fmt(now)} | {fmt(then)} | {change} | {allowed} |")
    lines.append("")
    if earlier is None:
        lines.append("**First evaluation of this alias**: nothing to compare with.")
    else:
        lines.append(
            f"Previous: version {earlier.version}, evaluated {earlier.evaluated_at:%Y-%m-%d %H:%M}"
            f" UTC (MLflow run {earlier.mlflow_run_id})."
        )
        lines.append("")
        if verdict.regressions:
            lines.append("**Regression**:")
            lines += [f"- {line}" for line in verdict.regressions]
        else:
            lines.append("**No regression.**")
    lines += ["", f"MLflow: {tracking_uri} run {verdict.mlflow_run_id}"]
    return "\n".join(lines) + "\n"


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def mark_evaluation_failed(flow, flow_run, state) -> None:
    """Flow failure hook: close this flow run's evaluation run as FAILED if it is still open."""
    client = tracking_client(StatePaths.from_env())
    runs = client.search_runs(
        experiment_ids=[e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`{FLOW_RUN_TAG}` = '{flow_run.id}' "
        f"AND tags.`{STAGE_TAG}` = '{EVALUATION_STAGE}' AND attributes.status = 'RUNNING'",
    )
    for run in runs:
        finish_run(client, run.info.run_id, failed=True)
        log.error("evaluation run %s marked FAILED: %s", run.info.run_id, state.message)


# ---- the flow --------------------------------------------------------------------------------


@flow(
    name="evaluate-model",
    on_failure=[mark_evaluation_failed],
    on_crashed=[mark_evaluation_failed],
)
def evaluate_registered(
    model: str = "models:/r1-tiny@final",
    profile: str = "tiny",
    overrides: list[str] | None = None,
    max_drop: float = 0.02,
) -> dict:
    """Evaluate `models:/NAME@ALIAS` on the profile's held-out suites, record it, and fail on a
    regression against the previous evaluation of the alias (pass@1 or general score dropping
    by more than `max_drop`)."""
    name, alias = parse_model_uri(model)
    if max_drop < 0:
        raise ValueError(f"max_drop must be 0 or more, got {max_drop}")
    config = load_profile(profile, overrides or [])
    check_inputs(config, "evaluate_registered")  # the held-out data files, if the profile has any
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    paths = StatePaths.from_env()
    check_tracking_store(paths)  # fail fast, naming the MLflow store
    paths.ensure()

    target = resolve_model(paths, name, alias)
    scored = config.data.general is not None and config.evaluation.general_prompts > 0
    reward_model = resolve_reward_model(paths, name) if scored else None
    settings = {
        "profile": profile,
        "overrides": " ".join(overrides or []),
        "max_drop": max_drop,
    }
    run_id = open_evaluation_run(paths, target, settings, config.evaluation)
    data = prepare_data(config.data, paths, run_id)
    report = evaluate_model(config.evaluation, paths, target, data, reward_model, run_id)
    watched = {metric: max_drop for metric in WATCHED}
    verdict = record_evaluation(paths, target, run_id, report.metrics, watched)
    if verdict.regressions:
        raise EvaluationRegression(regression_message(verdict))
    return verdict.summary()


def regression_message(verdict: Verdict) -> str:
    """What regressed, naming each evaluation's own MLflow run: this version's and the earlier
    version's it is compared with."""
    earlier = verdict.previous
    against = ""
    if earlier is not None:
        against = f" against version {earlier.version} (its evaluation: MLflow run "
        against += f"{earlier.mlflow_run_id})"
    return (
        f"{verdict.model.uri} version {verdict.model.version} (this evaluation: MLflow run "
        f"{verdict.mlflow_run_id}) regressed{against}: " + "; ".join(verdict.regressions)
    )
