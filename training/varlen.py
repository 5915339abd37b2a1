"""Attention over packed sequences, one sequence at a time: training without padding on CPU.

A packed batch is one row of sequences laid end to end, position ids restarting at each
(training/loop.py `pack`, rl/rollouts.py `pack_policy_batch`). Given such a row under SDPA,
transformers builds a causal mask the size of the whole row squared, block-diagonal, and the
kernel attends over all of it. Here each sequence's queries attend to its own keys only: the row's
query, key and value are split at the restarts, each piece goes through SDPA with the causal
mask built in, and the outputs are joined again. The loss and gradients are those of each
sequence run alone (tests/training/test_packing.py); the attention costs the sum of the squared
lengths, and no token is padding.

`packed_attention(model)` switches an SDPA or eager model to this for the forward passes in its
block and back after (the backward pass needs nothing of it). Models on other implementations
(flash-attention reads the restarts itself) and models with sliding-window layers are left
alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_per_sequence"


def sequence_lengths(position_ids: torch.Tensor) -> list[int]:
    """Lengths of the sequences of a packed row, from its position ids (1, T) that restart at 0."""
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("a packed row's position ids start at 0")
    ends = [*starts[1:], position_ids.shape[1]]
    return [end - start for start, end in zip(starts, ends, strict=True)]


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
    one_packed_row = (
        attention_mask is None
        and position_ids is not None
        and query.shape[0] == 1
        and query.shape[2] == key.shape[2] == position_ids.shape[-1]
    )
    if not one_packed_row:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    assert position_ids is not None
    lengths = sequence_lengths(position_ids.view(1, -1))
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


def per_sequence_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs):
    """No mask for a packed row (the attention splits it); SDPA's mask for anything padded."""
    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


AttentionInterface.register(NAME, per_sequence_attention)
AttentionMaskInterface.register(NAME, per_sequence_mask)


@contextmanager
def packed_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run `model`'s forward passes in this block with `per_sequence_attention` if it is on SDPA
    or eager attention, and restore its implementation after. `model` is a transformers model
    or a wrapper of one in `.module` (a DeepSpeed engine)."""
    model = getattr(model, "module", model)
    impl = model.config._attn_implementation
    layer_types = getattr(model.config, "layer_types", None) or ["full_attention"]
    if impl not in ("sdpa", "eager") or set(layer_types) != {"full_attention"}:
        yield  # sliding-window layers need their masks: left to transformers
        return
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(impl)
