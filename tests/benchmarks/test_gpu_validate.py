"""The GPU validation script: its CPU mode end to end on a tiny model, its refusals, and the
FLOPs and MFU arithmetic. The whole script with vLLM on a GPU is the `gpu`-marked test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_validate
from benchmarks.throughput import Measurement, flop_parameters, peak_tflops
from configs.supervised import ModelConfig
from models.loading import build_model
from tests.tiny_models import make_tokenizer, tiny_model

ROOT = Path(__file__).resolve().parents[2]


def write_data(path: Path, rows: int = 6) -> Path:
    """GSM8K's format: a question, and a solution whose last line is `#### answer`."""
    with path.open("w", encoding="utf-8") as f:
        for a in range(rows):
            answer = f"{a} + 2 = {a + 2}\n#### {a + 2}"
            f.write(json.dumps({"question": f"What is {a} + 2?", "answer": answer}) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gv")
    tokenizer = make_tokenizer()
    tiny_model(tokenizer).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return folder / "model", write_data(folder / "data.jsonl")


def test_cpu_mode_prints_every_row(tiny_policy, capsys):
    model, data = tiny_policy
    gpu_validate.main(
        [
            "--model", str(model), "--data", str(data), "--device", "cpu", "--skip-vllm",
            "--prompts", "4", "--n", "2", "--max-new-tokens", "8", "--sft-steps", "2",
            "--sft-batch-size", "2", "--grpo-steps", "1", "--grpo-prompts", "2",
            "--group-size", "2", "--peak-tflops", "1",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    for name in ("generation vllm", "generation hf", "generation vllm / hf", "training sft"):
        assert name in rows, out
    assert "training grpo step" in rows
    assert "skipped (--skip-vllm)" in rows["generation vllm"]
    for name in ("generation hf", "training sft", "training grpo step"):
        cells = [c.strip() for c in rows[name].split("|")[1:-1]]
        tokens, seconds, rate, tflops, mfu = cells[1:6]
        assert int(tokens) > 0 and float(seconds) > 0 and float(rate) > 0
        assert float(tflops) >= 0 and mfu.endswith("%")  # peak given: MFU is printed
    assert "trained 4/4 samples" in rows["training grpo step"]  # every sample trains
    assert "GRPO samples with hf" in out


def test_it_stops_at_once_without_cuda_or_vllm(tiny_policy, monkeypatch):
    model, data = tiny_policy
    base = ["--model", str(model), "--data", str(data)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_validate.main(base)
    with pytest.raises(SystemExit, match="--device cuda"):
        gpu_validate.main([*base, "--device", "cpu"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_validate.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match=r"`gpu` extra"):
        gpu_validate.main(base)


def test_peaks_of_known_devices():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("Tesla T4") is None


def test_flop_parameters_leave_out_an_untied_embedding_table():
    tokenizer = make_tokenizer()
    tied = tiny_model(tokenizer)
    assert flop_parameters(tied) == sum(p.numel() for p in tied.parameters())
    untied = tiny_model(tokenizer)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    embedding = untied.get_input_embeddings().weight.numel()
    assert flop_parameters(untied) == sum(p.numel() for p in untied.parameters()) - embedding


def test_mfu_is_achieved_model_flops_over_the_peak():
    m = Measurement("training sft", tokens=1000, seconds=2.0, flops=6 * 1e9 * 1000)
    assert m.tokens_per_second == 500
    assert m.tflops == pytest.approx(3.0)
    assert m.mfu(300.0) == pytest.approx(0.01)
    assert m.mfu(None) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_the_whole_script_on_a_gpu(tmp_path):
    """Runs on a CUDA machine with the `gpu` extra: vLLM and HF side by side, SFT and GRPO with
    the colocated vLLM engine. The model is $R1_GPU_MODEL (a Qwen2.5 folder) and the data
    $R1_GPU_DATA when set; otherwise a small Qwen2 model built here and a generated set."""
    pytest.importorskip("vllm", reason="needs vLLM: the `gpu` extra")
    model = os.environ.get("R1_GPU_MODEL")
    data = os.environ.get("R1_GPU_DATA") or str(write_data(tmp_path / "data.jsonl", 64))
    if model is None:
        tokenizer = make_tokenizer()
        spec = ModelConfig(
            hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512,
            max_position_embeddings=1024,
        )  # fmt: skip
        built = build_model(spec, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
        model = str(tmp_path / "model")
        built.save_pretrained(model)
        tokenizer.save_pretrained(model)
    command = [sys.executable, "-m", "benchmarks.gpu_validate", "--model", model, "--data", data]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    rows = {line.split("|")[1].strip(): line for line in lines}
    assert "skipped" not in rows["generation vllm"]
    assert rows["generation vllm / hf"].split("|")[4].strip().endswith("x")
    assert "%" in rows["training grpo step"]
