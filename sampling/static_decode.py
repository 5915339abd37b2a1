"""Decode steps over a static KV cache, replayed as CUDA graphs on a GPU.

On a GPU a decode step of a small model is host-bound: the plain-ops step (sampling/decode_step.py)
launches some twenty kernels a layer from Python, each taking longer to launch than to run, and
the growing, compacting cache (sampling/kv_cache.py) changes every tensor's shape from one step
to the next, so the launches cannot be recorded once and replayed. Here every row keeps its
place for the whole call (finished rows go on decoding, their outputs ignored), each layer's
keys and values live in one buffer of the call's whole length written at a column index held on
the device, and a step reads a fixed span of columns (`SPAN` at a time, the rest masked): one
CUDA graph per span, captured the first time the decode reaches it and replayed after. Nothing
reads a value back to the host each token: finished rows are tracked on the device, and whether
all are done is asked every `CHECK_EVERY` steps. Sampling itself (sampling/decode.py
`choose_tokens`) runs as plain ops between replays; with top_p < 1 it asks once a step whether
every row's nucleus lies among the most likely candidates.

The same loop runs without graphs (on CPU, in the tests): the same tokens as `decode` where the
logits agree, which they do up to the summation order of the masked columns' zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from sampling.decode_step import DecodeStep

# Columns a step's attention reads at a time: a graph per span, so a call of W prompt columns
# and T new tokens captures ceil((W + T) / SPAN) graphs at most, and a step reads at most SPAN - 1
# masked columns.
SPAN = 64
# Steps between the checks of whether every row is done (the one read back to the host).
CHECK_EVERY = 16


class _StaticLayer:
    """One layer's keys and values (B, KV, capacity, D); `update` writes the step's column at
    `column` (a device tensor) and returns the first `span` columns."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor):
        self.keys, self.values, self.column, self.span = keys, values, column, keys.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.index_copy_(2, self.column, k)
        self.values.index_copy_(2, self.column, v)
        return self.keys[:, :, : self.span], self.values[:, :, : self.span]


@dataclass
class StaticCache:
    """What a static decode step reads and writes: the cache, the step's inputs, its mask."""

    layers: list[_StaticLayer]
    tokens: torch.Tensor  # (B,) the tokens fed next
    positions: torch.Tensor  # (B,) their position ids
    column: torch.Tensor  # (1,) the cache column they are written to
    mask: torch.Tensor  # (B, 1, 1, capacity) additive: 0 where a row attends

    @classmethod
    def from_prefill(cls, prefilled, prompt_mask: torch.Tensor, positions: torch.Tensor,
                     capacity: int, dtype: torch.dtype) -> StaticCache:  # fmt: skip
        """Buffers of `capacity` columns holding the prefilled cache's (growing layers, rows
        already one per decoded row) and the mask of its prompt columns `prompt_mask` (B, W)."""
        rows, width = prompt_mask.shape
        column = torch.full((1,), width, dtype=torch.long, device=prompt_mask.device)
        layers = []
        for layer in prefilled.layers:
            k, v = layer.keys, layer.values  # (B, KV, W, D)
            keys = k.new_zeros(rows, k.shape[1], capacity, k.shape[3])
            values = v.new_zeros(rows, v.shape[1], capacity, v.shape[3])
            keys[:, :, :width], values[:, :, :width] = k, v
            layers.append(_StaticLayer(keys, values, column))
        mask = torch.full((rows, 1, 1, capacity), torch.finfo(dtype).min, dtype=dtype,
                          device=prompt_mask.device)  # fmt: skip
        mask[:, 0, 0, :width].masked_fill_(prompt_mask.bool(), 0)
        return cls(layers, positions.clone(), positions.clone(), column, mask)

    def spanned(self, span: int) -> StaticCache:
        """A view of the same buffers whose steps read the first `span` columns."""
        layers = [_StaticLayer(x.keys, x.values, self.column) for x in self.layers]
        for layer in layers:
            layer.span = span
        return StaticCache(layers, self.tokens, self.positions, self.column,
                           self.mask[..., :span])  # fmt: skip


class StaticStepper:
    """The next logits (B, V) for `cache.tokens` at `cache.positions`, written at `cache.column`:
    each span's step captured as a CUDA graph on its first use when `graphs`, else run as ops."""

    def __init__(self, step: DecodeStep, cache: StaticCache, graphs: bool):
        self.step, self.cache, self.graphs = step, cache, graphs
        self._captured: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if graphs else None

    def __call__(self, length: int) -> torch.Tensor:
        """The step's logits, its attention reading at least `length` columns."""
        capacity = self.cache.mask.shape[-1]
        span = min(capacity, -(-length // SPAN) * SPAN)
        if not self.graphs:
            return self._run(self.cache.spanned(span))
        if span not in self._captured:
            self._captured[span] = self._capture(self.cache.spanned(span))
        graph, logits = self._captured[span]
        graph.replay()
        return logits

    def _run(self, view: StaticCache) -> torch.Tensor:
        return self.step(view.tokens, view.positions, view.mask, view)  # type: ignore[arg-type]

    def _capture(self, view: StaticCache) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm up on a side stream (the column written is the step's own, written again by the
        replay with the same values), then record one step."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(view)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._run(view)
        return graph, logits


class Outputs(Protocol):
    """Per-row results (sampling/decode.py `_Outputs`): tokens and logprobs (B, T), lengths and
    whether each row stopped (B,)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    stopped: torch.Tensor


def record_step(out: Outputs, step: int, tokens: torch.Tensor, logprobs: torch.Tensor,
                stop: torch.Tensor, pad_id: int) -> None:  # fmt: skip
    """Column `step` of every row, nothing read back to the host: a row already stopped keeps
    its pad; a row that samples a stop token now ends with it."""
    done = out.stopped
    out.tokens[:, step] = torch.where(done, pad_id, tokens)
    out.logprobs[:, step] = torch.where(done, 0.0, logprobs)
    ends = ~done & torch.isin(tokens, stop)
    out.lengths.masked_fill_(ends, step + 1)
    out.stopped |= ends


def static_decode(
    stepper: StaticStepper,
    first_logits: torch.Tensor,
    choose: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
    out: Outputs,
    stop: torch.Tensor,
    pad_id: int,
    max_new_tokens: int,
) -> None:
    """Fill `out` with up to `max_new_tokens` tokens a row: `choose(logits, step)` samples,
    `stepper` decodes the sampled tokens (every row, finished ones too)."""
    cache = stepper.cache
    width = int(cache.column.item())
    logits = first_logits
    for step in range(max_new_tokens):
        tokens, logprobs = choose(logits, step)
        record_step(out, step, tokens, logprobs, stop, pad_id)
        if step + 1 == max_new_tokens:
            break
        if (step + 1) % CHECK_EVERY == 0 and bool(out.stopped.all()):
            break
        cache.tokens.copy_(tokens)
        cache.mask[:, 0, 0, width + step] = 0
        logits = stepper(width + step + 1)
        cache.positions += 1
        cache.column += 1
