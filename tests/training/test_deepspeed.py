"""The SFT stage under DeepSpeed ZeRO-2 and ZeRO-3 with two CPU processes follows the
single-process loop: the same loss at every step and the same final weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from configs.supervised import EngineConfig, SFTConfig, TrainConfig
from models.loading import load_model, load_tokenizer
from models.saved import ModelRef, save_model
from stages import sft
from tests.tiny_models import sft_world
from training import distributed
from training.distributed import (
    DeepSpeedMissingError,
    WorkerFailedError,
    WorkerSpec,
    launch_command,
    target_count,
)
from training.examples import Example, dataset_examples
from training.finite import NonFiniteLossError
from training.supervised import train

needs_deepspeed = pytest.mark.skipif(
    not distributed.deepspeed_installed(),
    reason="deepspeed is not installed (the `dev` extra installs it)",
)

TRAIN = TrainConfig(
    epochs=2,
    batch_size=8,
    learning_rate=5e-3,
    warmup_steps=2,
    max_grad_norm=0.5,  # small enough that clipping acts
    log_every=1,
    checkpoint_every=1000,
)
LOSS_RTOL = 1e-4
WEIGHT_ATOL = 1e-4


class Recorder:
    """A tracker that keeps each logged step's training metrics."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if step is not None and "train/loss" in metrics:
            self.steps[step] = dict(metrics)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        return None

    def curve(self, key: str) -> list[float]:
        return [self.steps[s][key] for s in sorted(self.steps)]


def deepspeed_config(
    zero_stage: int = 2, train_cfg: TrainConfig = TRAIN, precision: str = "fp32"
) -> SFTConfig:
    engine = EngineConfig(kind="deepspeed", processes=2, zero_stage=zero_stage, precision=precision)
    return SFTConfig(train=train_cfg, engine=engine)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny Qwen2 base and 32 SFT rows of different lengths (so padding matters)."""
    root = tmp_path_factory.mktemp("deepspeed")
    base, data = sft_world(root)
    return {"root": root, "base": base, "data": data}


@pytest.fixture(scope="module")
def single(world) -> tuple[Recorder, dict[str, torch.Tensor]]:
    """The reference: the single-process loop on the same examples."""
    tokenizer = load_tokenizer(world["base"])
    model = load_model(world["base"])
    examples = dataset_examples(tokenizer, world["data"], TRAIN.max_length)
    recorder = Recorder()
    train(
        model,
        examples,
        TRAIN,
        world["root"] / "single",
        "fp",
        recorder.log_metrics,
        tokenizer.pad_token_id,
    )
    return recorder, model.state_dict()


@pytest.mark.heavy
@needs_deepspeed
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_zero_sft_follows_the_single_process_curve(world, single, zero_stage):
    reference, reference_weights = single
    recorder = Recorder()
    out = world["root"] / f"zero{zero_stage}"
    ref = sft.run(
        deepspeed_config(zero_stage), ModelRef(world["base"]), world["data"], out, recorder
    )

    assert ref.path == out / "model" and ref.parameters > 0
    assert sorted(recorder.steps) == list(range(1, 9)) == sorted(reference.steps)
    for ours, theirs in zip(
        recorder.curve("train/loss"), reference.curve("train/loss"), strict=True
    ):
        assert ours == pytest.approx(theirs, rel=LOSS_RTOL)
    assert recorder.curve("train/lr") == pytest.approx(reference.curve("train/lr"), rel=1e-9)
    trained = load_model(ref.path).state_dict()
    assert trained.keys() == reference_weights.keys()
    for name, weight in reference_weights.items():
        assert torch.allclose(trained[name], weight, atol=WEIGHT_ATOL), name
    assert load_tokenizer(ref.path).pad_token_id is not None


@pytest.mark.heavy
@needs_deepspeed
def test_zero1_sft_in_bf16_follows_zero2(world, tmp_path):
    """ZeRO-1's BF16_Optimizer against ZeRO-2 in bf16, two processes: the same arithmetic (bf16
    gradients added up in fp32, clipped by the global norm, AdamW on fp32 master weights)
    reduced in another order and precision (fp32 gradients all-reduced, where ZeRO-2 reduces
    bf16 ones). The first step's loss is the same (no update yet); each later step's is within
    bf16's rounding; each weight's change over the run is ZeRO-2's within 5% of its size."""
    base = ModelRef(world["base"])
    curves = {}
    for stage in (1, 2):
        recorder = Recorder()
        ref = sft.run(
            deepspeed_config(stage, precision="bf16"), base, world["data"],
            tmp_path / f"zero{stage}", recorder,
        )  # fmt: skip
        curves[stage] = (recorder, load_model(ref.path).state_dict())
        result = json.loads((tmp_path / f"zero{stage}" / "deepspeed" / "result.json").read_text())
        assert result["optimizer"] == {1: "BF16_Optimizer", 2: "DeepSpeedZeroOptimizer"}[stage]
    (zero1, trained1), (zero2, trained2) = curves[1], curves[2]
    assert sorted(zero1.steps) == list(range(1, 9)) == sorted(zero2.steps)
    losses1, losses2 = zero1.curve("train/loss"), zero2.curve("train/loss")
    assert losses1[0] == losses2[0]
    assert losses1 == pytest.approx(losses2, rel=2e-2)
    assert zero1.curve("train/lr") == pytest.approx(zero2.curve("train/lr"), rel=1e-9)
    start = load_model(world["base"]).state_dict()
    for name, weight in start.items():
        change1, change2 = trained1[name] - weight, trained2[name] - weight
        assert change2.norm() > 0, name
        assert (change1 - change2).norm() <= 0.05 * change2.norm(), name


@pytest.mark.heavy
@needs_deepspeed
def test_distillation_sft_trains_under_the_engine_switch(world, single, tmp_path):
    """Stage 7's SFT of a student on traces takes `distillation.engine`: the student trained by
    two ZeRO-2 ranks is the one the single-process loop trains."""
    from configs.schema import DistillConfig
    from stages.distill import distill

    _, reference_weights = single
    config = DistillConfig(sft=TRAIN, engine=EngineConfig(kind="deepspeed", processes=2))
    teacher = ModelRef(world["base"], parameters=10**9)
    ref = distill(
        config,
        ModelRef(world["base"]),
        teacher,
        world["data"],
        None,
        tmp_path,
        Recorder(),
        "student",
    )
    assert (tmp_path / "sft" / "deepspeed" / "spec.json").exists()  # it ran in the workers
    trained = load_model(ref.path).state_dict()
    for name, weight in reference_weights.items():
        assert torch.allclose(trained[name], weight, atol=WEIGHT_ATOL), name


@pytest.mark.heavy
@needs_deepspeed
@pytest.mark.slow
def test_a_nan_loss_under_deepspeed_stops_the_stage(world, tmp_path):
    tokenizer = load_tokenizer(world["base"])
    broken = load_model(world["base"])
    with torch.no_grad():
        broken.model.norm.weight[0] = float("nan")
    base = save_model(broken, tokenizer, tmp_path / "broken").path
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 1"):
        sft.run(deepspeed_config(), ModelRef(base), world["data"], tmp_path / "out", Recorder())
    assert not (tmp_path / "out" / "model").exists()


class StopAtStep3(Recorder):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        if step == 3:
            raise RuntimeError("tracker stops the stage at step 3")


@pytest.mark.heavy
@needs_deepspeed
@pytest.mark.slow
def test_a_failing_tracker_stops_the_workers(world, tmp_path):
    cfg = deepspeed_config(train_cfg=TRAIN.model_copy(update={"epochs": 40}))
    with pytest.raises(RuntimeError, match="at step 3"):
        sft.run(cfg, ModelRef(world["base"]), world["data"], tmp_path, StopAtStep3())
    assert not (tmp_path / "model").exists()


@pytest.mark.slow  # about 20 s: CI runs it (-m slow); the default suite keeps to ten minutes
@needs_deepspeed
@pytest.mark.heavy
@pytest.mark.parametrize(("zero_stage", "precision"), [(2, "fp32"), (1, "bf16")])
def test_a_stopped_zero_sft_stage_resumes_from_its_checkpoint(
    world, tmp_path, zero_stage, precision
):
    """The tracker stops the stage at step 3 (the workers, running ahead, are stopped wherever
    they are); the rerun resumes from the last committed checkpoint and ends with the weights of
    an uninterrupted run. 24 steps, so the workers never reach the end before they are stopped.
    ZeRO-1 in bf16: its checkpoint holds the fp32 master weights, so the resumed run's bf16
    weights are the uninterrupted run's."""
    train_cfg = TRAIN.model_copy(update={"epochs": 6, "checkpoint_every": 2})
    cfg = deepspeed_config(zero_stage, train_cfg, precision)
    base = ModelRef(world["base"])
    straight = sft.run(cfg, base, world["data"], tmp_path / "straight", Recorder())
    with pytest.raises(RuntimeError, match="at step 3"):
        sft.run(cfg, base, world["data"], tmp_path / "resumed", StopAtStep3())
    recorder = Recorder()
    resumed = sft.run(cfg, base, world["data"], tmp_path / "resumed", recorder)
    assert_resumed_to(straight, resumed, recorder)


def assert_resumed_to(straight: ModelRef, resumed: ModelRef, recorder: Recorder) -> None:
    """The rerun began after an even, committed step, ran to step 24 and ended with the
    uninterrupted run's weights."""
    first = min(recorder.steps)
    assert 3 <= first <= 24 and first % 2 == 1  # resumed after an even, committed step
    assert max(recorder.steps) == 24
    trained = load_model(resumed.path).state_dict()
    for name, weight in load_model(straight.path).state_dict().items():
        assert torch.allclose(trained[name], weight, atol=WEIGHT_ATOL), name


def test_without_deepspeed_the_stage_names_the_install(world, monkeypatch, tmp_path):
    monkeypatch.setattr(distributed, "deepspeed_installed", lambda: False)
    with pytest.raises(DeepSpeedMissingError, match=r"dev.*deepspeed"):
        sft.run(deepspeed_config(), ModelRef(world["base"]), world["data"], tmp_path, Recorder())


def test_failed_workers_raise_with_their_output_or_the_non_finite_value(tmp_path):
    spec = WorkerSpec("sft", "base", "data", {}, str(tmp_path), str(tmp_path), "fp")
    tail = distributed.deque(["Traceback ...\n", "KeyError: 'boom'\n"])
    with pytest.raises(WorkerFailedError, match="status 1(.|\n)*KeyError: 'boom'"):
        distributed._result(spec, 1, tail)
    bad = {"step": 4, "what": "loss", "value": float("inf")}
    spec.result_path.write_text(json.dumps({"fingerprint": "fp", "non_finite": bad}))
    with pytest.raises(NonFiniteLossError, match="loss is inf at step 4"):
        distributed._result(spec, 1, tail)


def test_launch_commands_run_the_worker_module_with_this_interpreter(tmp_path):
    spec = tmp_path / "spec.json"
    torchrun = launch_command(EngineConfig(kind="deepspeed", processes=4), spec, 29555)
    assert torchrun[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert torchrun[torchrun.index("--nproc_per_node") + 1] == "4"
    assert torchrun[-3:] == ["-m", "training.sft_worker", str(spec)]
    launcher = launch_command(EngineConfig(kind="deepspeed", launcher="deepspeed"), spec, 29555)
    assert launcher[:3] == [sys.executable, "-m", "deepspeed.launcher.runner"]
    assert launcher[-3:] == ["--module", "training.sft_worker", str(spec)]


def test_the_target_count_is_what_the_causal_lm_loss_averages_over():
    batch = [Example([1, 2, 3, 4], [-100, -100, 3, 4]), Example([5, 6], [5, 6])]
    assert target_count(batch) == 3  # the first label is never a target


def test_engine_config_is_checked():
    assert SFTConfig().engine.kind == "single"
    with pytest.raises(ValueError, match="multiple of engine.processes"):
        SFTConfig(train=TrainConfig(batch_size=9), engine=EngineConfig(kind="deepspeed"))
    SFTConfig(train=TrainConfig(batch_size=9), engine=EngineConfig(processes=3, kind="deepspeed"))
    for bad in ({"processes": 0}, {"zero_stage": 4}, {"launcher": "mpirun"}, {"master_port": 80}):
        with pytest.raises(ValueError):
            EngineConfig(**bad)


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.heavy
def test_a_stopped_zero_sft_stage_run_again_with_other_run_settings_resumes(world, tmp_path):
    """Run again with settings that say only how it runs (smaller micro-batches, other ZeRO
    buckets, a longer time limit, a checkpoint interval, gradient checkpointing): the DeepSpeed
    workers load the checkpoint the stopped run committed and end with the uninterrupted run's
    weights (configs.strict.HOW_IT_RUNS)."""
    train_cfg = TRAIN.model_copy(update={"epochs": 6, "checkpoint_every": 2})
    cfg = deepspeed_config(2, train_cfg)
    base = ModelRef(world["base"])
    straight = sft.run(cfg, base, world["data"], tmp_path / "straight", Recorder())
    with pytest.raises(RuntimeError, match="at step 3"):
        sft.run(cfg, base, world["data"], tmp_path / "resumed", StopAtStep3())
    engine = cfg.engine.model_copy(
        update={
            "micro_batch_tokens": 48,
            "bucket_size": 2e4,
            "timeout_s": 7200.0,
            "gradient_checkpointing": True,
        }
    )
    how = SFTConfig(train=train_cfg.model_copy(update={"checkpoint_every": 5}), engine=engine)
    recorder = Recorder()
    resumed = sft.run(how, base, world["data"], tmp_path / "resumed", recorder)
    assert_resumed_to(straight, resumed, recorder)
