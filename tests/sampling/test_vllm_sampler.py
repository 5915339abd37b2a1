"""The vLLM sampler without a GPU: engine arguments, request mapping, time limits, weight sync,
and GRPO generating through it.

vLLM cannot run on these machines (no CPU wheel), so the engine is a stand-in
(tests/vllm_standin.py): it implements the part of `vllm.LLM` the sampler calls around a real
tiny transformers model. These tests check our side of the contract; the contract itself (that
vLLM behaves as the stand-in does) is checked by the GPU tests (`-m gpu`).
"""

from pathlib import Path

import pytest

from configs.reinforcement import GRPOConfig, SamplerConfig
from models.chat import stop_token_ids
from rl.trainer import GRPOTrainer
from sampling.factory import open_sampler
from sampling.hf import HFSampler
from sampling.interface import SamplingParams
from sampling.vllm import VLLMSampler, engine_args, launcher_env, request_seeds
from sampling.vllm_worker import EXTENSION
from sampling.watchdog import EngineStuckError, EngineThread, SamplerTimeoutError
from tests.sampling.conftest import LAUNCH_VARS
from tests.tiny_models import PROBLEMS, grpo_config, tiny_model
from tests.vllm_standin import max_difference

pytestmark = pytest.mark.usefixtures("standin")


def vllm_config(**overrides) -> SamplerConfig:
    return SamplerConfig(backend="vllm", **overrides)


def test_open_sampler_passes_every_engine_setting(policy_dir, tokenizer, standin):
    """Evaluation and rejection sampling open their sampler this way."""
    config = vllm_config(
        tensor_parallel_size=2, gpu_memory_utilization=0.5, max_model_len=512, dtype="bfloat16"
    )
    with open_sampler(config, policy_dir, tokenizer, batch_size=8) as sampler:
        assert isinstance(sampler, VLLMSampler)
        kwargs = standin.last().kwargs
    assert kwargs["model"] == str(policy_dir)
    assert kwargs["tensor_parallel_size"] == 2
    assert kwargs["gpu_memory_utilization"] == 0.5
    assert kwargs["max_model_len"] == 512 and kwargs["dtype"] == "bfloat16"
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert "worker_extension_cls" not in kwargs  # no trainer to sync from
    assert "enable_sleep_mode" not in kwargs


def test_a_trainer_s_engine_runs_in_process_with_the_weight_loader(monkeypatch):
    args = engine_args("m", vllm_config(), seed=3, weight_sync=True, distributed=False)
    assert args["worker_extension_cls"] == EXTENSION
    assert args["distributed_executor_backend"] == "external_launcher"
    assert args["enable_sleep_mode"] is True
    assert (
        engine_args("m", vllm_config(sleep_mode=False), 3, True, False)["enable_sleep_mode"]
        is False
    )
    sharded = engine_args("m", vllm_config(tensor_parallel_size=2), 0, True, distributed=False)
    assert "distributed_executor_backend" not in sharded  # its workers are other processes
    with pytest.raises(ValueError, match="tensor_parallel_size to 1"):
        engine_args("m", vllm_config(tensor_parallel_size=2), 0, True, distributed=True)
    env = launcher_env({"MASTER_PORT": "1234"})
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and "MASTER_PORT" not in env
    assert launcher_env(dict.fromkeys(LAUNCH_VARS, "x")) == {}  # a torchrun launch is kept


def test_generate_sends_token_ids_and_maps_outputs_in_prompt_order(policy_dir, tokenizer, standin):
    sampler = VLLMSampler(str(policy_dir), vllm_config(), max_model_len=64)
    prompts = ["What is 1 + 2?", "What is 3 + 4? The answer is", "7"]
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=6, seed=5, prompt_offset=2)
    groups = sampler.generate(prompts, 3, params)
    engine = standin.last()
    sent = [ids for ids, _ in engine.requests]
    assert sent == tokenizer(prompts, add_special_tokens=False)["input_ids"]
    asked = [p for _, p in engine.requests]
    assert [p["seed"] for p in asked] == request_seeds(5, 3, 3, prompt_offset=2)
    assert all(p["n"] == 3 and p["logprobs"] == 0 and p["max_tokens"] == 6 for p in asked)
    assert all(p["stop_token_ids"] == stop_token_ids(tokenizer) for p in asked)
    assert tokenizer.eos_token_id in stop_token_ids(tokenizer)
    assert [len(g) for g in groups] == [3, 3, 3]
    for group in groups:
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) <= 6
            assert c.finish_reason in ("stop", "length")
    assert sampler.generate([], 3, params) == []
    sampler.close()


def test_an_engine_start_that_hangs_fails_with_a_clear_error(policy_dir, standin):
    standin.behaviour.hang["start"] = 30
    with pytest.raises(SamplerTimeoutError) as info:
        VLLMSampler(str(policy_dir), vllm_config(start_timeout_s=0.2))
    assert standin.behaviour.ended == []  # given up at the limit, not waited out
    message = str(info.value)
    assert "engine start" in message and "0.2 s" in message and "start_timeout_s" in message
    assert "NCCL" in message and "gpu_memory_utilization" in message
    assert "restart the process" in message


def test_a_generate_that_hangs_fails_and_the_engine_refuses_more_calls(policy_dir, standin):
    sampler = VLLMSampler(str(policy_dir), vllm_config(generate_timeout_s=0.2))
    standin.behaviour.hang["generate"] = 30
    with pytest.raises(SamplerTimeoutError, match="generate_timeout_s") as info:
        sampler.generate(["What is 1 + 2?"], 2, SamplingParams(max_new_tokens=4))
    assert standin.behaviour.ended == []  # given up at the limit, not waited out
    assert info.value.operation == "generate"
    with pytest.raises(EngineStuckError, match="earlier generate"):
        sampler.generate(["What is 1 + 2?"], 2, SamplingParams(max_new_tokens=4))


def test_a_weight_sync_that_hangs_fails_with_its_key(policy_dir, tokenizer, standin):
    sampler = VLLMSampler(str(policy_dir), vllm_config(sync_timeout_s=0.2), weight_sync=True)
    standin.behaviour.hang["rpc"] = 30
    with pytest.raises(SamplerTimeoutError, match="sync_timeout_s"):
        sampler.sync_weights(tiny_model(tokenizer))
    assert standin.behaviour.ended == []  # given up at the limit, not waited out


def test_an_engine_error_propagates_unchanged(policy_dir, standin):
    boom = RuntimeError("CUDA out of memory")
    standin.behaviour.errors["generate"] = boom
    sampler = VLLMSampler(str(policy_dir), vllm_config(generate_timeout_s=30))
    with pytest.raises(RuntimeError) as info:
        sampler.generate(["What is 1 + 2?"], 1, SamplingParams(max_new_tokens=4))
    assert info.value is boom


def test_the_engine_thread_returns_results_and_keeps_one_thread():
    thread = EngineThread()
    import threading

    names = {thread.call(lambda: threading.current_thread().name, 1, "x", "k") for _ in range(3)}
    assert names == {"sampler-engine"}
    assert thread.call(lambda: 41 + 1, 1, "x", "k") == 42
    thread.close()


def test_sync_weights_loads_through_the_worker_extension_and_resets_the_cache(
    policy_dir, tokenizer, standin
):
    sampler = VLLMSampler(str(policy_dir), vllm_config(), weight_sync=True)
    engine = standin.last()
    trainer = tiny_model(tokenizer, seed=7)
    assert max_difference(engine.model, trainer) > 0
    report = sampler.sync_weights(trainer)
    assert max_difference(engine.model, trainer) == 0
    assert engine.prefix_resets == 1 and report.version == 1
    names = [name for name, _ in engine.engine_model.loaded]
    assert len(names) == len(set(names)) and "lm_head.weight" not in names
    sampler.close()
    with (
        VLLMSampler(str(policy_dir), vllm_config()) as plain,
        pytest.raises(RuntimeError, match="weight_sync=True"),
    ):
        plain.sync_weights(trainer)


def grpo_run(tokenizer, tmp_path, cfg: GRPOConfig, **trainer_kwargs):
    model = tiny_model(tokenizer)
    records = []
    trainer = GRPOTrainer(
        model, tokenizer, cfg, lambda m, s: records.append((s, m)), show_progress=False,
        **trainer_kwargs,
    )  # fmt: skip
    return model, trainer, records


def test_grpo_through_vllm_samples_from_the_current_policy_at_every_step(
    tokenizer, tmp_path, policy_dir, standin
):
    """The engine starts from the policy's folder, is synced at the start and after every
    update, so at each step's generate it holds exactly the trainer's weights; then a resumed
    run's engine (started from the old folder) is synced to the checkpoint's weights."""
    cfg = grpo_config(steps=4, checkpoint_every=2, sampler=vllm_config())
    model, trainer, records = grpo_run(tokenizer, tmp_path, cfg, policy_path=policy_dir)
    trainer.open_sampler(PROBLEMS)
    engine = standin.last()
    engine.trainer_model = model
    trainer.train(PROBLEMS, tmp_path / "ckpt", "fp")
    trainer.close()
    updates = [m for _, m in records if m.get("samples/trained", 0) > 0]
    assert updates, "no step trained"
    assert engine.staleness == [0.0] * 4
    assert engine.prefix_resets == 1 + len(updates)
    assert all("sync/seconds" in m and "sync/megabytes" in m for m in updates)
    assert engine.kwargs["worker_extension_cls"] == EXTENSION
    assert engine.kwargs["gpu_memory_utilization"] == cfg.sampler.gpu_memory_utilization

    longer = grpo_config(steps=6, checkpoint_every=2, sampler=vllm_config())
    resumed, trainer2, _ = grpo_run(tokenizer, tmp_path, longer, policy_path=policy_dir)
    trainer2.open_sampler(PROBLEMS)
    engine2 = standin.last()
    engine2.trainer_model = resumed
    report = trainer2.train(PROBLEMS, tmp_path / "ckpt", "fp")
    trainer2.close()
    assert report.resumed_from == 4
    assert engine2.staleness == [0.0, 0.0]


def test_grpo_through_vllm_saves_the_policy_when_given_no_folder(tokenizer, tmp_path, standin):
    cfg = grpo_config(steps=1, sampler=vllm_config())
    model, trainer, _ = grpo_run(tokenizer, tmp_path, cfg)
    trainer.open_sampler(PROBLEMS)
    engine = standin.last()
    folder = Path(engine.kwargs["model"])  # a temporary folder the engine loaded
    assert folder.is_dir()
    engine.trainer_model = model
    trainer.train(PROBLEMS, tmp_path / "ckpt", "fp")
    assert engine.staleness == [0.0]
    trainer.close()
    assert not folder.exists()  # the sampler owned it


def test_the_hf_default_samples_exactly_as_an_explicit_hf_sampler(tokenizer, tmp_path):
    """GRPO's sampler comes from the config now; its default must be the sampler it had."""
    cfg = grpo_config(steps=3)
    assert cfg.sampler.backend == "hf"
    model, trainer, records = grpo_run(tokenizer, tmp_path, cfg)
    trainer.train(PROBLEMS, tmp_path / "a", "fp")
    assert isinstance(trainer.sampler, HFSampler)
    assert trainer.sampler.batch_size == cfg.prompts_per_step * cfg.group_size
    twin = tiny_model(tokenizer)
    explicit = HFSampler(twin, tokenizer, batch_size=8, show_progress=False)
    records2 = []
    trainer2 = GRPOTrainer(
        twin, tokenizer, cfg, lambda m, s: records2.append((s, m)), show_progress=False,
        sampler=explicit,
    )  # fmt: skip
    trainer2.train(PROBLEMS, tmp_path / "b", "fp")
    drop = ("time/", "sync/")
    strip = [
        {k: v for k, v in m.items() if not k.startswith(drop)} for _, m in records
    ]  # fmt: skip
    strip2 = [{k: v for k, v in m.items() if not k.startswith(drop)} for _, m in records2]
    assert strip == strip2
    assert max_difference(model, twin) == 0
