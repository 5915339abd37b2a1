"""The GPU profile of the tiny world, configs/gpu-tiny.yaml: it loads as the GPU run takes it, a
process asked for a GPU it does not have is refused by name, and (slow) the same profile runs
end to end here with the micro profile's sizes and steps, on the CPU: every SFT and GRPO stage
in a DeepSpeed worker as on the GPU, the GRPO stages' held-out probe read by their guard."""

from __future__ import annotations

import pytest
import torch
import yaml
from mlflow import MlflowClient

from configs.profiles import PROFILES_DIR, merged, validate
from models.loading import DeviceError, model_device, use_device
from training import distributed

GPU_TINY = PROFILES_DIR / "gpu-tiny.yaml"
MICRO = PROFILES_DIR / "micro.yaml"
GRPO_STAGES = ("r1_zero", "reasoning_rl", "all_scenarios_rl")
DEEPSPEED_STAGES = (
    "cold_start_sft", "r1_zero_rl", "reasoning_rl", "mixed_sft", "all_scenarios_rl",
    "student_qwen", "student_llama", "rl_only_qwen", "rl_only_llama",
)  # fmt: skip


def profile_data() -> dict:
    return yaml.safe_load(GPU_TINY.read_text(encoding="utf-8"))


def test_the_profile_trains_every_stage_under_deepspeed_on_one_gpu():
    config = validate(profile_data(), "gpu-tiny")
    assert config.device == "cuda" and config.data.source == "tiny"
    for stage, engine in config.engines().items():
        assert (engine.kind, engine.processes, engine.zero_stage, engine.precision) == (
            "deepspeed", 1, 2, "bf16",
        ), stage  # fmt: skip
    for stage in GRPO_STAGES:
        assert getattr(config, stage).probe.every > 0, stage  # one worker probes
    tiny = validate(yaml.safe_load((PROFILES_DIR / "tiny.yaml").read_text()), "tiny")
    assert config.bootstrap.model.hidden_size > tiny.bootstrap.model.hidden_size


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_gpu_profile_without_a_gpu_is_refused_by_name():
    with pytest.raises(DeviceError, match="device: cuda"):
        use_device("cuda")
    assert model_device() == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_shell_that_hides_the_gpus_is_named_in_the_refusal(monkeypatch):
    """A GPU machine whose shell sets `CUDA_VISIBLE_DEVICES=""` looks like one without GPUs:
    the refusal names the variable, the thing to change (here, a machine without GPUs stands in
    for it)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceError, match="CUDA_VISIBLE_DEVICES='' in the environment"):
        use_device("cuda")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(DeviceError) as refused:
        use_device("cuda")
    assert "CUDA_VISIBLE_DEVICES" not in str(refused.value)


def cpu_cut() -> dict:
    """gpu-tiny at the micro profile's sizes and steps, on the CPU: its engines stay DeepSpeed
    (fp32, which the CPU runs), one worker each."""
    data = merged(profile_data(), yaml.safe_load(MICRO.read_text(encoding="utf-8")))
    data |= {"name": "r1-gpu-tiny-cut", "device": "cpu", "torch_threads": 1}
    data["all_scenarios_rl"]["general_per_step"] = 1  # micro's steps are of 2 prompts
    engines = [data[s] for s in ("cold_start_sft", "mixed_sft", *GRPO_STAGES)]
    engines += [data["distillation"], data["distillation"]["rl_twin"]]
    for section in engines:
        section["engine"] = section["engine"] | {"precision": "fp32", "bucket_size": 5e6}
    return data


@pytest.mark.slow
@pytest.mark.skipif(not distributed.deepspeed_installed(), reason="deepspeed is not installed")
def test_the_profile_cut_runs_end_to_end_under_deepspeed_on_cpu(prefect_server, tmp_path):
    from flows.r1_pipeline import r1_pipeline

    mp = pytest.MonkeyPatch()
    mp.setenv("R1_STATE_DIR", str(tmp_path))
    try:
        config = validate(cpu_cut(), "gpu-tiny (cut)")
        result = r1_pipeline(config=config)
    finally:
        mp.undo()
    assert [r.stage for r in result.rows][-1] == "rl_only_llama"  # every stage ran
    launched = {p.relative_to(tmp_path / "runs").parts[0] for p in tmp_path.rglob("result.json")}
    assert launched == set(DEEPSPEED_STAGES)  # each trained in a DeepSpeed worker
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(result.parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    by_stage = {r.data.tags.get("r1.stage"): r for r in children}
    for stage in ("r1_zero_rl", "reasoning_rl"):
        run = by_stage[stage]
        assert run.info.status == "FINISHED", stage
        assert "heldout/pass_at_1_lenient" in run.data.metrics, stage  # the worker's probe
        assert not any(k.startswith("items/") for k in run.data.metrics)
