"""A deployment run's `config` parameter (`--params '{"config": {...}}'`) replaces the profile
whole: one that leaves settings out is refused before anything runs, naming them (Prefect filled
them with the schema's defaults, and `{"config": {"name": "x"}}` on `r1-pipeline/micro` ran the
recipe at those sizes for minutes, the profile ignored), and one given with overrides is refused
(they were dropped without a word). A whole config, as `r1 config` prints it, runs as given."""

from __future__ import annotations

import pytest

from configs.profiles import ConfigError, flow_config, load_profile, unset_settings
from configs.schema import PipelineConfig
from flows import distill as distill_module
from flows import r1_pipeline as pipeline_module
from flows import r1_zero as zero_module


def as_deployment_parameter(data: dict) -> PipelineConfig:
    """The config as Prefect validates a deployment run's JSON parameter."""
    return PipelineConfig.model_validate(data)


def whole_micro() -> PipelineConfig:
    return as_deployment_parameter(load_profile("micro").model_dump(mode="json"))


@pytest.mark.parametrize(
    ("module", "flow"),
    [(pipeline_module, "r1_pipeline"), (zero_module, "r1_zero"), (distill_module, "distill")],
)
def test_a_partial_config_in_a_deployment_run_is_refused_before_anything_runs(
    monkeypatch, module, flow
):
    monkeypatch.setattr(module, "deployment_run", lambda: True)
    partial = as_deployment_parameter({"name": "x", "evaluation": {"k": 2}})
    with pytest.raises(ConfigError) as refused:
        getattr(module, flow).fn(profile="micro", overrides=[], config=partial)
    message = str(refused.value)
    assert message.startswith("the parameter config leaves out torch_threads, device, data")
    assert "not its value in profile 'micro'" in message
    assert "r1 config --profile micro prints them" in message


def test_the_settings_a_config_leaves_out_are_named_by_their_paths():
    student = {"name": "s", "model": {"architecture": "qwen2", "hidden_size": 16}}
    partial = as_deployment_parameter(
        {"name": "x", "evaluation": {"k": 2}, "distillation": {"students": [student]}}
    )
    unset = unset_settings(partial)
    assert "evaluation.n_samples" in unset and "evaluation.k" not in unset
    assert "distillation.students.0.model.num_layers" in unset
    assert "distillation.students.0.model.hidden_size" not in unset
    assert "bootstrap" in unset and "name" not in unset
    assert unset_settings(whole_micro()) == []


def test_a_whole_config_runs_as_given():
    config = whole_micro()
    assert flow_config("tiny", [], config, whole=True) == load_profile("micro")


def test_a_config_given_with_overrides_is_refused():
    for whole in (True, False):
        with pytest.raises(ConfigError, match=r"overrides \['evaluation\.k=1'\] were given too"):
            flow_config("micro", ["evaluation.k=1"], whole_micro(), whole=whole)


def test_a_call_in_process_takes_a_validated_profile_as_it_is():
    config = load_profile("micro", ["evaluation.k=1"])  # what `r1 run` passes: sections unset
    assert unset_settings(config)
    assert flow_config("tiny", None, config) is config


def test_the_cluster_deployments_address_fills_a_config_that_names_none():
    assert flow_config("tiny", [], whole_micro(), "auto", whole=True).cluster.address == "auto"
    data = load_profile("micro").model_dump(mode="json")
    data["cluster"]["address"] = "10.0.0.1:6379"
    own = as_deployment_parameter(data)
    assert flow_config("tiny", [], own, "auto", whole=True).cluster.address == "10.0.0.1:6379"


@pytest.mark.usefixtures("private_environment")
def test_a_teacher_that_is_no_model_uri_is_refused_before_the_state_folder_is_touched(
    tmp_path, monkeypatch
):
    state = tmp_path / "state"
    monkeypatch.setenv("R1_STATE_DIR", str(state))
    with pytest.raises(ValueError, match=r"cannot read the model 'bogus'"):
        distill_module.distill.fn(profile="micro", overrides=[], teacher="bogus")
    assert not state.exists()


def test_a_teacher_of_another_profile_is_named_with_the_profiles_own(tmp_path):
    """`distill/tiny --param profile=micro`: the deployment's teacher is r1-tiny's final model;
    where the registry lacks it, the error says which teacher the profile's models give."""
    from storage.model_registry import RegistryError
    from storage.paths import StatePaths
    from storage.tracking import tracking_client
    from tasks.registered import registered_model, teacher_hint

    paths = StatePaths(tmp_path / "state").ensure()
    tracking_client(paths).create_registered_model("r1-micro")
    with pytest.raises(RegistryError) as missing:
        registered_model.fn(paths, "models:/r1-tiny@final", teacher_hint("r1-tiny", "r1-micro"))
    assert str(missing.value) == (
        "no registered model 'r1-tiny' (registered: r1-micro). The profile's models are "
        "r1-micro: to distil its final model, add --param teacher=models:/r1-micro@final"
    )
    assert teacher_hint("r1-micro", "r1-micro") == ""
