"""Attention for decode steps on CPU: one query token against the cache in two matmuls.

torch's SDPA kernel on CPU handles a single query row slowly with 2 threads: at batch 128 and a
cache of 150 positions a layer's call took 1.0 ms against 0.54 ms for the two matmuls, and whole
decode steps of the tiny world's model ran 1.2-1.4x faster with the same tokens. Prompts (many
query rows) still go to SDPA. `matmul_decoding(model)` switches an SDPA model to this for the
length of a decode and back; models on other attention implementations are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_matmul_decode"


def matmul_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, Q, D)
    key: torch.Tensor,  # (B, KV, L, D)
    value: torch.Tensor,  # (B, KV, L, D)
    attention_mask: torch.Tensor | None,  # bool (B, 1, Q, L), True where attended, or additive
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns (B, Q, H, D) like SDPA's."""
    batch, heads, q_len, dim = query.shape
    if q_len != 1 or dropout > 0 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    kv_heads = key.shape[1]
    q = query.view(batch, kv_heads, heads // kv_heads, dim)  # query heads grouped by KV head
    scores = torch.matmul(q, key.transpose(-1, -2)) * (scaling or dim**-0.5)  # (B, KV, G, L)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    elif attention_mask is not None:
        scores = scores + attention_mask
    weights = scores.softmax(dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(weights, value)  # (B, KV, G, D)
    return out.view(batch, 1, heads, dim), None


AttentionInterface.register(NAME, matmul_decode_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA gets, for the prompt pass


@contextmanager
def matmul_decoding(model: PreTrainedModel) -> Iterator[None]:
    """Decode with `matmul_decode_attention` if the model runs on SDPA, and restore it after."""
    if model.config._attn_implementation != "sdpa":
        yield
        return
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")
