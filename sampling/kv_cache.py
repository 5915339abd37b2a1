"""A DynamicCache whose full-attention layers write into growing buffers and can drop rows.

transformers' `DynamicLayer` appends a decode step with `torch.cat`, which copies the whole cache
of every layer on every token; on a small CPU model that copy cost more than the matmuls. Here
each layer keeps a buffer with spare columns and a step writes one column in place; `keys` and
`values` stay views of the filled prefix, so attention and the mask sizes see exactly what a
`DynamicLayer` would hold. Dropping finished rows (`batch_select_indices`) copies the filled
prefix once into a smaller buffer.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

# Spare columns added when a buffer fills up: one copy per this many decode steps.
GROW_BY = 64


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer backed by a buffer of shape (B, H, capacity, D)."""

    def __init__(self, grow_by: int = GROW_BY, **kwargs):
        super().__init__(**kwargs)
        self.grow_by = grow_by
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.dtype, self.device = key_states.dtype, key_states.device
            self.is_initialized = True
        end = self.length + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2]:
            self._reallocate(key_states, value_states, end + self.grow_by)
        assert self._k is not None and self._v is not None
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int):
        """Move the filled prefix into a buffer with `capacity` columns."""
        b, h, _, d = key_states.shape
        k = key_states.new_empty(b, h, capacity, d)
        v = value_states.new_empty(b, value_states.shape[1], capacity, value_states.shape[-1])
        if self._k is not None and self._v is not None and self.length:
            k[:, :, : self.length] = self._k[:, :, : self.length]
            v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = k, v

    def _expose(self) -> None:
        assert self._k is not None and self._v is not None
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only rows `indices`; the spare columns keep their capacity."""
        if self._k is None or self._v is None:
            return
        self._k = self._k.index_select(0, indices)
        self._v = self._v.index_select(0, indices)
        self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._k is None or self._v is None:
            return
        self._k = self._k.repeat_interleave(repeats, dim=0)
        self._v = self._v.repeat_interleave(repeats, dim=0)
        self._expose()

    def reset(self) -> None:
        self._k = self._v = None
        self.length = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self._k is not None:
            self.length = max(0, self.length + tokens_to_remove)
            self._expose()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def growing_cache(config: PretrainedConfig) -> DynamicCache:
    """A DynamicCache for `config` with its plain full-attention layers made growable.

    Sliding-window and other special layers are left as transformers builds them.
    """
    cache = DynamicCache(config=config)
    cache.layers = [
        GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache
