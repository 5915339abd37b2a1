"""Scheduled evaluation of a registered model: `models:/NAME@ALIAS` on the held-out suites (by
default the profile's final model, `models:/<profile's model name>@final`).

The flow resolves the alias in the state folder's MLflow registry, downloads that version,
regenerates the profile's held-out problems (and general prompts) deterministically, evaluates
with the pipeline's own evaluation stage (scoring general prompts with `NAME@reward-model` when
one is registered), and records an MLflow run in the experiment `NAME-evaluation` tagged with the
model it evaluated. Each evaluation is appended to the DuckDB table `eval_history` with its
settings (sampling, held-out set, reward model, grading code: evaluation/settings.py) and
compared with the latest earlier evaluation of the same alias with the same settings: a drop of
pass@1 or of the general score beyond `max_drop` marks the MLflow run FAILED and ends the Prefect
flow run Failed, naming the metrics. Where no earlier evaluation has the same settings there is
no verdict: the run ends Completed, naming the settings that differ from the latest one's.
"""

from __future__ import annotations

from host.threads import settle_process

# before torch loads, in a deployment's flow-run process too: how its threads wait (host/threads.py)
settle_process()

from prefect import flow

from configs.profiles import load_profile
from flows.hooks import evaluation_cancelled, evaluation_failed
from storage.model_registry import parse_alias_uri


@flow(
    name="evaluate-model",
    on_failure=[evaluation_failed],
    on_crashed=[evaluation_failed],
    on_cancellation=[evaluation_cancelled],
)
def evaluate_registered(
    model: str | None = None,
    profile: str = "tiny",
    overrides: list[str] | None = None,
    max_drop: float = 0.02,
) -> dict:
    """Evaluate `models:/NAME@ALIAS` (by default the profile's final model, e.g.
    `models:/r1-micro@final` for `micro`) on the profile's held-out suites, record it, and fail
    on a regression against the latest earlier evaluation of the alias with the same settings
    (pass@1 or general score dropping by more than `max_drop`)."""
    from evaluation.verdict import WATCHED, EvaluationRegression, regression_message
    from tasks.pipeline import open_state
    from tasks.registered import registered_model, registered_reward_model
    from tasks.scheduled_eval import (
        evaluate_registered_model,
        model_to_evaluate,
        open_evaluation_run,
        prepare_data,
        record_evaluation,
        retarget_hint,
        settings_of,
    )

    if model is not None:
        parse_alias_uri(model)  # a bad URI fails before the profile loads or a store opens
    if max_drop < 0:
        raise ValueError(f"max_drop must be 0 or more, got {max_drop}")
    config = load_profile(profile, overrides or [])
    spec = model_to_evaluate(model, config)
    paths = open_state(config, "evaluate_registered", trains=False)

    target = registered_model(paths, spec.uri, missing_hint=retarget_hint(spec, profile, paths))
    scored = config.data.general is not None and config.evaluation.general_prompts > 0
    reward_model = registered_reward_model(paths, spec.name) if scored else None
    settings = {"profile": profile, "overrides": " ".join(overrides or []), "max_drop": max_drop}
    run_id = open_evaluation_run(paths, target, settings, config.evaluation)
    data = prepare_data(config.data, paths, run_id)
    report = evaluate_registered_model(
        config.evaluation, paths, target, data, reward_model, run_id, config.cluster.active()
    )
    watched = {metric: max_drop for metric in WATCHED}
    measured = settings_of(config.evaluation, data, reward_model)
    verdict = record_evaluation(paths, target, run_id, report.metrics, watched, measured)
    if verdict.regressions:
        raise EvaluationRegression(regression_message(verdict))
    return verdict.summary()
