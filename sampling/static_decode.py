"""Decode steps over a static KV cache, replayed as CUDA graphs on a GPU.

On a GPU a decode step of a small model is host-bound: the plain-ops step (sampling/decode_step.py)
launches some twenty kernels a layer from Python, each taking longer to launch than to run, and
the growing, compacting cache (sampling/kv_cache.py) changes every tensor's shape from one step
to the next, so the launches cannot be recorded once and replayed. Here every row keeps its
place for the whole call (finished rows go on decoding, their outputs ignored), each layer's
keys and values live in one buffer of the call's whole length written at a column index held on
the device, and a step reads a fixed span of columns (`SPAN` at a time, the rest masked). A
token's whole step (the model's step, the draw, the record of the row's token and logprob) is
one CUDA graph per span, captured the first time the decode reaches the span and replayed after:
its inputs (the step number, the column, the tokens) live on the device and the graph moves them
on. Nothing is read back to the host each token: finished rows are tracked on the device and
whether all are done is asked every `CHECK_EVERY` steps. With top_p < 1 the draw asks the host
whether every row's nucleus lies among the most likely candidates (sampling/decode.py `nucleus`),
so there only the model's step is a graph and the draw runs as ops after it.

The same loop runs without graphs (on CPU, in the tests): the same tokens as the growing cache's
loop where the logits agree, which they do up to the summation order of the masked columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from sampling.decode_step import DecodeStep
from sampling.streams import uniforms

# Columns a step's attention reads at a time: a graph per span, so a call of W prompt columns
# and T new tokens captures ceil((W + T) / SPAN) graphs at most, and a step reads at most SPAN - 1
# masked columns.
SPAN = 64
# Steps between the checks of whether every row is done (the one read back to the host).
CHECK_EVERY = 16

Choose = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Outputs(Protocol):
    """Per-row results (sampling/decode.py `_Outputs`): tokens and logprobs (B, T), lengths and
    whether each row stopped (B,)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    stopped: torch.Tensor


class _StaticLayer:
    """One layer's keys and values (B, KV, capacity, D); `update` writes the step's column at
    `column` (a device tensor) and returns the first `span` columns."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor, span: int):
        self.keys, self.values, self.column, self.span = keys, values, column, span

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.index_copy_(2, self.column, k)
        self.values.index_copy_(2, self.column, v)
        return self.keys[:, :, : self.span], self.values[:, :, : self.span]


@dataclass
class StaticState:
    """Everything a token's step reads and moves on, on the device: the cache's buffers, the
    tokens fed next and their positions, the cache column they are written to, the step number,
    the additive mask (B, 1, 1, capacity), the rows' random-stream keys and the outputs."""

    keys_values: list[tuple[torch.Tensor, torch.Tensor]]
    tokens: torch.Tensor  # (B,)
    positions: torch.Tensor  # (B,)
    column: torch.Tensor  # (1,)
    step: torch.Tensor  # (1,)
    mask: torch.Tensor  # (B, 1, 1, capacity)
    row_keys: torch.Tensor  # (B,)
    out: Outputs

    @classmethod
    def from_prefill(
        cls, prefilled, prompt_mask: torch.Tensor, positions: torch.Tensor, capacity: int,
        row_keys: torch.Tensor, out: Outputs,
    ) -> StaticState:  # fmt: skip
        """Buffers of `capacity` columns holding the prefilled cache's (growing layers, one row
        per decoded row) and the mask of its prompt columns `prompt_mask` (B, W)."""
        rows, width = prompt_mask.shape
        device = prompt_mask.device
        keys_values = []
        for layer in prefilled.layers:
            k, v = layer.keys, layer.values  # (B, KV, W, D)
            keys = k.new_zeros(rows, k.shape[1], capacity, k.shape[3])
            values = v.new_zeros(rows, v.shape[1], capacity, v.shape[3])
            keys[:, :, :width], values[:, :, :width] = k, v
            keys_values.append((keys, values))
        dtype = keys_values[0][0].dtype
        mask = torch.full(
            (rows, 1, 1, capacity), torch.finfo(dtype).min, dtype=dtype, device=device
        )
        mask[:, 0, 0, :width].masked_fill_(prompt_mask.bool(), 0)
        column = torch.full((1,), width - 1, dtype=torch.long, device=device)
        step = torch.zeros(1, dtype=torch.long, device=device)
        tokens = torch.zeros_like(positions)  # the first draw writes them
        return cls(keys_values, tokens, positions - 1, column, step, mask, row_keys, out)

    def layers(self, span: int) -> list[_StaticLayer]:
        return [_StaticLayer(k, v, self.column, span) for k, v in self.keys_values]


def record_step(out: Outputs, step: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor,
                stop: torch.Tensor, pad_id: int) -> None:  # fmt: skip
    """Column `step` (a (1,) tensor) of every row, nothing read back to the host: a row already
    stopped keeps its pad; a row that samples a stop token now ends with it."""
    done = out.stopped
    out.tokens.index_copy_(1, step, torch.where(done, pad_id, tokens)[:, None])
    out.logprobs.index_copy_(1, step, torch.where(done, 0.0, logprobs)[:, None].to(out.logprobs))
    ends = ~done & (tokens[:, None] == stop[None, :]).any(dim=1)
    out.lengths.copy_(torch.where(ends, step + 1, out.lengths))
    out.stopped |= ends


class StaticDecoder:
    """A token's step over `state`: feed the tokens chosen last (the model's step), then choose
    and record the next (`choose(logits, uniforms)`). With `graphs`, each span's step is a CUDA
    graph, the choice in it when `fused` (no read-back in it), else after it as plain ops."""

    def __init__(self, step: DecodeStep, state: StaticState, choose: Choose, stop: torch.Tensor,
                 pad_id: int, graphs: bool, fused: bool,
                 compiled: bool = False) -> None:  # fmt: skip
        self.model_step = compiled_step(step) if compiled else step
        self.state, self.choose = state, choose
        self.stop, self.pad_id, self.graphs, self.fused = stop, pad_id, graphs, fused
        self._captured: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if graphs else None

    def choose_and_record(self, logits: torch.Tensor) -> None:
        """Draw the next tokens from `logits` at the current step, record them, feed them next."""
        s = self.state
        tokens, logprobs = self.choose(logits, uniforms(s.row_keys, s.step))
        record_step(s.out, s.step, tokens, logprobs, self.stop, self.pad_id)
        s.tokens.copy_(tokens)
        s.step += 1

    def feed(self, span: int) -> torch.Tensor:
        """The model's step on the tokens fed next: written at the next column, attending to
        the first `span` columns; the logits of what follows them."""
        s = self.state
        s.column += 1
        s.positions += 1
        s.mask.index_fill_(3, s.column, 0)
        mask = s.mask[..., :span]
        return self.model_step(s.tokens, s.positions, mask, _Layers(s.layers(span)))  # type: ignore[arg-type]

    def __call__(self, length: int) -> None:
        """One token's step, its attention reading at least `length` columns."""
        span = min(self.state.mask.shape[-1], -(-length // SPAN) * SPAN)
        if not self.graphs:
            self._body(span)
            return
        if span not in self._captured:
            self._captured[span] = self._capture(span)
        graph, logits = self._captured[span]
        graph.replay()
        if not self.fused:
            self.choose_and_record(logits)

    def _body(self, span: int) -> torch.Tensor:
        logits = self.feed(span)
        if self.fused or not self.graphs:
            self.choose_and_record(logits)
        return logits

    def _capture(self, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm up on a side stream, then record one step. The warm-up moves the state on, so
        what it moves is put back first; what it writes (a cache column, a mask column, an
        output column) the replay writes again."""
        s = self.state
        moved = [s.tokens, s.positions, s.column, s.step, s.out.lengths, s.out.stopped]
        saved = [t.clone() for t in moved]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(span)
        torch.cuda.current_stream().wait_stream(side)
        for tensor, value in zip(moved, saved, strict=True):
            tensor.copy_(value)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._body(span)
        return graph, logits


def compiled_step(step: DecodeStep) -> Callable[..., torch.Tensor]:
    """`step` compiled by Inductor, whole: its elementwise ops (RMSNorm, the rotary embedding,
    the mask, softmax, SiLU) fused into a few kernels a layer. Compiled on the first call of each
    span (a CUDA graph's warm-up) until torch's automatic dynamic shapes make the span a
    symbol: a few graphs a call, not one a span (tests/sampling/test_static_decode.py)."""
    return torch.compile(step.__call__, fullgraph=True)


@dataclass
class _Layers:
    """What the plain-ops step reads as its cache: `layers[i].update(k, v)`."""

    layers: list[_StaticLayer]


def static_decode(decoder: StaticDecoder, first_logits: torch.Tensor, max_new_tokens: int) -> None:
    """Fill the decoder's outputs with up to `max_new_tokens` tokens a row (every row decodes
    each step, finished ones too); stop early once every row is done, asked every
    CHECK_EVERY steps."""
    width = int(decoder.state.column.item()) + 1
    decoder.choose_and_record(first_logits)
    for step in range(1, max_new_tokens):
        if step % CHECK_EVERY == 0 and bool(decoder.state.out.stopped.all()):
            break
        decoder(width + step)
