"""Bad settings are refused before anything runs, each with the path of its key: in a profile, in
an override, and in the environment variables the stores read."""

from __future__ import annotations

import pytest

from configs.profiles import ConfigError, load_profile
from storage import store, tracking
from storage.paths import StatePaths

PROFILE = """
name: broken
evaluation:
  n_samples: many            # wrong type
  temperature: -0.5          # out of range
  sampler: {backend: tpu}    # not one of the choices
cold_start_sft:
  train: {epohcs: 2}         # unknown key
reasoning_rl:
  rewards: [{name: accuracy}, {name: no_such_reward}]
data:
  source: files
  files: {train_path: t.jsonl, heldout_path: h.jsonl, bad_rows: sometimes, max_row_chars: 0}
faults:
  fail_once_at: "Reasoning RL@x"
"""

EXPECTED = [
    "evaluation.n_samples: Input should be a valid integer",
    "evaluation.temperature: Input should be greater than or equal to 0",
    "evaluation.sampler.backend: Input should be 'hf' or 'vllm'",
    "cold_start_sft.train.epohcs: Extra inputs are not permitted",
    "reasoning_rl.rewards.1.name: Value error, unknown reward 'no_such_reward'",
    "data.files.bad_rows: Input should be 'skip' or 'refuse'",
    "data.files.max_row_chars: Input should be greater than or equal to 1",
    "faults.fail_once_at: String should match pattern",
]


def test_every_bad_value_of_a_profile_is_named_by_its_key_path(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(PROFILE)
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {len(EXPECTED)} invalid setting(s)")
    for line in EXPECTED:
        assert f"\n  {line}" in message, line


def test_a_bad_override_is_named_by_its_key_path():
    with pytest.raises(ConfigError, match=r"reasoning_rl\.steps: Input should be greater than"):
        load_profile("micro", ["reasoning_rl.steps=0"])
    with pytest.raises(ConfigError, match=r"override evaluation\.k\.x: k is a value"):
        load_profile("micro", ["evaluation.k.x=1"])


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_store_wait_names_its_variable(tmp_path, monkeypatch, value):
    monkeypatch.setenv(store.LOCK_WAIT_ENV, value)
    with pytest.raises(ValueError, match=rf"^R1_DUCKDB_LOCK_WAIT='{value}': expected a number"):
        store.record_lineage(tmp_path / "r1.duckdb", "a", "model", "d", "s", "run", [])
    monkeypatch.setenv(tracking.TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=rf"^R1_MLFLOW_TIMEOUT='{value}': expected a number"):
        tracking.check_tracking_store(StatePaths(tmp_path / "state"))
    monkeypatch.delenv(tracking.TIMEOUT_ENV)
    monkeypatch.setenv(tracking.LOCK_WAIT_ENV, value)
    with pytest.raises(ValueError, match=rf"^R1_MLFLOW_LOCK_WAIT='{value}': expected a number"):
        tracking.check_tracking_store(StatePaths(tmp_path / "state"))
