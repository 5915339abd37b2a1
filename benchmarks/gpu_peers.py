"""The GPU check's yardsticks (benchmarks/gpu_check.py): the packed-attention kernels side by
side, and the plainest SFT loop a user could write, run on the same device in the same run.

- `attention_bench`: one packed micro-batch's attention, forward and backward, through each
  kernel of training/varlen.py (per-sequence SDPA, torch's varlen FlashAttention, compiled
  FlexAttention with a document mask) and, as the padded loop pays it, one SDPA call over
  padded rows; each kernel's output and gradients against the per-sequence kernel's.
- `plain_loop`: transformers with SDPA, bf16 weights, fused AdamW, padded batches, no packing,
  no DeepSpeed: the peer our SFT step is measured against, on the same rows in the same batches
  (benchmarks/gpu_shapes.py), counted the same way.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.gpu_profile import profile_step
from benchmarks.gpu_shapes import SFTCase, count_batches, loss_positions
from benchmarks.throughput import attention_flops
from models.loading import build_model
from training.batches import collate
from training.examples import Example
from training.varlen import NAMES, flex_attention, per_sequence_attention, varlen_attention


@dataclass
class KernelRow:
    name: str
    ok: bool = False
    milliseconds: float = 0.0
    tflops: float = 0.0
    max_output_error: float = 0.0  # |out - per_sequence's| / |per_sequence's|, largest element
    gradient_error: float = 0.0  # relative L2 error of q, k and v's gradients, largest
    error: str = ""


def _timed(device: torch.device, run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up: kernels, compilation
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(repeats):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - began) / repeats


def attention_bench(
    config, lengths: list[int], device: torch.device, dtype: torch.dtype, repeats: int = 10,
    kernels: tuple[str, ...] = ("per_sequence", "varlen", "flex", "padded"),
) -> list[KernelRow]:  # fmt: skip
    """Forward and backward of one packed row of sequences of `lengths` through each kernel."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    total = sum(lengths)
    generator = torch.Generator(device="cpu").manual_seed(0)

    def leaf(h: int) -> torch.Tensor:
        x = torch.randn(1, h, total, head_dim, generator=generator, dtype=torch.float32)
        return x.to(device=device, dtype=dtype).requires_grad_()

    q, k, v = leaf(heads), leaf(kv), leaf(kv)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    upstream = torch.randn(1, total, heads, head_dim, generator=generator).to(device, dtype)
    module = torch.nn.Module()
    functions = {
        "per_sequence": per_sequence_attention, "varlen": varlen_attention, "flex": flex_attention,
    }  # fmt: skip
    reference = _forward_backward(per_sequence_attention, module, q, k, v, positions, upstream)
    rows = []
    for name in kernels:
        row = KernelRow(NAMES.get(name, name))
        try:
            if name == "padded":
                run = _padded_runner(q, k, v, lengths, upstream)
            else:
                fn = functions[name]

                def run(fn=fn):
                    return _forward_backward(fn, module, q, k, v, positions, upstream)

            out = run()
            row.milliseconds = 1e3 * _timed(device, run, repeats)
            row.tflops = attention_flops(config, lengths) / config.num_hidden_layers
            row.tflops /= row.milliseconds * 1e-3 * 1e12
            if name != "padded":
                row.max_output_error = _relative(out[0], reference[0], norm=False)
                row.gradient_error = max(
                    _relative(a, b) for a, b in zip(out[1:], reference[1:], strict=True)
                )
            row.ok = True
        except Exception:
            row.error = traceback.format_exc(limit=3)
        rows.append(row)
    return rows


def _forward_backward(fn, module, q, k, v, positions, upstream) -> list[torch.Tensor]:
    for x in (q, k, v):
        x.grad = None
    out, _ = fn(module, q, k, v, None, scaling=q.shape[-1] ** -0.5, position_ids=positions)
    out.backward(upstream)
    return [out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()]


def _padded_runner(q, k, v, lengths, upstream):
    """What the padded loop runs: rows of equal length in one SDPA call (only when they are)."""
    if len(set(lengths)) != 1:
        raise ValueError("padded rows are timed for sequences of one length")
    n, s = len(lengths), lengths[0]

    def rows(x: torch.Tensor) -> torch.Tensor:  # (1, H, n*s, D) -> (n, H, s, D)
        return x.detach()[0].unflatten(1, (n, s)).transpose(0, 1).contiguous().requires_grad_()

    qs, ks, vs = rows(q), rows(k), rows(v)
    grad = upstream[0].unflatten(0, (n, s)).transpose(1, 2)  # (n, H, s, D)

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, enable_gqa=True
        )
        out.backward(grad)
        return [out]

    return run


def _relative(a: torch.Tensor, b: torch.Tensor, norm: bool = True) -> float:
    a, b = a.float(), b.float()
    if norm:
        return float((a - b).norm() / b.norm().clamp_min(1e-12))
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@dataclass
class LoopRow:
    name: str
    ok: bool = False
    tokens: int = 0  # content positions (padding not counted)
    seconds: float = 0.0
    flops: float = 0.0
    peak_bytes: int | None = None
    note: str = ""
    error: str = ""
    extra: dict = field(default_factory=dict)
    steps: int = 0
    loss_tokens: int = 0  # positions that carry loss
    loss_flops: float = 0.0  # the FLOPs counted over them (benchmarks/throughput.py)
    padded_positions: int = 0  # positions the padded rows ran, padding included
    profile: dict = field(default_factory=dict)  # one step under the profiler (gpu_profile.py)


def plain_loop(
    spec, vocab: int, device: torch.device, case: SFTCase, batches: list[list[Example]],
    steps: int, budget: int, n_flop: int, n_head: int,
) -> LoopRow:  # fmt: skip
    """Plain transformers SFT steps (bf16 weights, SDPA over rows right-padded to the longest of
    their micro-batch, fused AdamW, no DeepSpeed) on `batches` as our SFT phase takes them: the
    first a warm-up, the next `steps` timed, the one after them under the profiler. A step runs
    as one batch when its padded rows hold at most `budget` positions, else as gradient-
    accumulation micro-batches of equal rows within it (as a user sizes a plain loop to the
    card), the loss over the whole step's targets."""
    row = LoopRow(f"plain loop {case.name}")
    try:
        _run_plain_loop(row, spec, vocab, device, batches, steps, budget, n_flop, n_head)
        row.ok = True
    except Exception:
        row.error = traceback.format_exc(limit=4)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def micro_rows(batch: list[Example], budget: int) -> list[list[Example]]:
    """`batch` cut into the fewest runs of near-equal numbers of consecutive rows whose padded
    rows hold at most `budget` positions each (a row longer than `budget` runs alone)."""
    longest = max(len(e.input_ids) for e in batch)
    parts = min(len(batch), max(1, -(-len(batch) * longest // budget)))
    while parts < len(batch) and any(
        len(part) * max(len(e.input_ids) for e in part) > budget for part in _split(batch, parts)
    ):
        parts += 1
    return _split(batch, parts)


def _split(batch: list[Example], parts: int) -> list[list[Example]]:
    size, extra = divmod(len(batch), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        out.append(batch[start:end])
        start = end
    return out


def _padded_inputs(rows: list[Example], pad_id: int, device: torch.device) -> dict:
    """One row per example, right-padded to the longest; the attention mask only where a row
    is padded (transformers drops an all-ones mask for the causal kernel anyway)."""
    inputs = collate(rows, pad_id)
    if bool(inputs["attention_mask"].all()):
        del inputs["attention_mask"]
    return {key: value.to(device) for key, value in inputs.items()}


def _run_plain_loop(
    row: LoopRow, spec, vocab: int, device: torch.device, batches: list[list[Example]],
    steps: int, budget: int, n_flop: int, n_head: int,
) -> None:  # fmt: skip
    with torch.device(device):  # the weights made where they train
        model = build_model(spec, vocab, 0, 1, 0).to(dtype=torch.bfloat16)
    model.set_attn_implementation("sdpa")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda" or None)
    padded = [0]

    def step(batch: list[Example]) -> None:
        targets = sum(loss_positions(e) for e in batch)
        for part in micro_rows(batch, budget):
            inputs = _padded_inputs(part, 0, device)
            padded[0] += inputs["input_ids"].numel()
            model(**inputs, num_items_in_batch=targets, use_cache=False).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(batches[0])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    padded[0] = 0
    row.seconds = _timed_once(device, lambda: [step(b) for b in batches[1 : steps + 1]])
    if device.type == "cuda":
        row.peak_bytes = int(torch.cuda.max_memory_allocated())
    row.padded_positions = padded[0]
    row.profile = profile_step(device, lambda: step(batches[steps + 1]))
    count = count_batches(batches[1 : steps + 1], n_flop, n_head, model.config)
    row.steps, row.tokens, row.flops = steps, count.tokens, count.flops
    row.loss_tokens, row.loss_flops = count.loss_tokens, count.loss_flops
    pads = 1 - count.tokens / max(1, padded[0])
    row.note = (
        f"{steps} steps; SDPA, bf16 weights, fused AdamW, padded rows ({pads:.0%} of "
        f"{padded[0] // steps:,} positions a step padding)"
    )


def _timed_once(device: torch.device, run: Callable[[], object]) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began
