"""Where an SFT step's time goes on a GPU, against the plain transformers loop (the GPU check's
peer): the same step of our stack with one thing changed at a time, the loss's head alone, and the
CUDA kernels that take the step's time.

    python -m benchmarks.sft_breakdown            # Qwen2.5-0.5B's shape, 32 x 512 tokens, CUDA

Variants (each on a fresh model, one warm-up step, then `--steps` timed): DeepSpeed ZeRO-2 with
the varlen kernel (what the GPU profile runs), with FlexAttention, with 4 GiB logits chunks;
our stepper on a bf16 model with fused AdamW and no DeepSpeed (the peer's optimizer under our
attention and loss); ZeRO-3 without checkpointing. Then the chunked head's loss against
transformers' own (linear, upcast, cross-entropy) on one micro-batch's hidden states, and
torch's profiler over one ZeRO-2 step.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from collections.abc import Callable

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from benchmarks.gpu_check import SHAPES, start_rank, word_tokenizer  # noqa: E402
from benchmarks.gpu_phases import Setting  # noqa: E402
from benchmarks.throughput import flop_parameters, peak_tflops, training_flops  # noqa: E402
from configs.supervised import EngineConfig, TrainConfig  # noqa: E402
from models.loading import build_model  # noqa: E402
from training.collective import TorchCollective  # noqa: E402
from training.engines import DeepSpeedEngine, LocalEngine  # noqa: E402
from training.examples import Example  # noqa: E402
from training.logits import chunked_nll  # noqa: E402
from training.supervised import SFTStepper  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def examples(vocab: int, rows: int, length: int, steps: int) -> list[Example]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(rows * (steps + 1)):
        ids = torch.randint(8, vocab, (length,), generator=gen).tolist()
        out.append(Example(ids, [-100] * 64 + ids[64:]))
    return out


def step_seconds(engine, memory: EngineConfig, data, rows: int, steps: int, pad: int) -> float:
    cfg = TrainConfig(batch_size=rows, epochs=1, warmup_steps=0, learning_rate=1e-5)
    stepper = SFTStepper(engine, data, cfg, pad, "breakdown", TorchCollective(), memory=memory)
    stepper.start(0)
    stepper.run_step(0)
    sync()
    began = time.perf_counter()
    for i in range(1, steps + 1):
        stepper.run_step(i)
    sync()
    return (time.perf_counter() - began) / steps


def variant(name: str, run: Callable[[], float], tokens: int, flops: float, peak: float) -> None:
    try:
        seconds = run()
        print(f"{name:44} {1e3 * seconds:8.1f} ms/step {tokens / seconds:10,.0f} tok/s  "
              f"MFU {flops / seconds / 1e12 / peak:6.1%}", flush=True)  # fmt: skip
    except Exception:
        print(f"{name:44} FAILED {traceback.format_exc(limit=3)}", flush=True)
    finally:
        os.environ.pop("R1_PACKED_ATTENTION", None)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def loss_head(vocab: int, tokens: int, hidden: int, device: str, repeats: int = 5) -> None:
    """The chunked head's cross-entropy against transformers' path, forward and backward."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    head = torch.nn.Linear(hidden, vocab, bias=False, device=device, dtype=dtype)
    h = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,), device=device)

    def plain() -> None:
        loss = torch.nn.functional.cross_entropy(head(h).float(), targets, reduction="sum")
        loss.backward()

    for name, fn, chunk_mb in (
        ("loss: transformers (linear, upcast, CE)", plain, None),
        ("loss: chunked head, 1 GiB chunks", None, 1024),
        ("loss: chunked head, 4 GiB chunks", None, 4096),
    ):
        chunk = int(chunk_mb * 2**20 / 4) // vocab if chunk_mb else 0

        def run(fn=fn, chunk=chunk) -> None:
            (fn or (lambda: chunked_nll(head, h, targets, chunk).backward()))()

        run()
        sync()
        began = time.perf_counter()
        for _ in range(repeats):
            run()
        sync()
        ms = 1e3 * (time.perf_counter() - began) / repeats
        tflops = 6 * tokens * hidden * vocab / (ms * 1e-3) / 1e12
        print(f"{name:44} {ms:8.1f} ms     {tflops:7.1f} TFLOP/s", flush=True)


def profile_step(engine, memory, data, rows: int, pad: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    cfg = TrainConfig(batch_size=rows, epochs=1, warmup_steps=0, learning_rate=1e-5)
    stepper = SFTStepper(engine, data, cfg, pad, "profile", TorchCollective(), memory=memory)
    stepper.start(0)
    stepper.run_step(0)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        stepper.run_step(1)
        sync()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start_rank(device)
    spec, vocab = SHAPES[args.shape]
    tokenizer = word_tokenizer(vocab)
    pad = tokenizer.pad_token_id
    data = examples(vocab, args.rows, args.length, args.steps)
    probe = build_model(spec, vocab, pad, tokenizer.eos_token_id, 0)
    n, config = flop_parameters(probe), probe.config
    del probe
    tokens = args.rows * args.length
    flops = training_flops(n, config, [args.length] * args.rows)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = peak_tflops(name) or 989.4
    zero2 = Setting(device, 2, False, "auto", 1024.0).engine()

    def deepspeed(engine_cfg: EngineConfig, kernel: str | None = None) -> float:
        if kernel:
            os.environ["R1_PACKED_ATTENTION"] = kernel
        model = build_model(spec, vocab, pad, tokenizer.eos_token_id, 0)
        engine = DeepSpeedEngine(model, 1e-5, 1.0, engine_cfg, world=1)
        try:
            return step_seconds(engine, engine_cfg, data, args.rows, args.steps, pad)
        finally:
            engine.close()

    def local() -> float:
        model = build_model(spec, vocab, pad, tokenizer.eos_token_id, 0)
        model = model.to(device=device, dtype=torch.bfloat16 if device == "cuda" else None)
        engine = LocalEngine(model, 1e-5, 1.0)
        return step_seconds(engine, zero2, data, args.rows, args.steps, pad)

    chunks4 = zero2.model_copy(update={"logits_chunk_mb": 4096.0})
    zero3 = zero2.model_copy(update={"zero_stage": 3})
    variant("deepspeed zero-2, varlen", lambda: deepspeed(zero2), tokens, flops, peak)
    variant("deepspeed zero-2, flex", lambda: deepspeed(zero2, "flex"), tokens, flops, peak)
    variant(
        "deepspeed zero-2, varlen, 4 GiB chunks", lambda: deepspeed(chunks4), tokens, flops, peak
    )
    variant("no deepspeed: bf16 weights, fused AdamW", local, tokens, flops, peak)
    variant("deepspeed zero-3, no checkpointing", lambda: deepspeed(zero3), tokens, flops, peak)
    loss_head(vocab, tokens, spec.hidden_size, device)
    model = build_model(spec, vocab, pad, tokenizer.eos_token_id, 0)
    engine = DeepSpeedEngine(model, 1e-5, 1.0, zero2, world=1)
    profile_step(engine, zero2, data, args.rows, pad)
    engine.close()
    del engine, model
    gc.collect()
    if device != "cuda":
        return 0
    torch.cuda.empty_cache()
    held = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    print(f"held after the last engine closed: {held / 2**30:.3f} GiB, without cuBLAS's "
          f"workspaces {torch.cuda.memory_allocated() / 2**30:.3f} GiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
