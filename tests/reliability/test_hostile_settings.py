"""Settings a run cannot use are refused before anything runs, in one line naming what is wrong:
values no stage can take (a window of no steps, an infinite number of epochs, a model name MLflow
refuses), profiles that are not one (a folder, another encoding, empty, a key given twice), an
override that is not YAML, planted hacks over sections of the wrong shape, a fault in no stage,
a state folder that cannot be made, and bad numbers given to the command line."""

from __future__ import annotations

import json
import re

import pytest

from cli.main import main
from configs.profiles import ConfigError, load_profile, read_yaml
from configs.sizes import PlanSizeError, check_plan_sizes
from rewards.registry import RewardParamsError, RewardSet, check_reward_params
from tasks.plan import FaultStageError, check_fault_stage
from training.memory_fit import check_host_model_sizes

# `r1` points the process environment at its state folder: each test gets its own copy.
pytestmark = pytest.mark.usefixtures("private_environment")

RULES_WITH_WINDOWS = ["reward_without_skill", "drift", "gamed_term", "judge_trouble"]


@pytest.mark.parametrize("rule", RULES_WITH_WINDOWS)
@pytest.mark.parametrize("window", ["0", "-1"])
def test_a_guard_window_of_no_steps_is_refused(rule, window):
    with pytest.raises(ConfigError, match=rf"r1_zero\.guard\.{rule}\.window: Input should be"):
        load_profile("micro", [f"r1_zero.guard.{rule}.window={window}"])


@pytest.mark.parametrize("value", [".inf", "1e999", "-.inf", ".nan"])
@pytest.mark.parametrize(
    "key", ["bootstrap.train.epochs", "evaluation.temperature", "r1_zero.guard.drift.max_kl"]
)
def test_an_infinite_or_undefined_number_is_refused(key, value):
    with pytest.raises(ConfigError, match=re.escape(f"\n  {key}: ")):
        load_profile("micro", [f"{key}={value}"])


@pytest.mark.parametrize("name", ["r1:x", "a/b", "it's", "", "-lead"])
def test_a_name_mlflow_would_refuse_is_refused(name):
    with pytest.raises(ConfigError, match=r"\n  name: "):
        load_profile("micro", [f"name={json.dumps(name)}"])
    with pytest.raises(ConfigError, match=r"distillation\.students\.0\.name: String should"):
        load_profile("micro", [f"distillation.students=[{{name: {json.dumps(name + 'Q')}}}]"])


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("evaluation.n_samples=[1", r"override 'evaluation\.n_samples=\[1': not valid YAML"),
        ("name=: x: y", r"override 'name=: x: y': not valid YAML"),
        ("=5", r"override '=5': an empty key"),
        (".n_samples=5", r"override '\.n_samples=5': an empty key"),
    ],
)
def test_an_override_that_cannot_be_read_is_named(override, says):
    with pytest.raises(ConfigError, match=says):
        load_profile("micro", [override])


def test_a_profile_that_is_no_profile_is_named(tmp_path):
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"folder\.yaml: cannot be read: Is a directory"):
        load_profile(folder)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin\.yaml: not UTF-8 text \(byte 9\)"):
        load_profile(latin)
    for text in ("", "~\n", "# nothing\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        with pytest.raises(ConfigError, match=r"empty\.yaml: empty; a profile names its settings"):
            load_profile(empty)


def test_a_key_given_twice_is_refused_where_yaml_would_keep_the_last(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("name: a\nevaluation: {k: 2}\nevaluation:\n  n_samples: 2\n")
    with pytest.raises(ConfigError, match=r"found the key 'evaluation' twice"):
        load_profile(path)
    path.write_text("evaluation:\n  k: 2\n  k: 3\n")
    with pytest.raises(ConfigError, match=r"found the key 'k' twice"):
        load_profile(path)
    path.write_text("base: &b {k: 2}\nevaluation:\n  <<: *b\n  k: 3\n".replace("base: ", "x: "))
    with pytest.raises(ConfigError, match=r"\n  x: Extra inputs"):  # a merge may be overridden
        load_profile(path)


def test_an_override_of_a_shared_section_changes_only_the_one_named(tmp_path):
    path = tmp_path / "shared.yaml"
    path.write_text(
        "cold_start_sft:\n  train: &t {epochs: 1, learning_rate: 0.001}\nmixed_sft:\n  train: *t\n"
    )
    config = load_profile(path, ["cold_start_sft.train.epochs=3"])
    assert (config.cold_start_sft.train.epochs, config.mixed_sft.train.epochs) == (3, 1)


def test_an_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"over 100000 values once its aliases are expanded"):
        load_profile(path)


@pytest.mark.parametrize(
    "override",
    ["faults=5", "faults.hacks=5", "reasoning_rl=5", "reasoning_rl.rewards=5",
     "reasoning_rl.rewards=[1]", "reasoning_rl.rewards=[{name: accuracy, weight: x}]",
     "reasoning_rl.rewards=[{name: accuracy, weight: null}]", "distillation=5", "bootstrap=5"],
)  # fmt: skip
def test_planted_hacks_over_sections_of_the_wrong_shape_are_named(override):
    with pytest.raises(ConfigError, match=r"invalid setting"):
        load_profile("micro", ["faults.hacks=[format_over_accuracy, math_digits]", override])


def test_a_fault_in_no_stage_of_the_flow_is_refused():
    config = load_profile("micro", ["faults.fail_once_at=nosuchstage@2"])
    with pytest.raises(FaultStageError, match=r"r1_pipeline runs no stage 'nosuchstage'"):
        check_fault_stage(config, "r1_pipeline")
    config = load_profile("micro", ["faults.fail_once_at=cold_start_sft"])
    check_fault_stage(config, "r1_pipeline")
    with pytest.raises(FaultStageError, match=r"its stages: bootstrap, reward_model, r1_zero_rl"):
        check_fault_stage(config, "r1_zero")


def test_the_command_line_refuses_before_anything_is_made(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    run = ["run", "--profile", "micro", "--state-dir"]
    assert main([*run, str(a_file)]) == 2
    assert "state folder" in capsys.readouterr().err
    assert main([*run, str(a_file / "sub")]) == 2
    assert f"lies under a file, {a_file}" in capsys.readouterr().err
    assert main([*run, str(tmp_path / ("x" * 300))]) == 2
    assert "is over 255 bytes" in capsys.readouterr().err
    assert main([*run, str(tmp_path / "runs?v2")]) == 2  # the store would be made in `runs`
    assert "its path holds '?'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "runs?v2").exists()
    assert main([*run, str(tmp_path / "s"), "--set", "faults.fail_once_at=nope"]) == 2
    assert "runs no stage 'nope'" in capsys.readouterr().err
    monkeypatch.setenv("R1_DUCKDB_LOCK_WAIT", "abc")
    assert main([*run, str(tmp_path / "s")]) == 2
    assert "R1_DUCKDB_LOCK_WAIT='abc': expected a number" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "argv",
    [["config", "--gpu-gib", "nan"], ["config", "--gpu-gib", "-1"], ["config", "--gpu-gib", "0"],
     ["runs", "--limit", "500"], ["runs", "--limit", "0"], ["runs", "--limit", "x"]],
)  # fmt: skip
def test_a_number_the_command_cannot_use_is_an_argument_error(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert f"argument {argv[1]}: '{argv[2]}': expected" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "0.5", "abc", "nan"])
def test_a_watch_backoff_that_would_hammer_the_server_is_refused(value, capsys, monkeypatch):
    monkeypatch.setenv("R1_WATCH_BACKOFF_SECONDS", value)
    assert main(["watch", "ef21620f-1749-49b6-96a6-3a90c9c00000"]) == 2
    assert f"R1_WATCH_BACKOFF_SECONDS='{value}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("term", "says"),
    [
        ("{name: format, params: {bogus: 1}}", "reward 'format' takes no param 'bogus'"),
        ("{name: overlong, params: {max_token: 100}}", "takes no param 'max_token' (its params: "
         "max_tokens, buffer)"),
        ("{name: overlong, params: {max_tokens: 1e3}}", "'max_tokens' is 1000.0, not of type int"),
        ("{name: overlong, params: {max_tokens: '200'}}", "'max_tokens' is '200', not of type int"),
        ("{name: countdown, params: {strict: 1}}", "'strict' is 1, not of type bool"),
        ("{name: repetition, params: {scale: true}}", "'scale' is True, not of type float"),
    ],
)  # fmt: skip
def test_a_reward_param_the_reward_does_not_take_is_refused(term, says, capsys, tmp_path):
    override = f"reasoning_rl.rewards=[{{name: accuracy}}, {term}]"
    argv = ["config", "--profile", "micro", "--set", override, "--state-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "reasoning_rl.rewards.1.params: reward '" in err and says in err
    terms = load_profile("micro", [override]).reasoning_rl.rewards
    with pytest.raises(RewardParamsError, match=re.escape(says)):
        RewardSet.from_terms(terms)


def test_the_params_rewards_take_pass():
    terms = load_profile("tiny").all_scenarios_rl.rewards
    check_reward_params({"all_scenarios_rl": terms})
    terms = load_profile("micro", ["r1_zero.rewards=[{name: repetition, params: {scale: 2}}]"])
    check_reward_params({"r1_zero": terms.r1_zero.rewards})  # an int where a float is taken


def test_numbers_are_read_as_yaml_1_2_reads_them(tmp_path):
    """YAML 1.1 reads `1e3` as text, `010` as eight and `1:30` as ninety."""
    path = tmp_path / "numbers.yaml"
    path.write_text("evaluation: {max_problems: 1e3, n_samples: 010}\n")
    config = load_profile(path, ["evaluation.k=0x4", "reasoning_rl.steps=1_000"])
    assert (config.evaluation.max_problems, config.evaluation.n_samples) == (1000, 10)
    assert (config.evaluation.k, config.reasoning_rl.steps) == (4, 1000)
    assert read_yaml("a: 1:30\nb: '010'\nc: .inf\nd: 2.0e+8", "t") == {
        "a": "1:30", "b": "010", "c": float("inf"), "d": 2e8
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"\n  evaluation\.temperature: Input should be a valid"):
        load_profile("micro", ["evaluation.temperature=1:30"])


@pytest.mark.parametrize("command", ["run", "config", "lineage", "runs"])
def test_an_empty_state_folder_is_refused(command, capsys):
    argv = [command, "models:/r1-micro@final"] if command == "lineage" else [command]
    assert main([*argv, "--state-dir", " "]) == 2
    assert "--state-dir is empty" in capsys.readouterr().err


def test_a_section_given_as_a_mapping_changes_only_the_keys_it_names():
    micro = load_profile("micro").evaluation
    changed = load_profile("micro", ["evaluation={k: 1, temperature: 0.3}"]).evaluation
    assert (changed.k, changed.temperature) == (1, 0.3)
    assert (changed.n_samples, changed.max_problems) == (micro.n_samples, micro.max_problems)
    rewards = load_profile("micro", ["reasoning_rl.rewards=[{name: accuracy}]"]).reasoning_rl
    assert [t.name for t in rewards.rewards] == ["accuracy"]  # a list replaces


@pytest.mark.parametrize(
    "setting,says",
    [
        ("evaluation.n_samples=100000000000", "evaluation: 6 held-out problems x n_samples"),
        ("reasoning_rl.steps=1000000000000", "reasoning_rl.steps 1000000000000 x prompts_per_step"),
        ("rejection.max_new_tokens=99999999999", "rejection: chunk_prompts 8 x samples_per_prompt"),
    ],
)
def test_a_size_no_machine_can_hold_is_refused_before_anything_runs(
    setting, says, capsys, tmp_path
):
    """A number mistyped by orders of magnitude is a valid integer: the run took it and, after
    its cached stages, grew one list until the kernel's out-of-memory killer ended it (or
    another process on the machine)."""
    state = tmp_path / "state"
    assert main(["config", "--profile", "micro", "--state-dir", str(state), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert "ask a stage to hold more than this machine's" in err and says in err, err
    assert "Traceback" not in err and not state.exists()


def test_epochs_past_ten_thousand_are_refused():
    with pytest.raises(ConfigError, match=r"cold_start_sft\.train\.epochs: Input should be"):
        load_profile("micro", ["cold_start_sft.train.epochs=1e9"])


@pytest.mark.parametrize("profile", ["micro", "tiny", "gpu-tiny", "gpu-qwen"])
def test_the_shipped_profiles_hold_far_less_than_a_laptop(profile):
    """No false refusal: every shipped profile's largest held size is under 1 GiB."""
    config = load_profile(profile)
    check_plan_sizes(config, memory=2**30)
    with pytest.raises(PlanSizeError, match="evaluation: "):
        check_plan_sizes(config.model_copy(update={"name": "x"}), memory=1)


def test_a_model_to_train_that_no_machine_can_hold_is_refused_before_anything_runs(
    capsys, tmp_path
):
    state = tmp_path / "state"
    sizes = [f"bootstrap.model.{key}=1000000000" for key in ("hidden_size", "intermediate_size")]
    argv = ["config", "--profile", "micro", "--state-dir", str(state)]
    assert main(argv + [arg for size in sizes for arg in ("--set", size)]) == 3
    err = capsys.readouterr().err
    assert "model(s) to train cannot fit this machine's" in err
    assert "bootstrap.model: 1.2e+19 parameters" in err, err
    assert "Traceback" not in err and not state.exists()


@pytest.mark.parametrize("profile", ["micro", "tiny", "gpu-tiny", "gpu-qwen"])
def test_the_shipped_profiles_models_train_in_a_laptops_memory(profile):
    check_host_model_sizes(load_profile(profile), profile, memory=2**30)
