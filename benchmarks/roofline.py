"""What decoding a small model can reach on this machine: the work of a decode run and the
machine's measured limits for it.

- `decode_work`: the floating-point operations of a run, from the model's shapes and each
  completion's prompt and completion length (the linear layers, the LM head and attention over
  the KV cache, with the prompt's prefill counted once per prompt), and the bytes of KV cache
  attention reads.
- `matmul_peak`: fp32 GFLOP/s of a large square `torch.mm` (the usual "peak").
- `linear_peak`: GFLOP/s of the very matmuls a decode step runs, at the step's row count: each
  linear layer of the model and the LM head as `[rows, in] @ [in, out]`. With a hidden size of
  128 these are thin, and the BLAS does not reach the square peak on them.
- `bandwidth`: GB/s of reading a tensor much larger than the caches (attention over the KV cache
  reads each cached key and value once per token and does 2 FLOPs per value read: it is
  bound by memory, not by the matmul peak).

`limits` puts them together as the time each part of the work takes at its limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

BYTES = 4  # fp32


@dataclass(frozen=True)
class Shapes:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: PretrainedConfig) -> Shapes:
        return cls(
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            config.intermediate_size,
            config.vocab_size,
        )

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def linears(self) -> list[tuple[int, int]]:
        """(in, out) of each matmul one token passes through, LM head last."""
        h, kv, i = self.hidden, self.kv_width, self.intermediate
        layer = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]
        return layer * self.layers + [(h, self.vocab)]

    def linear_flops(self) -> int:
        """FLOPs of one token through every linear layer and the LM head."""
        return sum(2 * a * b for a, b in self.linears())

    def attention_flops(self, context: int) -> int:
        """FLOPs of one token's attention over `context` cached positions, all layers (scores
        and the weighted sum of values)."""
        return 4 * self.hidden * context * self.layers

    def attention_bytes(self, context: int) -> int:
        """Bytes of cached keys and values one token's attention reads, all layers."""
        return 2 * self.kv_width * context * self.layers * BYTES


@dataclass(frozen=True)
class Work:
    tokens: int  # tokens through the model: prompts once each, every completion token
    linear_flops: int
    attention_flops: int
    attention_bytes: int

    @property
    def flops(self) -> int:
        return self.linear_flops + self.attention_flops


def _positions(start: int, count: int) -> int:
    """Sum of the context lengths start+1 ... start+count seen by `count` successive tokens."""
    return count * start + count * (count + 1) // 2


def decode_work(
    shapes: Shapes, prompt_lengths: Sequence[int], samples: Sequence[Sequence[int]]
) -> Work:
    """The useful work of decoding `samples[p]` (completion lengths) for prompt p of
    `prompt_lengths` tokens, as the decode loop does it: each prompt prefilled once (the LM head
    on its last position only), each completion token through every layer and the LM head and
    attending to its prompt and the tokens before it. Padding and finished rows still in the
    batch are not counted: they are overhead, not work."""
    head = 2 * shapes.hidden * shapes.vocab
    body = shapes.linear_flops() - head
    tokens = linear = contexts = 0
    for prompt, lengths in zip(prompt_lengths, samples, strict=True):
        tokens += prompt + sum(lengths)
        linear += prompt * body + head + sum(lengths) * (body + head)
        contexts += _positions(0, prompt) + sum(_positions(prompt, n) for n in lengths)
    return Work(
        tokens, linear, shapes.attention_flops(1) * contexts, shapes.attention_bytes(1) * contexts
    )


def _best_seconds(fn: Callable[[], object], repeats: int, inner: int) -> float:
    fn()  # warm
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - began) / inner)
    return best


def matmul_peak(size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of a square fp32 `torch.mm` of `size` (best of `repeats`)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / _best_seconds(lambda: torch.mm(a, b), repeats, 1) / 1e9


def linear_peak(shapes: Shapes, rows: int, repeats: int = 5, inner: int = 20) -> float:
    """GFLOP/s of one decode step's matmuls at `rows` rows, each as a plain `torch.mm`."""
    pairs = [(torch.randn(rows, a), torch.randn(a, b)) for a, b in shapes.linears()]

    def step() -> None:
        for x, w in pairs:
            torch.mm(x, w)

    return rows * shapes.linear_flops() / _best_seconds(step, repeats, inner) / 1e9


def bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """GB/s of summing a tensor of `megabytes`, far larger than the caches."""
    x = torch.ones(megabytes * 2**20 // BYTES)
    return x.numel() * BYTES / _best_seconds(lambda: x.sum(), repeats, 1) / 1e9


@dataclass(frozen=True)
class Limits:
    matmul_peak: float  # GFLOP/s
    linear_peak: float  # GFLOP/s at the decode step's shapes
    bandwidth: float  # GB/s

    def floor_seconds(self, work: Work) -> float:
        """The run's time if its linears ran at the shape peak and attention at the bandwidth,
        and nothing else took time."""
        return work.linear_flops / (self.linear_peak * 1e9) + work.attention_bytes / (
            self.bandwidth * 1e9
        )


def limits(shapes: Shapes, rows: int) -> Limits:
    return Limits(matmul_peak(), linear_peak(shapes, rows), bandwidth())


def report(work: Work, seconds: float, machine: Limits) -> list[str]:
    """Lines that set a run's achieved rate against the machine's limits."""
    achieved = work.flops / seconds / 1e9
    floor = machine.floor_seconds(work)
    return [
        f"work: {work.tokens:,} tokens, {work.flops / 1e9:.1f} GFLOP "
        f"({work.linear_flops / work.flops:.0%} in linear layers and the LM head), "
        f"{work.attention_bytes / 1e9:.1f} GB of KV cache read by attention",
        f"achieved: {achieved:.1f} GFLOP/s = {achieved / machine.matmul_peak:.0%} of the square "
        f"matmul peak ({machine.matmul_peak:.0f} GFLOP/s)",
        f"the decode step's own matmuls peak at {machine.linear_peak:.0f} GFLOP/s "
        f"({machine.linear_peak / machine.matmul_peak:.0%} of the square peak); memory "
        f"{machine.bandwidth:.1f} GB/s",
        f"floor (linears at their peak, attention at the bandwidth, nothing else): "
        f"{floor:.2f} s against {seconds:.2f} s measured, {floor / seconds:.0%} of it",
    ]
