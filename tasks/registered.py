"""The registered-model task that the distillation and evaluation flows share: a version from
the state folder's MLflow registry, its files fetched into `registry/`."""

from __future__ import annotations

from prefect import get_run_logger, task

from models.loading import load_model, parameter_count
from models.saved import ModelRef
from storage import model_registry
from storage.model_registry import RegisteredModel
from storage.paths import StatePaths
from storage.tracking import alias_for, tracking_client
from tasks.context import StageResult


def teacher_hint(teacher: str, models: str) -> str:
    """What to name when the registry lacks the teacher (the model name `teacher`) and the
    profile's own models are `models`: its final model (`distill/tiny` names r1-tiny's; run
    with `--param profile=micro`, the teacher stayed r1-tiny's). Empty where they agree."""
    if teacher == models:
        return ""
    final = alias_for("all_scenarios_rl")
    return (
        f"The profile's models are {models}: to distil its final model, add "
        f"--param teacher=models:/{models}@{final}"
    )


@task(name="registered-model", task_run_name="registered-model: {uri}")
def registered_model(paths: StatePaths, uri: str, missing_hint: str = "") -> RegisteredModel:
    """`uri` (`models:/NAME@ALIAS`, `NAME@ALIAS` or `models:/NAME/VERSION`) resolved and fetched;
    when the registry lacks it, the error ends with `missing_hint` (how to name another); a
    version whose files were deleted says what to run instead."""
    spec = model_registry.parse_model(uri)
    try:
        model = model_registry.fetch(tracking_client(paths), spec, paths.root / "registry")
    except model_registry.RegistryError as err:
        if not missing_hint or isinstance(err, model_registry.SourceRunGone):
            raise
        raise model_registry.RegistryError(f"{err}. {missing_hint}") from None
    get_run_logger().info("%s is version %s, in %s", model.uri, model.version, model.path)
    return model


@task(name="registered-reward-model", task_run_name="registered-reward-model: {name}")
def registered_reward_model(paths: StatePaths, name: str) -> RegisteredModel | None:
    """`name@reward-model` fetched, or None when none is registered (no general score)."""
    spec = model_registry.ModelSpec(name, alias=alias_for("reward_model"))
    client = tracking_client(paths)
    try:
        model_registry.resolve(client, spec)
    except model_registry.RegistryError as err:
        get_run_logger().info("no reward model, so no general score: %s", err)
        return None
    return model_registry.fetch(client, spec, paths.root / "registry")


def as_stage_result(model: RegisteredModel, stage: str) -> StageResult[ModelRef]:
    """A registered model as the result of `stage`: its files, its digest and the run that made
    it, for the stages that take it as input."""
    ref = ModelRef(model.path, parameter_count(load_model(model.path)))
    notes = {"model": f"{model.uri} (v{model.version})"}
    return StageResult(stage, model.source_run_id, ref, 0.0, model.digest, notes)
