"""vLLM engines as they really behave, against the stand-in written from vLLM 0.33's source
(tests/vllm_standin.py): engines are closed and let go of, stages close theirs when they end
(failure included), request seeds never collide under vLLM's seed + j rule, an in-process
engine's start leaves the process as it found it, a colocated engine sleeps through each update,
and an engine holds the stage's longest prompt + completion rather than the model's context."""

import gc
import os
import random
import weakref
from pathlib import Path

import pytest
import torch

from configs.reinforcement import EvalConfig, SamplerConfig
from configs.schema import RejectionConfig
from configs.supervised import EngineConfig
from models.chat import render_prompt
from models.saved import ModelRef
from problems.loader import write_problems
from problems.types import Problem, ProblemSet
from rl.trainer import GRPOTrainer
from sampling.interface import SamplingParams
from sampling.vllm import SEED_SPACING, VLLMSampler, request_seeds
from stages import evaluate, rejection
from stages.tracker import NullTracker
from tests.tiny_models import PROBLEMS, grpo_config, tiny_model
from training.distributed import worker_env

pytestmark = pytest.mark.usefixtures("standin")

PARAMS = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=6, seed=3)


def vllm(**overrides) -> SamplerConfig:
    return SamplerConfig(backend="vllm", **overrides)


def test_engines_opened_used_and_closed_in_a_loop_leave_nothing_behind(policy_dir, standin):
    for weight_sync in (False, True, False, True):
        sampler = VLLMSampler(str(policy_dir), vllm(), weight_sync=weight_sync, max_model_len=64)
        sampler.generate(["What is 1 + 2?"], 2, PARAMS)
        engine = weakref.ref(standin.last())
        assert standin.live == 1
        sampler.close()
        sampler.close()  # twice is harmless
        gc.collect()
        assert engine() is None, "something still holds the closed engine"
        assert standin.live == 0 and standin.device.free == pytest.approx(1.0)
        assert not torch.distributed.is_initialized()  # an in-process engine's group ended
    with pytest.raises(RuntimeError, match="closed"):
        sampler.generate(["What is 1 + 2?"], 1, PARAMS)


def test_an_engine_left_open_blocks_the_next_as_vllm_does(policy_dir, standin):
    """The reason closing matters: vLLM will not start while free memory is below its share."""
    first = VLLMSampler(str(policy_dir), vllm(gpu_memory_utilization=0.6))
    with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
        VLLMSampler(str(policy_dir), vllm(gpu_memory_utilization=0.6))
    first.close()
    with VLLMSampler(str(policy_dir), vllm(gpu_memory_utilization=0.6)):
        assert standin.live == 1
    assert standin.live == 0


def heldout(tmp_path: Path, n: int = 4) -> ProblemSet:
    problems = [Problem(f"h{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(n)]
    path = write_problems(tmp_path / "heldout.jsonl", problems)
    return ProblemSet(train_path=path, heldout_path=path, n_train=n, n_heldout=n)


@pytest.mark.parametrize("fails", [False, True])
def test_evaluation_closes_its_engine_when_it_ends_or_fails(policy_dir, tmp_path, standin, fails):
    config = EvalConfig(n_samples=2, k=2, max_new_tokens=8, general_prompts=0, sampler=vllm())
    if fails:
        standin.behaviour.errors["generate"] = RuntimeError("CUDA error: an illegal access")
    run = evaluate.run
    if fails:
        with pytest.raises(RuntimeError, match="illegal access"):
            run(config, ModelRef(policy_dir), heldout(tmp_path), tmp_path / "eval", NullTracker())
    else:
        report = run(config, ModelRef(policy_dir), heldout(tmp_path), tmp_path, NullTracker())
        assert report.n_problems == 4
    assert standin.live == 0 and standin.device.free == pytest.approx(1.0)


class MemorySink:
    def __init__(self):
        self.rows = []

    def stored(self):
        return {}

    def insert(self, rows):
        self.rows.append(rows)
        return rows.num_rows


def test_rejection_sampling_closes_its_engine_and_its_seeds_never_collide(policy_dir, standin):
    """Nine copies of one question in three chunks of four samples: no two samples of the
    stage share a seed (under the old seeds, sample j of prompt i was sample 0 of prompt i + j)."""
    config = RejectionConfig(
        samples_per_prompt=4, max_new_tokens=6, chunk_prompts=3, general_prompts=0, sampler=vllm()
    )
    prompts = [Problem(f"r{i}", "What is 2 + 2?", "4") for i in range(9)]
    sink = MemorySink()
    rejection.run(config, ModelRef(policy_dir), "m", prompts, sink, NullTracker())
    assert standin.live == 0 and sum(t.num_rows for t in sink.rows) == 36
    seeds = standin.seeds_drawn
    assert len(seeds) == 36 and len(set(seeds)) == 36, "two samples drew from one seed"


def test_request_seeds_leave_room_for_every_sample_of_every_prompt():
    """vLLM's rule: sample j of a request seeded s uses s + j. Under the old seeds (s + i for
    prompt i) sample 1 of prompt 0 was sample 0 of prompt 1."""
    for n in (1, 4, 8, 64):
        seeds = request_seeds(7, 100, n)
        drawn = [s + j for s in seeds for j in range(n)]
        assert len(set(drawn)) == 100 * n
        assert all(s >= 0 and s + n < 2**63 for s in seeds)
    # a rank's share draws what one process draws for the same prompts
    assert request_seeds(4, 6, 8)[2:] == request_seeds(4, 4, 8, prompt_offset=2)
    # other calls (steps, chunks) take ranges far from each other
    calls = [request_seeds(seed, 16, 8) for seed in range(200)]
    drawn = [s + j for call in calls for s in call for j in range(8)]
    assert len(set(drawn)) == len(drawn)
    with pytest.raises(ValueError, match="samples per prompt"):
        request_seeds(0, 1, SEED_SPACING + 1)


def test_an_in_process_engine_leaves_the_process_as_it_found_it(policy_dir, standin):
    """Its start reseeds the global RNGs, sets matmul precision, freezes the GC and writes
    variables (the stand-in does what vLLM's external launcher does); none of it outlives the
    start, and a DeepSpeed launch after it sees none of it."""
    torch.manual_seed(1234)
    random.seed(99)
    before_env = dict(os.environ)
    before_rng = torch.get_rng_state()
    torch.set_float32_matmul_precision("high")
    try:
        with VLLMSampler(str(policy_dir), vllm(), weight_sync=True, max_model_len=64) as sampler:
            assert torch.distributed.is_initialized()  # the engine's rank-0-of-1 group
            assert dict(os.environ) == before_env
            assert torch.equal(torch.get_rng_state(), before_rng)
            assert random.random() == random.Random(99).random()
            assert torch.get_float32_matmul_precision() == "high"
            assert gc.get_freeze_count() == 0
            env = worker_env(EngineConfig(kind="deepspeed"))
            sampler.generate(["What is 1 + 2?"], 1, PARAMS)
    finally:
        torch.set_float32_matmul_precision("highest")
    assert not any(key.startswith("VLLM_") for key in env)
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env)


def test_a_launch_drops_distributed_variables_it_inherits(monkeypatch):
    """A process that is itself a rank (or had them leaked into it) does not hand its rank to
    the workers it launches: each launcher sets its own."""
    leaked = {"RANK": "3", "WORLD_SIZE": "8", "MASTER_PORT": "1", "LOCAL_RANK": "3"}
    leaked |= {"TORCHELASTIC_RUN_ID": "x", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for key, value in leaked.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # the user's own setting stays
    env = worker_env(EngineConfig(kind="deepspeed"))
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"} & set(env)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and env["VLLM_LOGGING_LEVEL"] == "DEBUG"


def test_the_colocated_engine_sleeps_through_each_update_and_is_sized_for_the_step(
    tokenizer, tmp_path, policy_dir, standin
):
    cfg = grpo_config(steps=3, sampler=vllm(gpu_memory_utilization=0.3))
    model = tiny_model(tokenizer)
    records = []
    trainer = GRPOTrainer(
        model, tokenizer, cfg, lambda m, s: records.append(m), show_progress=False,
        policy_path=policy_dir,
    )  # fmt: skip
    free_at_update = []
    update = trainer.update
    trainer.update = lambda *a, **k: (free_at_update.append(standin.device.free), update(*a, **k))[
        1
    ]
    trainer.open_sampler(PROBLEMS)
    engine = standin.last()
    engine.trainer_model = model
    prompts = [render_prompt(tokenizer, p.question) for p in PROBLEMS]
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert engine.kwargs["max_model_len"] == longest + cfg.max_new_tokens
    assert engine.kwargs["enable_sleep_mode"] is True
    trainer.train(PROBLEMS, tmp_path / "ckpt", "fp")
    trained = [m for m in records if m.get("samples/trained", 0) > 0]
    assert trained and engine.sleeps == len(trained)
    assert free_at_update == [pytest.approx(1.0)] * len(trained)  # its memory given back
    assert engine.staleness == [0.0] * cfg.steps  # level 2 discarded the weights; synced back
    trainer.close()
    assert standin.live == 0


def test_the_engine_wakes_although_torch_cached_the_updates_memory(
    tokenizer, tmp_path, policy_dir, standin, monkeypatch
):
    """After an update torch's allocator keeps the freed blocks cached; vLLM wakes its memory
    through CUDA's own calls and cannot use them: the sampler gives them back first."""
    from sampling import vllm as vllm_module

    cfg = grpo_config(steps=2, sampler=vllm(gpu_memory_utilization=0.5))
    trainer = GRPOTrainer(
        tiny_model(tokenizer), tokenizer, cfg, lambda m, s: None, show_progress=False,
        policy_path=policy_dir,
    )  # fmt: skip
    update = trainer.update

    def caching_update(*args, **kwargs):
        out = update(*args, **kwargs)
        standin.device.torch_cache = 0.7  # the update's activations, freed into torch's cache
        return out

    trainer.update = caching_update
    monkeypatch.setattr(vllm_module, "release_cached_memory", standin.device.empty_torch_cache)
    trainer.train(PROBLEMS, tmp_path / "ckpt", "fp")  # a wake-up into 0.3 free would fail
    assert standin.last().sleeps >= 1 and standin.device.torch_cache == 0.0
    trainer.close()


def test_importing_vllm_leaves_no_variable_behind(policy_dir, standin):
    """`import vllm` writes variables of its own (PYTORCH_NVML_BASED_CUDA_CHECK,
    TORCHINDUCTOR_COMPILE_THREADS); the first engine's start, which imports it, puts the
    environment back as it was."""
    before = dict(os.environ)
    with VLLMSampler(str(policy_dir), vllm(), max_model_len=64) as sampler:
        sampler.generate(["What is 1 + 2?"], 1, PARAMS)
        assert standin.imported
        assert dict(os.environ) == before


def test_a_prompt_longer_than_the_engine_holds_is_refused_by_name(policy_dir, standin):
    with (
        VLLMSampler(str(policy_dir), vllm(), max_model_len=16) as sampler,
        pytest.raises(ValueError, match="max_model_len 16"),
    ):
        sampler.generate(["What is 1 + 2? " * 8], 1, SamplingParams(max_new_tokens=8))
