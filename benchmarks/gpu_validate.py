"""Validate the GPU profile at small scale: generation with vLLM and with our HF sampler side by
side, SFT and GRPO training throughput, and model FLOPs utilisation (MFU).

    python -m benchmarks.gpu_validate --model /models/Qwen2.5-1.5B-Instruct --data gsm8k_test.jsonl

On one GPU, with a Qwen2.5 0.5B-1.5B folder and GSM8K-format JSONL (question, answer ending in
`#### 42`): the same prompts and sampling settings go through vLLM (the colocated engine GRPO
uses, sampler settings as the GRPO config's) and through sampling/hf.py on the same weights in
bf16; then SFT steps and GRPO steps (sampling with vLLM, weight sync after each update) train the
policy with bf16 autocast. It prints one table: tokens, seconds, tokens/s, achieved model TFLOP/s
and MFU against the device's dense bf16 peak (benchmarks/throughput.py says how FLOPs are
counted; --peak-tflops for a device it does not know), and the vLLM/HF ratio.

It stops at once, saying what is missing, without a CUDA device or without vLLM (the `gpu`
extra). `--device cpu --skip-vllm` runs everything but vLLM on CPU, to check the script itself.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from benchmarks.throughput import (  # noqa: E402
    Measurement,
    flop_parameters,
    measure_generation,
    measure_grpo,
    measure_sft,
    peak_tflops,
    prompt_tokens,
)
from configs.reinforcement import GRPOConfig, RewardTerm, SamplerConfig
from models.chat import render_completion, render_prompt  # noqa: E402
from models.loading import load_model, load_tokenizer  # noqa: E402
from problems.loader import load_problems  # noqa: E402
from rl.trainer import GRPOTrainer  # noqa: E402
from sampling.hf import HFSampler  # noqa: E402
from sampling.interface import SamplingParams  # noqa: E402
from training.examples import sft_examples  # noqa: E402

ROWS = ("generation vllm", "generation hf", "generation vllm / hf", "training sft")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True, help="a local model folder")
    p.add_argument("--data", type=Path, required=True, help="JSONL: question, answer")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--skip-vllm", action="store_true", help="measure the HF side only")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's bf16 peak")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--hf-batch-size", type=int, default=256, help="rows the HF sampler decodes")
    p.add_argument("--sft-steps", type=int, default=10)
    p.add_argument("--sft-batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=512, help="SFT example tokens")
    p.add_argument("--grpo-steps", type=int, default=3, help="timed, after one warm-up step")
    p.add_argument("--grpo-prompts", type=int, default=8, help="prompts per GRPO step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def preflight(args: argparse.Namespace) -> None:
    """Stop before loading anything when the machine cannot run what was asked."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "gpu_validate: no CUDA device is visible (torch.cuda.is_available() is False). Run "
            "it on a GPU machine, or check the script on CPU with --device cpu --skip-vllm."
        )
    if args.skip_vllm:
        return
    if args.device != "cuda":
        raise SystemExit("gpu_validate: vLLM needs --device cuda; on CPU pass --skip-vllm")
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(
            "gpu_validate: vllm is not installed. Install the `gpu` extra "
            "(pip install -e '.[gpu]'), or pass --skip-vllm to measure the HF side only."
        )


def sft_set(args: argparse.Namespace, tokenizer) -> list:
    """SFT examples from the data's own solutions (the answer column, steps and all)."""
    rows = []
    with args.data.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    rows = rows[: max(1, args.sft_batch_size * (args.sft_steps + 1))]
    prompts = [render_prompt(tokenizer, r["question"]) for r in rows]
    completions = [render_completion(tokenizer, str(r["answer"])) for r in rows]
    return sft_examples(tokenizer, prompts, completions, args.max_length)


def grpo_config(args: argparse.Namespace, sampler: SamplerConfig) -> GRPOConfig:
    """Every sample trains (no dynamic sampling, no truncation mask, the format reward scores
    every completion), so the step's work does not depend on what the model happens to write."""
    return GRPOConfig(
        steps=args.grpo_steps + 1,
        prompts_per_step=args.grpo_prompts,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        learning_rate=1e-6,
        dynamic_sampling=False,
        mask_truncated=False,
        rewards=[RewardTerm(name="accuracy"), RewardTerm(name="format", weight=0.5)],
        sampler=sampler,
        seed=args.seed,
    )


def measure(args: argparse.Namespace) -> tuple[list[Measurement | None], str]:
    """Every row of the table, in order (None: skipped), and the header line."""
    device = torch.device(args.device)
    bf16 = device.type == "cuda"
    tokenizer = load_tokenizer(args.model)
    problems = load_problems(args.data)
    total = args.prompts + args.grpo_prompts * (args.grpo_steps + 1)
    problems = (problems * (total // max(1, len(problems)) + 1))[:total]
    prompts = [render_prompt(tokenizer, p.question) for p in problems[: args.prompts]]
    lengths = prompt_tokens(tokenizer, prompts)
    params = SamplingParams(args.temperature, args.top_p, args.max_new_tokens, seed=args.seed)
    policy = load_model(args.model).to(device)  # fp32 weights: the trainer's
    n_params = flop_parameters(policy)

    vllm = hf = None
    sampler_config = SamplerConfig(
        backend="vllm" if not args.skip_vllm else "hf",
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    engine = None
    if not args.skip_vllm:
        from sampling.vllm import VLLMSampler

        engine = VLLMSampler(str(args.model), sampler_config, seed=args.seed, weight_sync=True)
        vllm = measure_generation(
            "generation vllm", engine, prompts, args.n, params, lengths, n_params, device
        )
    generator = copy.deepcopy(policy).to(torch.bfloat16 if bf16 else torch.float32).eval()
    hf_sampler = HFSampler(generator, tokenizer, args.hf_batch_size, show_progress=False)
    hf = measure_generation(
        "generation hf", hf_sampler, prompts, args.n, params, lengths, n_params, device
    )
    del generator, hf_sampler

    sft = measure_sft(
        policy, sft_set(args, tokenizer), args.sft_batch_size, args.sft_steps,
        tokenizer.pad_token_id, bf16, n_params,
    )  # fmt: skip
    grpo_problems = problems[args.prompts :]
    cfg = grpo_config(args, sampler_config)
    trainer = GRPOTrainer(
        policy, tokenizer, cfg, lambda m, s: None, show_progress=False, sampler=engine,
        policy_path=args.model,
    )  # fmt: skip
    trainer.open_sampler(grpo_problems)  # the config's hf sampler when no engine was given
    if engine is not None:
        engine.sync_weights(policy)  # the SFT steps changed the policy
    batches = [
        grpo_problems[i * args.grpo_prompts : (i + 1) * args.grpo_prompts]
        for i in range(args.grpo_steps + 1)
    ]
    grpo = measure_grpo(trainer, batches, lambda q: render_prompt(tokenizer, q), bf16, n_params)
    total = sum(p.numel() for p in policy.parameters())
    header = (
        f"model {args.model}: {count(total)} parameters, {count(n_params)} counted for FLOPs; "
        f"{len(prompts)} prompts x {args.n}, T={args.temperature}, top_p={args.top_p}, "
        f"max_new_tokens={args.max_new_tokens}; GRPO samples with {cfg.sampler.backend}"
    )
    return [vllm, hf, None, sft, grpo], header


def count(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e8 else f"{n / 1e6:.3f} M"


HEAD = ("measurement", "tokens", "seconds", "tokens/s", "model TFLOP/s", "MFU", "notes")
WIDTHS = (20, 8, 8, 9, 13, 6)


def row_cells(name: str, row: Measurement | None, peak: float | None, why: str) -> list[str]:
    if row is None:
        return [name, "-", "-", "-", "-", "-", why]
    mfu = row.mfu(peak)
    return [
        name,
        str(row.tokens),
        f"{row.seconds:.4f}",
        f"{row.tokens_per_second:.1f}",
        f"{row.tflops:.4g}",
        "-" if mfu is None else f"{mfu:.1%}",
        row.note,
    ]


def table(rows: list[Measurement | None], peak: float | None, skip_vllm: bool) -> str:
    """A markdown table; the ratio row compares the two generation rows' tokens/s."""
    vllm, hf = rows[0], rows[1]
    cells = []
    for name, row in zip((*ROWS, "training grpo step"), rows, strict=True):
        if name == "generation vllm / hf":
            ratio = "-"
            if vllm is not None and hf is not None:
                ratio = f"{vllm.tokens_per_second / hf.tokens_per_second:.2f}x"
            cells.append([name, "-", "-", ratio, "-", "-", "tokens/s, vLLM over HF"])
        else:
            why = "skipped (--skip-vllm)" if skip_vllm else "skipped"
            cells.append(row_cells(name, row, peak, why))

    def line(values: list[str] | tuple[str, ...]) -> str:
        first = f"{values[0]:<{WIDTHS[0]}}"
        middle = [f"{v:>{w}}" for v, w in zip(values[1:-1], WIDTHS[1:], strict=True)]
        return "| " + " | ".join([first, *middle, values[-1]]) + " |"

    rule = "|" + "|".join(["-" * (WIDTHS[0] + 2)] + [f"{'-' * (w + 1)}:" for w in WIDTHS[1:]])
    return "\n".join([line(HEAD), rule + "|------|", *(line(c) for c in cells)])


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    preflight(args)
    torch.manual_seed(args.seed)
    rows, header = measure(args)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    peak = args.peak_tflops or (peak_tflops(device_name) if args.device == "cuda" else None)
    known = "unknown: pass --peak-tflops" if peak is None else f"{peak:g} TFLOP/s"
    print(f"device {device_name}, peak bf16 dense {known}")
    print(header)
    print(table(rows, peak, args.skip_vllm))
    print(
        "FLOPs: 2N a generated or prefilled token, 6N a trained token, N without the input "
        "embedding table unless tied; attention score FLOPs and padding not counted."
    )


if __name__ == "__main__":
    main()
