"""The GRPO stage under DeepSpeed ZeRO-2 and ZeRO-3 with two CPU processes follows the
single-process stage: the same rewards, losses and signals at every step and the same final
weights. Each rank samples only its half of every step's prompts, so this also shows that the
per-prompt random streams make the ranks draw what one process draws."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from configs.reinforcement import GRPOConfig, RewardTerm
from configs.supervised import EngineConfig
from models.loading import load_model
from models.saved import ModelRef, save_model
from problems.loader import write_problems
from problems.types import ProblemSet
from stages import reasoning_rl
from tests.tiny_models import PROBLEMS, grpo_config, make_tokenizer, tiny_model
from training import distributed

needs_deepspeed = pytest.mark.skipif(
    not distributed.deepspeed_installed(),
    reason="deepspeed is not installed (the `dev` extra installs it)",
)

# signals averaged over the step's whole batch, compared step by step
SIGNALS = ("reward/mean", "reward/std", "samples/trained", "loss", "entropy", "clip_high_fraction")
RTOL = 1e-4
WEIGHT_ATOL = 1e-5
# Micro-batches of 40 tokens, logits in chunks and checkpointed layers add each gradient in
# another order than one pass over the batch does; Adam's normalised steps carry that float32
# round-off into the weights: 1.36e-5 apart at most on an AMD EPYC (under 1e-5 on an Intel Xeon),
# measured. A wrong step moves weights by about the learning rate (1e-2).
BOUNDED_WEIGHT_ATOL = 1e-4
# 24 steps, each rank packing its own share in a row (rl.rollouts.pack_policy_batch), round off
# differently from one process packing the whole batch: 1.0e-5 apart at most, measured. A step
# skipped or repeated on resume moves weights by about the learning rate (1e-2).
RESUMED_WEIGHT_ATOL = 5e-5


class Recorder:
    """A tracker that keeps each logged GRPO step's metrics."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}
        self.artifacts: list[Path] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if step and "reward/mean" in metrics:
            self.steps[step] = dict(metrics)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.artifacts.append(Path(path))


def config(zero_stage: int | None, precision: str = "fp32", **overrides) -> GRPOConfig:
    """Four steps of two prompts (one per rank) with a frozen reference (beta > 0), two inner
    iterations, and gradient clipping that acts."""
    engine = (
        EngineConfig()
        if zero_stage is None
        else EngineConfig(kind="deepspeed", processes=2, zero_stage=zero_stage, precision=precision)
    )
    settings = dict(
        steps=4,
        beta=0.05,
        inner_iterations=2,
        max_grad_norm=0.5,
        aggregation="token_mean",
        engine=engine,
    )
    return grpo_config(**(settings | overrides))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("deepspeed_grpo")
    tokenizer = make_tokenizer()
    base = save_model(tiny_model(tokenizer), tokenizer, root / "base").path
    train = write_problems(root / "train.jsonl", PROBLEMS)
    return {"root": root, "base": base, "problems": ProblemSet(train, train, len(PROBLEMS), 0)}


def run_stage(world, cfg: GRPOConfig, name: str, tracker: Recorder | None = None):
    recorder = tracker or Recorder()
    ref = reasoning_rl.run(
        cfg, ModelRef(world["base"]), world["problems"], world["root"] / name, recorder
    )
    return recorder, ref


@pytest.fixture(scope="module")
def single(world):
    return run_stage(world, config(None), "single")


@pytest.mark.heavy
@needs_deepspeed
@pytest.mark.parametrize(
    ("zero_stage", "memory"),
    [
        (2, {}),
        (3, {}),
        # the memory settings change nothing but memory: micro-batches, logits in chunks,
        # checkpointed layers, sampling from the shards instead of a whole copy
        (
            3,
            {
                "micro_batch_tokens": 40,
                "logits_chunk_mb": 0.001,
                "gradient_checkpointing": True,
                "zero3_sampling": "shards",
            },
        ),  # fmt: skip
    ],
    ids=["zero2", "zero3", "zero3-bounded"],
)
def test_zero_grpo_follows_the_single_process_stage(world, single, zero_stage, memory):
    reference, reference_model = single
    cfg = config(zero_stage)
    cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update=memory)})
    name = f"zero{zero_stage}" + ("-bounded" if memory else "")
    recorder, ref = run_stage(world, cfg, name)

    assert sorted(recorder.steps) == [1, 2, 3, 4] == sorted(reference.steps)
    assert any(m["samples/trained"] > 0 for m in reference.steps.values())
    for step, theirs in reference.steps.items():
        ours = recorder.steps[step]
        for key in SIGNALS:
            assert (key in ours) == (key in theirs), (step, key)
            if key in theirs:
                assert ours[key] == pytest.approx(theirs[key], rel=RTOL, abs=1e-6), (step, key)
    trained = load_model(ref.path).state_dict()
    atol = BOUNDED_WEIGHT_ATOL if memory else WEIGHT_ATOL
    for name, weight in load_model(reference_model.path).state_dict().items():
        assert torch.allclose(trained[name], weight, atol=atol), name
    moved = load_model(world["base"]).state_dict()
    assert any(not torch.equal(trained[n], moved[n]) for n in moved)  # it trained
    assert any(p.name == "reward_curve.png" for p in recorder.artifacts)
    assert any(p.parent.name == "samples" for p in recorder.artifacts)
    # what rank 0 holds of the policy and the reference: whole copies of both under ZeRO-2;
    # under ZeRO-3 its shard of each (a half), no whole copy to sample from or to compare with
    result = json.loads(
        (world["root"] / f"zero{zero_stage}" / "deepspeed" / "result.json").read_text()
    )
    whole = sum(p.numel() for p in load_model(world["base"]).parameters())
    if zero_stage == 2:
        assert result["held_elements"] == 2 * whole
    else:
        assert result["held_elements"] <= whole * 1.05  # two halves, padded to the partitions


@pytest.mark.heavy
@needs_deepspeed
@pytest.mark.parametrize("zero_stage", [2, 1])
def test_bf16_mixed_precision_follows_the_fp32_stage(world, single, zero_stage):
    """`engine.precision: bf16` (the GPU setting) on the CPU accelerator, under ZeRO-2 and
    ZeRO-1's BF16_Optimizer: the first step's samples are the fp32 ones and its loss is theirs
    within bf16's rounding; later steps start from weights that differ by the rounding of each
    update, so their losses are only required to be finite; the saved model is fp32."""
    reference, _ = single
    recorder, ref = run_stage(world, config(zero_stage, "bf16"), f"bf16-zero{zero_stage}")
    assert recorder.steps[1]["reward/mean"] == reference.steps[1]["reward/mean"]
    assert recorder.steps[1]["loss"] == pytest.approx(reference.steps[1]["loss"], rel=0.1, abs=0.01)
    assert all(math.isfinite(m["loss"]) for m in recorder.steps.values() if "loss" in m)
    with safe_open(str(ref.path / "model.safetensors"), "pt") as saved:  # as written on disk
        assert {saved.get_tensor(k).dtype for k in saved.keys()} == {torch.float32}  # noqa: SIM118


@pytest.mark.heavy
@needs_deepspeed
def test_a_bf16_reference_starts_the_kl_at_zero(world):
    """The reference is cast as the policy is: at the first step, before any update, the bf16
    policy and its reference give the same log-probabilities, so the KL is exactly 0 (against an
    fp32 reference it would start at bf16's precision gap)."""
    cfg = config(2, steps=1, inner_iterations=1, aggregation="sequence_mean")
    cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"precision": "bf16"})})
    recorder, _ = run_stage(world, cfg, "bf16_kl")
    assert recorder.steps[1]["samples/trained"] > 0
    assert recorder.steps[1]["kl"] == 0.0


class StopAtStep3(Recorder):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        if step == 3 and "reward/mean" in metrics:
            raise RuntimeError("tracker stops the stage at step 3")


@pytest.mark.slow  # about 20 s: CI runs it (-m slow); the default suite keeps to ten minutes
@pytest.mark.heavy
@needs_deepspeed
def test_a_stopped_zero_grpo_stage_resumes_from_its_checkpoint(world):
    """The tracker stops the stage at step 3 (the workers, running ahead, are stopped wherever
    they are); the rerun resumes from the last committed checkpoint and ends with the weights of
    an uninterrupted run. 24 steps, so the workers never reach the end before they are stopped."""
    steps = 24
    _, straight = run_stage(world, config(None, steps=steps, checkpoint_every=2), "straight")
    cfg = config(2, steps=steps, checkpoint_every=2)
    with pytest.raises(RuntimeError, match="at step 3"):
        run_stage(world, cfg, "resumed", StopAtStep3())
    recorder, ref = run_stage(world, cfg, "resumed")
    first = min(recorder.steps)
    assert 3 <= first <= steps and first % 2 == 1  # resumed after an even, committed step
    assert max(recorder.steps) == steps
    trained = load_model(ref.path).state_dict()
    for name, weight in load_model(straight.path).state_dict().items():
        assert torch.allclose(trained[name], weight, atol=RESUMED_WEIGHT_ATOL), name


def test_prompts_per_step_must_split_over_the_processes():
    with pytest.raises(ValueError, match="multiple of engine.processes"):
        GRPOConfig(prompts_per_step=3, engine=EngineConfig(kind="deepspeed", processes=2))
    GRPOConfig(prompts_per_step=3, engine=EngineConfig(kind="deepspeed", processes=3))


@pytest.mark.slow  # about 20 s: CI runs it (-m slow); the default suite keeps to ten minutes
@pytest.mark.heavy
@needs_deepspeed
def test_a_zero3_reference_refreshes_and_resumes_with_real_weights(world):
    """Under ZeRO-3 the reference is refreshed to the policy every 2 steps, saved with each
    checkpoint and loaded again when the stopped stage resumes: the steps after the checkpoint it
    resumes from (whose KL is to the refreshed reference) follow the single-process stage's. A
    refresh or a checkpoint that moved empty shards would leave the reference at the base and
    change their losses. 12 steps, so that the workers, running ahead of the tracker that stops
    the stage at step 3, never reach the end first (they may commit a later checkpoint)."""
    settings = {"ref_refresh_every": 2, "checkpoint_every": 2, "steps": 12}
    single, single_model = run_stage(world, config(None, **settings), "refresh-single")
    cfg = config(3, **settings)
    with pytest.raises(RuntimeError, match="at step 3"):
        run_stage(world, cfg, "refresh-zero3", StopAtStep3())
    recorder, ref = run_stage(world, cfg, "refresh-zero3")
    resumed = sorted(recorder.steps)
    assert resumed and resumed[0] >= 3 and resumed[0] % 2 == 1, resumed  # after a checkpoint
    assert resumed == list(range(resumed[0], 13))
    for step in resumed:
        for key in ("loss", "kl", "reward/mean"):
            ours, theirs = recorder.steps[step][key], single.steps[step][key]
            assert ours == pytest.approx(theirs, rel=RTOL, abs=1e-6), (step, key)
    assert single.steps[3]["kl"] != single.steps[2]["kl"]  # the refresh changed the KL's base
    trained = load_model(ref.path).state_dict()
    for name, weight in load_model(single_model.path).state_dict().items():
        assert torch.allclose(trained[name], weight, atol=RESUMED_WEIGHT_ATOL), name


@pytest.mark.heavy
@needs_deepspeed
def test_one_deepspeed_worker_probes_and_the_stage_guard_reads_it(world):
    """One worker (one GPU) runs the held-out probe as a single process does: its readings reach
    the stage's tracker at the probe's steps, its per-problem items reach the guard and not the
    tracker, and the guard's rule that reads the probe is not idle."""
    from stages.guarded import GuardRecord

    class Everything(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[tuple[int | None, dict[str, float]]] = []

        def log_metrics(self, metrics, step=None):
            super().log_metrics(metrics, step)
            self.lines.append((step, dict(metrics)))

    engine = EngineConfig(kind="deepspeed", processes=1, zero_stage=2)
    paid = [RewardTerm(name="accuracy", families=["math"]), RewardTerm(name="tag_count")]
    cfg = config(None, engine=engine, beta=0.0, probe={"every": 2, "problems": 4}, rewards=paid)
    recorder, _ = run_stage(world, cfg, "probed", Everything())
    probed = sorted(s for s, m in recorder.lines if "heldout/pass_at_1" in m)
    assert probed == [0, 2, 4]
    assert not any(k.startswith("items/") for _, m in recorder.lines for k in m)
    record = GuardRecord.load(world["root"] / "probed" / "deepspeed")
    assert "reward_without_skill" in record.rules
    assert "reward_without_skill" not in record.idle
