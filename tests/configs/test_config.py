import pytest

from configs import ConfigError, PipelineConfig, load_profile
from configs.profiles import known_profiles


def test_shipped_profiles_load():
    assert {"tiny", "micro", "gpu-qwen"} <= set(known_profiles())
    tiny = load_profile("tiny")
    assert isinstance(tiny, PipelineConfig) and tiny.name == "r1-tiny"
    assert load_profile("micro").evaluation.n_samples == 2


def write(tmp_path, text: str):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_its_path(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_profile(write(tmp_path, "cold_start_sft:\n  train:\n    epohcs: 2\n"))
    assert "cold_start_sft.train.epohcs: Extra inputs are not permitted" in str(err.value)


def test_bad_value_names_its_path_and_reason(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_profile(write(tmp_path, "evaluation:\n  temperature: -1\n  n_samples: many\n"))
    message = str(err.value)
    assert "2 invalid setting(s)" in message
    assert "evaluation.temperature: Input should be greater than or equal to 0" in message
    assert "evaluation.n_samples: Input should be a valid integer" in message


def test_cross_field_rules(tmp_path):
    with pytest.raises(
        ConfigError, match=r"evaluation: Value error, k \(8\) exceeds n_samples \(4\)"
    ):
        load_profile(write(tmp_path, "evaluation: {k: 8, n_samples: 4}\n"))
    with pytest.raises(ConfigError, match="style shares sum to"):
        load_profile(write(tmp_path, "bootstrap: {corpus: {direct_share: 0.9}}\n"))
    with pytest.raises(ConfigError, match="needs a 'files' section"):
        load_profile(write(tmp_path, "data: {source: files}\n"))
    with pytest.raises(ConfigError, match="general_per_step needs general_prompts"):
        load_profile(write(tmp_path, "reasoning_rl: {general_per_step: 2}\n"))
    with pytest.raises(ConfigError, match="leaves no reasoning prompt"):
        load_profile(
            write(tmp_path, "all_scenarios_rl: {general_prompts: 9, general_per_step: 8}\n")
        )


def test_overrides_are_validated_like_the_file():
    cfg = load_profile("tiny", ["cold_start_sft.train.epochs=1", "evaluation.k=2"])
    assert cfg.cold_start_sft.train.epochs == 1 and cfg.evaluation.k == 2
    with pytest.raises(ConfigError, match="cold_start_sft.train.epoch: Extra inputs"):
        load_profile("tiny", ["cold_start_sft.train.epoch=1"])
    with pytest.raises(ConfigError, match="not of the form"):
        load_profile("tiny", ["evaluation.k"])


def test_missing_profile_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no profile 'nope'"):
        load_profile("nope")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_profile(write(tmp_path, "a: [\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_profile(write(tmp_path, "- 1\n"))


def test_configs_are_frozen():
    cfg = load_profile("micro")
    with pytest.raises(Exception, match="frozen"):
        cfg.evaluation.k = 3


def test_a_bootstrap_path_given_without_its_hub_id_drops_the_profiles():
    """gpu-qwen's hub_id names a download of its own path: another folder is not that download,
    so its messages and MLflow tags must not name it."""
    from configs.preflight import MODEL_HINT, required_inputs

    profile = load_profile("gpu-qwen")
    assert profile.bootstrap.hub_id == "Qwen/Qwen2.5-1.5B-Instruct"
    for moved in (["bootstrap.path=/srv/models/Math-1.5B"], ["bootstrap={path: /srv/m}"]):
        config = load_profile("gpu-qwen", moved)
        assert config.bootstrap.hub_id is None
        (policy, *_) = required_inputs(config)
        assert policy.key == "bootstrap.path" and policy.how_to_get == MODEL_HINT
    named = ["bootstrap.path=/srv/m", "bootstrap.hub_id=Qwen/Qwen2.5-Math-1.5B"]
    assert load_profile("gpu-qwen", named).bootstrap.hub_id == "Qwen/Qwen2.5-Math-1.5B"
    same = load_profile("gpu-qwen", [f"bootstrap.path={profile.bootstrap.path}"])
    assert same.bootstrap.hub_id == profile.bootstrap.hub_id
