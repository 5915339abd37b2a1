"""Attention over packed sequences: each sequence of a row attends to itself only, with no padding.

A packed batch is one row of sequences laid end to end, position ids restarting at each
(training/batches.py `pack`, rl/rollouts.py `pack_policy_batch`). Given such a row under SDPA,
transformers builds a causal mask the size of the whole row squared, block-diagonal, and the
kernel attends over all of it. Here one of three kernels runs the row instead, each attending
within the sequences; the loss and gradients are those of each sequence run alone
(tests/training/test_packing.py):

- `varlen`: torch's variable-length FlashAttention (`torch.nn.attention.varlen.varlen_attn`),
  the whole row in one call per layer from the sequences' cumulative lengths. CUDA only: the
  default there.
- `flex`: FlexAttention with a document mask (the mask's blocks outside every sequence are
  skipped), compiled. Measured against `varlen` by the GPU check (docs/gpu.md).
- `per_sequence`: the row's query, key and value split at the restarts, each piece through SDPA
  with the causal mask built in, the outputs joined again: one SDPA call per sequence. The
  default on CPU, where it is exactly the reference and the cost of a call is small.

The cumulative lengths come from the position ids, once per row, before the first layer: a
forward pre-hook on the decoder finds them (a device sync) and hands them to every layer as the
attention's arguments (`cu_seq_lens_q`, `max_length_q`, transformers' names for them; the flex
kernel's block mask as `packed_block_mask`), so that a compiled layer is one graph with no sync
in it (`engine.compile`). A checkpointed layer recomputed in the backward pass gets the same
arguments. Called without the hook, the kernels find the bounds themselves (`row_bounds`, kept
per position-ids tensor); the per-sequence kernel always does (its pieces' lengths are host
integers), which is why it is CPU's kernel and not one to compile.

`packed_attention(model)` switches an SDPA or eager model to the kernel for the forward passes in
its block and back after. Models on other implementations (flash-attention reads the restarts
itself) and models with sliding-window layers (by `layer_types`, or one `sliding_window` for all,
as Mistral and Phi-3 declare it) are left alone: transformers' own masks attend within each
sequence and its window.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

Kernel = Literal["auto", "per_sequence", "varlen", "flex"]
NAME = "sdpa_per_sequence"  # the per-sequence kernel's registered name
NAMES = {"per_sequence": NAME, "varlen": "packed_varlen", "flex": "packed_flex"}


def sequence_lengths(position_ids: torch.Tensor) -> list[int]:
    """Lengths of the sequences of a packed row, from its position ids (1, T) that restart at 0."""
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("a packed row's position ids start at 0")
    ends = [*starts[1:], position_ids.shape[1]]
    return [end - start for start, end in zip(starts, ends, strict=True)]


@dataclass(frozen=True)
class RowBounds:
    """A packed row's sequences: their lengths, cumulative starts (N + 1,) on the row's device
    as int32, and the longest."""

    lengths: list[int]
    cumulative: torch.Tensor
    longest: int

    @classmethod
    def of(cls, position_ids: torch.Tensor) -> RowBounds:
        lengths = sequence_lengths(position_ids.view(1, -1))
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        cumulative = torch.tensor(starts, dtype=torch.int32, device=position_ids.device)
        return cls(lengths, cumulative, max(lengths))


class _BoundsCache:
    """The bounds of the last few rows, keyed by their position-ids tensor (held weakly): every
    layer of a pass reads the same tensor, and finding the restarts costs a device sync."""

    def __init__(self, size: int = 4):
        self.size = size
        self.entries: dict[int, tuple[weakref.ref, RowBounds]] = {}
        self.lock = threading.Lock()  # a checkpointed layer recomputes on autograd's thread

    def get(self, position_ids: torch.Tensor) -> RowBounds:
        key = id(position_ids)
        with self.lock:
            hit = self.entries.get(key)
            if hit is not None and hit[0]() is position_ids:
                return hit[1]
        bounds = RowBounds.of(position_ids)
        with self.lock:
            if len(self.entries) >= self.size:
                self.entries.pop(next(iter(self.entries)))
            self.entries[key] = (weakref.ref(position_ids), bounds)
        weakref.finalize(position_ids, self.forget, key)  # no device tensor outlives its row
        return bounds

    def forget(self, key: int) -> None:
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None and entry[0]() is None:
                del self.entries[key]


row_bounds = _BoundsCache().get


def _one_packed_row(query, key, attention_mask, position_ids) -> bool:
    return (
        attention_mask is None
        and position_ids is not None
        and query.shape[0] == 1
        and query.shape[2] == key.shape[2] == position_ids.shape[-1]
    )


def per_sequence_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, H, T, D)
    key: torch.Tensor,  # (1, KV, T, D)
    value: torch.Tensor,  # (1, KV, T, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns (1, T, H, D) like SDPA's.

    Anything but one packed row with no mask and no cache goes to SDPA as usual."""
    if not _one_packed_row(query, key, attention_mask, position_ids):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    assert position_ids is not None
    lengths = row_bounds(position_ids).lengths
    # split, not slices: the backward of a split joins the pieces' gradients in one copy
    pieces = zip(
        query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2), strict=True
    )
    out = torch.cat(
        [
            F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=True
            )
            for q, k, v in pieces
        ],
        dim=2,
    )  # (1, H, T, D)
    return out.transpose(1, 2).contiguous(), None


_GQA_FLAG: dict[str, bool] | None = None  # read once, outside any compiled graph


def _varlen_gqa_flag() -> dict[str, bool]:
    """torch 2.13's varlen_attn asks for `enable_gqa` when key and value have fewer heads than
    the query; 2.11's has no such argument and hands the heads to FlashAttention, which groups
    them itself."""
    global _GQA_FLAG
    if _GQA_FLAG is None:
        from torch.nn.attention.varlen import varlen_attn

        wanted = "enable_gqa" in inspect.signature(varlen_attn).parameters
        _GQA_FLAG = {"enable_gqa": True} if wanted else {}
    return _GQA_FLAG


def varlen_available(device: torch.device) -> bool:
    """Whether torch's variable-length FlashAttention runs here: a CUDA device of compute
    capability 8.0 or above (FlashAttention 2's) and a torch that has it. False where torch has
    no CUDA or finds no device (a CUDA build of torch on a machine without a GPU)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 8


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, H, T, D)
    key: torch.Tensor,  # (1, KV, T, D)
    value: torch.Tensor,  # (1, KV, T, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """A packed row in one variable-length FlashAttention call (no dropout); (1, T, H, D)."""
    if not _one_packed_row(query, key, attention_mask, position_ids) or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    from torch.nn.attention.varlen import varlen_attn

    cumulative, longest = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cumulative is None or longest is None:  # called without the decoder's hook
        assert position_ids is not None
        bounds = row_bounds(position_ids)
        cumulative, longest = bounds.cumulative, bounds.longest
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (T, heads, D)
    out = varlen_attn(
        q, k, v, cumulative, cumulative, longest, longest,
        scale=scaling, window_size=(-1, 0), **_varlen_gqa_flag(),
    )  # fmt: skip
    return out[None], None  # (1, T, H, D)


def _raw_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


@functools.cache
def _compiled_flex():
    return torch.compile(_raw_flex())


class _FlexMasks:
    """The block mask of the last row (document-causal), built once per row like its bounds."""

    def __init__(self) -> None:
        self.key: tuple[weakref.ref, object] | None = None
        self.lock = threading.Lock()

    def get(self, position_ids: torch.Tensor):
        from torch.nn.attention.flex_attention import create_block_mask

        with self.lock:
            if self.key is not None and self.key[0]() is position_ids:
                return self.key[1]
        document = (position_ids.view(-1) == 0).cumsum(0)  # (T,) which sequence each token is in

        def same_sequence_causal(b, h, q, kv):
            return (document[q] == document[kv]) & (q >= kv)

        length = position_ids.shape[-1]
        mask = create_block_mask(
            same_sequence_causal, None, None, length, length, device=position_ids.device
        )
        with self.lock:
            self.key = (weakref.ref(position_ids), mask)
        weakref.finalize(position_ids, self.forget)
        return mask

    def forget(self) -> None:
        with self.lock:
            if self.key is not None and self.key[0]() is None:
                self.key = None


_flex_masks = _FlexMasks()


def flex_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, H, T, D)
    key: torch.Tensor,  # (1, KV, T, D)
    value: torch.Tensor,  # (1, KV, T, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """A packed row through compiled FlexAttention with a document-causal block mask."""
    if not _one_packed_row(query, key, attention_mask, position_ids) or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    mask = kwargs.get("packed_block_mask")
    if mask is None:  # called without the decoder's hook
        assert position_ids is not None
        mask = _flex_masks.get(position_ids)
    # inside a compiled layer the layer's graph takes flex attention in; else its own compile
    flex = _raw_flex() if torch.compiler.is_compiling() else _compiled_flex()
    out = flex(
        query, key, value, block_mask=mask, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def per_sequence_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs):
    """No mask for a packed row (the kernel reads its bounds); SDPA's mask for anything padded."""
    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


for _kernel, _function in (
    ("per_sequence", per_sequence_attention),
    ("varlen", varlen_attention),
    ("flex", flex_attention),
):
    AttentionInterface.register(NAMES[_kernel], _function)
    AttentionMaskInterface.register(NAMES[_kernel], per_sequence_mask)


OVERRIDE = "R1_PACKED_ATTENTION"  # names the kernel `auto` picks (per_sequence, varlen, flex)


def choose_kernel(device: torch.device, kernel: Kernel = "auto") -> str:
    """The kernel for a model on `device`: `varlen` on a GPU that runs it, else `per_sequence`
    (or what $R1_PACKED_ATTENTION names); an explicit choice that cannot run here is refused."""
    if kernel == "auto":
        kernel = os.environ.get(OVERRIDE, "auto")  # type: ignore[assignment]
    if kernel not in ("auto", *NAMES):
        raise ValueError(f"{OVERRIDE}={kernel!r}: expected one of {', '.join(NAMES)}")
    if kernel == "auto":
        return "varlen" if varlen_available(device) else "per_sequence"
    if kernel == "varlen" and not varlen_available(device):
        raise ValueError(
            f"the varlen attention kernel needs a CUDA GPU with FlashAttention 2 (compute "
            f"capability 8.0+) and torch >= 2.10; the model is on {device}"
        )
    return kernel


def has_sliding_window(config: object) -> bool:
    """Whether a model config gives some layer a sliding window: by `layer_types` (Gemma 2,
    Qwen2 and Qwen3, where `use_sliding_window: false` makes every layer full), else by a
    `sliding_window` for every layer (Mistral-7B-v0.1, Phi-3, Mixtral, Starcoder2)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return set(layer_types) != {"full_attention"}
    if getattr(config, "use_sliding_window", True) is False:
        return False
    return bool(getattr(config, "sliding_window", None))


@contextmanager
def packed_attention(model: torch.nn.Module, kernel: Kernel = "auto") -> Iterator[None]:
    """Run `model`'s forward passes in this block with a packed-row kernel (`choose_kernel`) if
    it is on SDPA or eager attention, and restore its implementation after. `model` is a
    transformers model or a wrapper of one in `.module` (a DeepSpeed engine)."""
    model = getattr(model, "module", model)
    impl = model.config._attn_implementation
    if impl not in ("sdpa", "eager") or has_sliding_window(model.config):
        yield  # sliding-window layers need their masks: left to transformers
        return
    device = next(model.parameters()).device
    chosen = choose_kernel(device, kernel)
    if chosen == "varlen":
        _varlen_gqa_flag()  # here, not inside a compiled layer
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hook = decoder.register_forward_pre_hook(
        functools.partial(_row_arguments, chosen), with_kwargs=True
    )
    model.set_attn_implementation(NAMES[chosen])
    try:
        yield
    finally:
        hook.remove()
        model.set_attn_implementation(impl)


def _row_arguments(
    kernel: str, _decoder: torch.nn.Module, args: tuple, kwargs: dict
) -> tuple[tuple, dict] | None:
    """The decoder's forward pre-hook: a packed row's bounds found once, before the layers, and
    added to the arguments every layer hands its attention (`row_arguments`)."""
    position_ids = kwargs.get("position_ids")
    if position_ids is None or kwargs.get("attention_mask") is not None:
        return None
    if position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    return args, {**kwargs, **row_arguments(kernel, position_ids)}


def row_arguments(kernel: str, position_ids: torch.Tensor) -> dict[str, object]:
    """What `kernel` reads of a packed row (1, T) given as attention arguments: the cumulative
    starts and the longest sequence (varlen: transformers' FlashAttention names), the block
    mask (flex), nothing (per_sequence, which finds its host-side lengths itself)."""
    if kernel == "varlen":
        bounds = row_bounds(position_ids)
        return {
            "cu_seq_lens_q": bounds.cumulative, "cu_seq_lens_k": bounds.cumulative,
            "max_length_q": bounds.longest, "max_length_k": bounds.longest,
        }  # fmt: skip
    if kernel == "flex":
        return {"packed_block_mask": _flex_masks.get(position_ids)}
    return {}
