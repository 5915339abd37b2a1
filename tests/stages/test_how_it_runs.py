"""A training stage stopped mid-way and run again with settings that say only how it runs (how
often it logs and saves, its time limit, its micro-batches and chunks, activations recomputed;
`configs.strict.HOW_IT_RUNS`) resumes from its checkpoint and ends with the weights of a run
never stopped, as the advice of an out-of-memory error or a timeout has a user do. A setting
that changes what it computes starts it again from its first step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from configs.supervised import EngineConfig, SFTConfig, TrainConfig
from models.loading import load_model
from models.saved import ModelRef
from stages import sft
from tests.tiny_models import sft_world

TRAIN = TrainConfig(
    epochs=3, batch_size=8, learning_rate=5e-3, warmup_steps=2, log_every=1, checkpoint_every=2
)
STOP_AT = 5  # the last checkpoint before it: step 4


class Recorder:
    """A tracker that keeps what it is sent, by step; it stops the stage at `stop_at`."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.stop_at = stop_at
        self.logged: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if step is not None:
            self.logged.setdefault(step, {}).update(metrics)
        if step is not None and step == self.stop_at and "train/loss" in metrics:
            raise RuntimeError(f"stopped at step {step}")

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        return None

    def resumed_from(self) -> int | None:
        found = [
            m["train/resumed_from_step"]
            for m in self.logged.values()
            if "train/resumed_from_step" in m
        ]
        return int(found[0]) if found else None


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny Qwen2 base and 32 SFT rows of different lengths: 12 steps over 3 epochs."""
    root = tmp_path_factory.mktemp("how-it-runs")
    base, data = sft_world(root)
    straight = sft.run(SFTConfig(train=TRAIN), ModelRef(base), data, root / "straight", Recorder())
    return {"base": base, "data": data, "straight": straight.path}


def stopped(world: dict[str, Path], out: Path) -> None:
    with pytest.raises(RuntimeError, match=f"stopped at step {STOP_AT}"):
        sft.run(
            SFTConfig(train=TRAIN), ModelRef(world["base"]), world["data"], out, Recorder(STOP_AT)
        )


def test_a_stage_run_again_with_other_run_settings_resumes_to_the_same_weights(world, tmp_path):
    stopped(world, tmp_path)
    how = SFTConfig(
        train=TRAIN.model_copy(update={"log_every": 3, "checkpoint_every": 5}),
        engine=EngineConfig(
            micro_batch_tokens=64,  # each step in several micro-batches
            logits_chunk_mb=0.01,  # the head a chunk of positions at a time
            gradient_checkpointing=True,
            timeout_s=3600.0,
            master_port=29517,
        ),
    )
    recorder = Recorder()
    resumed = sft.run(how, ModelRef(world["base"]), world["data"], tmp_path, recorder)
    assert recorder.resumed_from() == STOP_AT - 1
    weights = load_model(resumed.path).state_dict()
    for name, weight in load_model(world["straight"]).state_dict().items():
        assert torch.allclose(weights[name], weight, atol=1e-5), name


def test_a_stage_run_again_with_another_learning_rate_starts_from_its_first_step(world, tmp_path):
    stopped(world, tmp_path)
    other = SFTConfig(train=TRAIN.model_copy(update={"learning_rate": 1e-3}))
    recorder = Recorder()
    sft.run(other, ModelRef(world["base"]), world["data"], tmp_path, recorder)
    assert recorder.resumed_from() is None and min(recorder.logged) == 1
